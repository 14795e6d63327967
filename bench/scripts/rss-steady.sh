#!/usr/bin/env bash
# Memory over time (issue #8): does each node's RSS stay flat under a steady YCSB workload?
#
#   bench/scripts/rss-steady.sh [--minutes 30] [--target 1500] [--records 100000]
#                               [--workload a] [--shards 8] [--threads 32]
#                               [--sample-s 30] [--base-port 26900] [--bin-dir DIR] [--out FILE]
#
# Starts a fresh 3-node loopback cluster (--initial-shards N, 100 ms heartbeats), bulk-loads
# RECORDS YCSB records (`meridian-ycsb bulk-load`, 10 x 100 B fields), then runs the workload
# for MINUTES at a fixed TARGET ops/s (`meridian-ycsb run --target`), sampling every node's
# VmRSS from /proc every SAMPLE seconds, with what RocksDB says it holds (block cache,
# memtables, table readers: the nodes' meridian_storage_memory_bytes), what the allocator
# says (meridian_heap_bytes: held by the program, resident in its mappings) and the anonymous
# part of RSS (RssAnon: heap, stacks, RocksDB's caches; the rest is mapped files). Writes the
# samples as CSV (elapsed_s, then per node rss_kib, block_cache_kib, memtables_kib,
# table_readers_kib, heap_allocated_kib, heap_resident_kib, rss_anon_kib) to --out (default:
# print only) and prints, per node, RSS at the first sample after the
# first minute, the minimum, the maximum and the last, and the largest deviation from that
# first sample in percent; then the YCSB run's own summary (throughput and p99s) so a run that
# fell behind its target is visible.
set -euo pipefail
source "$(dirname "$0")/../../scripts/common.sh"
source "$(dirname "$0")/lib/loopback-cluster.sh"

MINUTES=30
TARGET=1500
RECORDS=100000
WORKLOAD=a
SHARDS=8
THREADS=32
SAMPLE_S=30
BASE_PORT=26900
BIN_DIR=""
OUT=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --minutes) MINUTES="$2"; shift 2 ;;
    --target) TARGET="$2"; shift 2 ;;
    --records) RECORDS="$2"; shift 2 ;;
    --workload) WORKLOAD="$2"; shift 2 ;;
    --shards) SHARDS="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --sample-s) SAMPLE_S="$2"; shift 2 ;;
    --base-port) BASE_PORT="$2"; shift 2 ;;
    --bin-dir) BIN_DIR="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
OUT_ABS=""
[[ -n "$OUT" ]] && OUT_ABS="$(realpath -m "$OUT")"

METRICS_BASE=$((BASE_PORT + 200))
cd "$ROOT"
ycsb_workdir rss-steady
BIN="$WORK/meridian"
start_loopback_cluster "$BIN" "$BASE_PORT" "$WORK" "$SHARDS" \
  --heartbeat-interval-ms 100 --election-timeout-min-ms 600
wait_every_shard_led "$BIN" "$ENDPOINTS" 120 || { echo "cluster did not elect" >&2; exit 1; }
say "bulk-loading $RECORDS records"
"$WORK/meridian-ycsb" bulk-load -p "recordcount=$RECORDS" --endpoints "$ENDPOINTS" \
  --status-interval 30 >/dev/null

operations=$(( TARGET * MINUTES * 60 ))
say "running workload $WORKLOAD at $TARGET ops/s for $MINUTES min ($operations operations)"
"$WORK/meridian-ycsb" run -P "bench/workloads/workload$WORKLOAD" -p "recordcount=$RECORDS" \
  -p "operationcount=$operations" --threads "$THREADS" --target "$TARGET" --db meridian \
  --endpoints "$ENDPOINTS" --status-interval 60 >"$WORK/run.txt" 2>"$WORK/run.err" &
RUN_PID=$!

# $1 = pid, $2 = field of /proc/PID/status (VmRSS, RssAnon: heap and other private memory).
status_kib() { awk -v f="$2:" '$1 == f {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
# Column name and the node metric it samples (a metric a node does not export reads 0).
COLUMNS=(block_cache memtables table_readers heap_allocated heap_resident)
METRICS=('meridian_storage_memory_bytes{kind="block_cache"}'
  'meridian_storage_memory_bytes{kind="memtables"}'
  'meridian_storage_memory_bytes{kind="table_readers"}'
  'meridian_heap_bytes{kind="allocated"}'
  'meridian_heap_bytes{kind="resident"}')
PER_NODE=$(( ${#COLUMNS[@]} + 2 ))
csv="elapsed_s"
for id in 1 2 3; do
  csv+=",node${id}_rss_kib"
  for column in "${COLUMNS[@]}"; do csv+=",node${id}_${column}_kib"; done
  csv+=",node${id}_rss_anon_kib"
done
# The CSV grows sample by sample, so a run that dies keeps what it measured.
[[ -n "$OUT_ABS" ]] && printf '%s\n' "$csv" >"$OUT_ABS"
started=$(date +%s)
while kill -0 "$RUN_PID" 2>/dev/null; do
  row="$(( $(date +%s) - started ))"
  for id in 1 2 3; do
    row+=",$(status_kib "${PIDS[$((id - 1))]}" VmRSS)"
    for metric in "${METRICS[@]}"; do
      # A node slower than metric_at's 5 s reads as 0 for this sample instead of ending the run.
      bytes="$(metric_at "$id" "$metric")" || bytes=""
      row+=",$(awk -v b="${bytes:-0}" 'BEGIN {printf "%.0f", b / 1024}')"
    done
    row+=",$(status_kib "${PIDS[$((id - 1))]}" RssAnon)"
  done
  csv+=$'\n'"$row"
  [[ -n "$OUT_ABS" ]] && printf '%s\n' "$row" >>"$OUT_ABS"
  # Sleep in short steps so the end of the run is noticed promptly.
  for _ in $(seq 1 "$SAMPLE_S"); do kill -0 "$RUN_PID" 2>/dev/null || break; sleep 1; done
done
wait "$RUN_PID" || { echo "the YCSB run failed:" >&2; tail -20 "$WORK/run.err" >&2; exit 1; }

echo "# RSS of each node over a ${MINUTES}-minute YCSB $WORKLOAD run at $TARGET ops/s ($SHARDS shards, $RECORDS records), $(date -u +%FT%TZ)"
for node in 1 2 3; do
  col=$(( 2 + (node - 1) * PER_NODE ))
  # A sample of 0 means the node's process was gone: reported, not taken as its minimum.
  awk -F, -v col="$col" -v node="$node" 'NR > 1 && $1 >= 60 {
      v = $col
      if (v == 0) { gone++; next }
      if (!base) base = v; if (!min || v < min) min = v; if (v > max) max = v; last = v
    }
    END {
      if (!base) { printf "node %d: no sample after the first minute\n", node; exit }
      up = 100 * (max - base) / base; down = 100 * (base - min) / base
      printf "node %d: RSS at 1 min %.0f MiB, min %.0f, max %.0f, last %.0f MiB; largest deviation +%.1f%% / -%.1f%%%s\n",
        node, base / 1024, min / 1024, max / 1024, last / 1024, up, down,
        gone ? sprintf("; GONE in %d samples", gone) : ""
    }' <<<"$csv"
  # Every other column at the first sample after a minute and at the last.
  awk -F, -v col="$col" -v node="$node" -v names="${COLUMNS[*]} rss_anon" 'NR > 1 && $1 >= 60 {
      n = split(names, name, " ")
      for (i = 1; i <= n; i++) { if (!seen) first[i] = $(col + i); last[i] = $(col + i) }
      seen = 1
    }
    END {
      if (!seen) exit
      line = sprintf("node %d (MiB, first -> last):", node)
      for (i = 1; i <= n; i++) line = line sprintf(" %s %.0f -> %.0f%s", name[i], first[i] / 1024, last[i] / 1024, i < n ? "," : "")
      print line
    }' <<<"$csv"
done
grep -E '^\[OVERALL\]|^\[(READ|UPDATE)\], (Operations|99thPercentileLatency)' "$WORK/run.txt"

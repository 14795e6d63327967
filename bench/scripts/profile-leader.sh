#!/usr/bin/env bash
# Where does a leader's CPU go under YCSB A? A CPU profile of the node leading the most shards
# of a fresh 3-node loopback cluster while workload A runs, as perf's report and a flame graph.
#
#   bench/scripts/profile-leader.sh [--shards 8] [--records 30000] [--operations 60000]
#                                   [--threads 64] [--base-port 26700] [--bin-dir DIR]
#                                   [--out DIR]
#
# Starts the cluster (100 ms heartbeats, 600 ms minimum election timeout), waits until every
# shard has a leader, loads the records, then runs workload A with `perf record -F 199
# --call-graph dwarf` attached to the node that leads the most shards (the
# meridian_raft_groups_led metric) for the run. Writes to --out (default: a fresh directory
# under /var/tmp): perf-report.txt (the top of `perf report --no-children`, by symbol),
# folded.txt (stacks folded by inferno-collapse-perf), flame.svg (inferno-flamegraph, frames
# under 0.1% left out) and ycsb-a.txt (the run's YCSB report). Needs perf (Debian's linux-perf) and inferno
# (`cargo install inferno`); installs neither. --bin-dir runs the `meridian` and
# `meridian-ycsb` found there instead of building them.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
# shellcheck source=../../scripts/common.sh
source scripts/common.sh
# shellcheck source=lib/loopback-cluster.sh
source bench/scripts/lib/loopback-cluster.sh

SHARDS=8 RECORDS=30000 OPERATIONS=60000 THREADS=64 BASE=26700 BIN_DIR="" OUT=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --shards) SHARDS=$2; shift 2 ;;
    --records) RECORDS=$2; shift 2 ;;
    --operations) OPERATIONS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --base-port) BASE=$2; shift 2 ;;
    --bin-dir) BIN_DIR=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
for tool in perf inferno-collapse-perf inferno-flamegraph; do
  command -v "$tool" >/dev/null || { echo "error: $tool is required (see the header)" >&2; exit 1; }
done

ycsb_workdir profile
OUT=${OUT:-$(mktemp -d /var/tmp/meridian-profile-out.XXXXXX)}
mkdir -p "$OUT"
# A binary from before the metrics endpoint (older than 2026-12-02) cannot say which node leads
# most: node 1 is profiled then.
if "$WORK/meridian" start --help | grep -q -- --metrics-addr; then
  METRICS_BASE=$((BASE + 300))
else
  unset METRICS_BASE
fi
start_loopback_cluster "$WORK/meridian" "$BASE" "$WORK/data" "$SHARDS" \
  --heartbeat-interval-ms 100 --election-timeout-min-ms 600
wait_every_shard_led "$WORK/meridian" "$ENDPOINTS" 120

say "loading $RECORDS records with $THREADS threads"
"$WORK/meridian-ycsb" load -P bench/workloads/workloada --db meridian --endpoints "$ENDPOINTS" \
  -p recordcount="$RECORDS" --threads "$THREADS" > "$OUT/ycsb-load.txt"

best=1 most="?"
for id in 1 2 3; do
  [[ -n "${METRICS_BASE:-}" ]] || break
  led=$(metric_at "$id" meridian_raft_groups_led)
  say "node $id leads ${led:-?} groups"
  if [[ -n "$led" ]] && { [[ "$most" == "?" ]] || awk -v a="$led" -v b="$most" 'BEGIN {exit !(a > b)}'; }; then
    best=$id most=$led
  fi
done
pid=${PIDS[$((best - 1))]}
say "profiling node $best (pid $pid, leads $most groups) during workload A, $OPERATIONS operations"
perf record -F 199 --call-graph dwarf,16384 -p "$pid" -o "$OUT/perf.data" -- sleep 3600 \
  > "$OUT/perf-record.log" 2>&1 &
perf_pid=$!
sleep 1
"$WORK/meridian-ycsb" run -P bench/workloads/workloada --db meridian --endpoints "$ENDPOINTS" \
  -p recordcount="$RECORDS" -p operationcount="$OPERATIONS" --threads "$THREADS" \
  > "$OUT/ycsb-a.txt" || { kill -INT "$perf_pid"; echo "error: workload A failed" >&2; exit 1; }
kill -INT "$perf_pid"
wait "$perf_pid" || true
stop_cluster

say "folding stacks (this takes a few minutes)"
perf script -i "$OUT/perf.data" 2>/dev/null | inferno-collapse-perf > "$OUT/folded.txt"
# Frames under 0.1% of the samples are left out, which keeps the SVG small.
inferno-flamegraph --minwidth 0.1 \
  --title "meridian node $best (leads $most of $((SHARDS + 1)) groups), YCSB A, $THREADS threads" \
  < "$OUT/folded.txt" > "$OUT/flame.svg"
# Self time by binary, then by symbol (sed reads all its input: no SIGPIPE under pipefail).
{
  perf report -i "$OUT/perf.data" --no-children --sort dso --stdio -g none 2>/dev/null
  perf report -i "$OUT/perf.data" --no-children --sort dso,symbol --stdio -g none 2>/dev/null
} | grep -v '^$' | cut -c1-160 | sed -n '1,140p' > "$OUT/perf-report.txt"
rm -f "$OUT/perf.data"
say "wrote $OUT/{perf-report.txt,folded.txt,flame.svg,ycsb-a.txt}"

#!/usr/bin/env bash
# Does a node setting pay off under load? YCSB load and workloads against fresh 3-node loopback
# clusters that differ only in their node flags, side by side in one run, the variants
# alternating round by round so a drift of the machine hits each alike.
#
#   bench/scripts/node-args-ycsb.sh --variant "off=--proposals-in-flight 0" \
#                                   --variant "2=--proposals-in-flight 2" \
#                                   [--rounds 2] [--shards 8] [--records 30000]
#                                   [--operations 30000] [--threads 64] [--workloads "a"]
#                                   [--base-port 26700] [--bin-dir DIR]
#
# Per round and variant: start 3 `meridian start` processes (--initial-shards N, 100 ms
# heartbeats, 600 ms minimum election timeout, then the variant's flags), wait until every
# shard has a leader, `meridian-ycsb load` the records, run each workload, stop the cluster.
# Prints, per variant and round, load inserts/s with the insert p99, each workload's ops/s
# with its update p99 (ms), and the writes per Raft entry over the run (the nodes'
# meridian_proposal_* metrics: proposal coalescing); then each variant's mean throughput
# against the first variant's.
# --bin-dir runs the `meridian` and `meridian-ycsb` found there instead of building them.
set -euo pipefail
source "$(dirname "$0")/../../scripts/common.sh"
source "$(dirname "$0")/lib/loopback-cluster.sh"

VARIANTS=()
ROUNDS=2
SHARDS=8
RECORDS=30000
OPERATIONS=30000
THREADS=64
WORKLOADS="a"
BASE_PORT=26700
BIN_DIR=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --variant) VARIANTS+=("$2"); shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --shards) SHARDS="$2"; shift 2 ;;
    --records) RECORDS="$2"; shift 2 ;;
    --operations) OPERATIONS="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --workloads) WORKLOADS="$2"; shift 2 ;;
    --base-port) BASE_PORT="$2"; shift 2 ;;
    --bin-dir) BIN_DIR="$2"; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
if [[ ${#VARIANTS[@]} -lt 1 ]]; then
  echo "give at least one --variant NAME=FLAGS" >&2
  exit 2
fi
for v in "${VARIANTS[@]}"; do
  [[ "$v" == *=* ]] || { echo "--variant $v: expected NAME=FLAGS" >&2; exit 2; }
done

METRICS_BASE=$((BASE_PORT + 200))
cd "$ROOT"
ycsb_workdir node-args-ycsb

# figure FILE METRIC FIELD: a value from a YCSB report ("" if absent).
figure() {
  awk -F', ' -v m="[$2]" -v f="$3" '$1 == m && $2 == f {print $3}' "$1"
}

declare -A SUM=()
echo "| round | variant | load inserts/s | insert p99 ms |$(for w in $WORKLOADS; do printf ' %s ops/s | %s update p99 ms |' "$w" "$w"; done) writes per entry |"
echo "|---:|---|---:|---:|$(for _ in $WORKLOADS; do printf -- '---:|---:|'; done)---:|"
for round in $(seq 1 "$ROUNDS"); do
  for v in "${VARIANTS[@]}"; do
    name="${v%%=*}" flags="${v#*=}"
    dir="$WORK/r$round-$name"
    # shellcheck disable=SC2086 # flags is a list of flags
    start_loopback_cluster "$WORK/meridian" "$BASE_PORT" "$dir" "$SHARDS" \
      --heartbeat-interval-ms 100 --election-timeout-min-ms 600 $flags
    wait_every_shard_led "$WORK/meridian" "$ENDPOINTS" 300 \
      || { echo "variant $name did not get ready" >&2; exit 1; }
    say "round $round, $name: loading $RECORDS records with $THREADS threads"
    "$WORK/meridian-ycsb" load -P bench/workloads/workloada --db meridian --endpoints "$ENDPOINTS" \
      --threads "$THREADS" -p recordcount="$RECORDS" >"$dir-load.txt" 2>"$dir-load.err"
    load=$(figure "$dir-load.txt" OVERALL "Throughput(ops/sec)")
    load_p99=$(figure "$dir-load.txt" INSERT "99thPercentileLatency(us)")
    SUM[$name-load]=$(awk -v a="${SUM[$name-load]:-0}" -v b="$load" 'BEGIN {print a + b}')
    row=$(printf '| %s | %s | %.0f | %.1f |' "$round" "$name" "$load" "$(awk -v u="$load_p99" 'BEGIN {print u / 1000}')")
    for w in $WORKLOADS; do
      say "round $round, $name: workload $w, $OPERATIONS operations"
      "$WORK/meridian-ycsb" run -P "bench/workloads/workload$w" --db meridian \
        --endpoints "$ENDPOINTS" --threads "$THREADS" -p recordcount="$RECORDS" \
        -p operationcount="$OPERATIONS" >"$dir-$w.txt" 2>"$dir-$w.err"
      ops=$(figure "$dir-$w.txt" OVERALL "Throughput(ops/sec)")
      p99=$(figure "$dir-$w.txt" UPDATE "99thPercentileLatency(us)")
      SUM[$name-$w]=$(awk -v a="${SUM[$name-$w]:-0}" -v b="$ops" 'BEGIN {print a + b}')
      row+=$(printf ' %.0f | %s |' "$ops" "$(awk -v u="${p99:-0}" 'BEGIN {printf "%.1f", u / 1000}')")
    done
    proposals=$(metric_sum meridian_proposal_proposals_total)
    entries=$(metric_sum meridian_proposal_entries_total)
    row+=$(awk -v p="$proposals" -v e="$entries" 'BEGIN {if (e > 0) printf " %.2f |", p / e; else printf " - |"}')
    echo "$row"
    stop_cluster
  done
done

first="${VARIANTS[0]%%=*}"
echo
echo "| variant | load vs $first |$(for w in $WORKLOADS; do printf ' %s vs %s |' "$w" "$first"; done)"
echo "|---|---:|$(for _ in $WORKLOADS; do printf -- '---:|'; done)"
for v in "${VARIANTS[@]}"; do
  name="${v%%=*}"
  row="| $name | $(awk -v a="${SUM[$name-load]}" -v b="${SUM[$first-load]}" 'BEGIN {printf "%.2f", a / b}') |"
  for w in $WORKLOADS; do
    row+=" $(awk -v a="${SUM[$name-$w]}" -v b="${SUM[$first-$w]}" 'BEGIN {printf "%.2f", a / b}') |"
  done
  echo "$row"
done

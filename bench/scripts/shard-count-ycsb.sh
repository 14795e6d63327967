#!/usr/bin/env bash
# Does a node pay for holding many shards under load? YCSB A and C against fresh 3-node
# loopback clusters with different shard counts, side by side in one run (issue #9's target:
# 256 shards reach >= 90% of the 8-shard throughput).
#
#   bench/scripts/shard-count-ycsb.sh [--shards "8 256"] [--records 20000] [--operations 30000]
#                                     [--threads 32] [--base-port 26700]
#                                     [--node-args "--quiesce false"] [--bin-dir DIR]
#                                     [--heartbeat-ms 100] [--election-min-ms 600]
#
# Per shard count: start 3 `meridian start` processes (--initial-shards N, loopback Raft
# timings), wait until every shard has a leader, `meridian-ycsb load` the records, run workload
# A then C, stop the cluster. Prints throughput per workload and the ratio to the first count.
# --bin-dir runs the `meridian` and `meridian-ycsb` found there instead of building them (to
# compare two builds side by side). The Raft timings default to loopback ones (100 ms
# heartbeats, 600 ms minimum election timeout); 400 / 1500 are the node's own defaults.
set -euo pipefail
source "$(dirname "$0")/../../scripts/common.sh"
source "$(dirname "$0")/lib/loopback-cluster.sh"

SHARDS="8 256"
RECORDS=20000
OPERATIONS=30000
THREADS=32
BASE_PORT=26700
NODE_ARGS=""
BIN_DIR=""
HEARTBEAT_MS=100
ELECTION_MIN_MS=600
while [[ $# -gt 0 ]]; do
  case "$1" in
    --shards) SHARDS="$2"; shift 2 ;;
    --records) RECORDS="$2"; shift 2 ;;
    --operations) OPERATIONS="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --base-port) BASE_PORT="$2"; shift 2 ;;
    --node-args) NODE_ARGS="$2"; shift 2 ;;
    --bin-dir) BIN_DIR="$2"; shift 2 ;;
    --heartbeat-ms) HEARTBEAT_MS="$2"; shift 2 ;;
    --election-min-ms) ELECTION_MIN_MS="$2"; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

cd "$ROOT"
ycsb_workdir shard-ycsb

declare -A OPS=()
for n in $SHARDS; do
  # shellcheck disable=SC2086 # NODE_ARGS is a list of flags
  start_loopback_cluster "$WORK/meridian" "$BASE_PORT" "$WORK/n$n" "$n" \
    --heartbeat-interval-ms "$HEARTBEAT_MS" --election-timeout-min-ms "$ELECTION_MIN_MS" $NODE_ARGS
  endpoints=$ENDPOINTS
  say "$n shards: waiting for every shard to elect a leader"
  wait_every_shard_led "$WORK/meridian" "$endpoints" 300 \
    || { echo "cluster with $n shards did not get ready" >&2; exit 1; }
  say "$n shards: loading $RECORDS records"
  "$WORK/meridian-ycsb" load -P bench/workloads/workloada --db meridian --endpoints "$endpoints" \
    --threads "$THREADS" -p recordcount="$RECORDS" >"$WORK/n$n-load.txt" 2>"$WORK/n$n-load.err"
  for w in a c; do
    say "$n shards: workload $w, $OPERATIONS operations, $THREADS threads"
    "$WORK/meridian-ycsb" run -P "bench/workloads/workload$w" --db meridian --endpoints "$endpoints" \
      --threads "$THREADS" -p recordcount="$RECORDS" -p operationcount="$OPERATIONS" \
      >"$WORK/n$n-$w.txt" 2>"$WORK/n$n-$w.err"
    OPS[$n-$w]=$(awk -F', ' '/\[OVERALL\], Throughput/ {print $3}' "$WORK/n$n-$w.txt")
  done
  stop_cluster
done

first="${SHARDS%% *}"
echo "| shards | YCSB A ops/s | vs $first shards | YCSB C ops/s | vs $first shards |"
echo "|---:|---:|---:|---:|---:|"
for n in $SHARDS; do
  ra=$(awk -v a="${OPS[$n-a]}" -v b="${OPS[$first-a]}" 'BEGIN {printf "%.2f", a / b}')
  rc=$(awk -v a="${OPS[$n-c]}" -v b="${OPS[$first-c]}" 'BEGIN {printf "%.2f", a / b}')
  printf '| %s | %.0f | %s | %.0f | %s |\n' "$n" "${OPS[$n-a]}" "$ra" "${OPS[$n-c]}" "$rc"
done

#!/usr/bin/env bash
# A liveness soak: the closed economy (2PC transfers across shards) many times, each on a fresh
# 3-node loopback cluster, to catch a rare stall (a run that does not finish) as well as to
# measure. A stall once hid in 1 of 9 runs (bench/results/2026-12-05/replication-stall/).
#
#   bench/scripts/economy-repeat.sh [--runs 12] [--shards 8] [--operations 6000] [--threads 64]
#                                   [--spread shards|oneshard] [--early-locks off|on]
#                                   [--timeout-s 120]
#                                   [--base-port 26900] [--bin-dir DIR]
#                                   [--keep-logs DIR] [-- extra node flags...]
#
# Per run: start the cluster (--initial-shards N, 100 ms heartbeats, then the extra flags), wait
# until every shard has a leader, run `meridian-ycsb economy -P bench/workloads/closedeconomy
# -p accountspread=SPREAD -p operationcount=OPS` under `timeout TIMEOUT`, stop the cluster.
# SPREAD is `shards` (two-shard transfers, parallel commits; the default) or `oneshard` (every
# account in one shard: one-shard commits, the headline economy of run-comparison.sh).
# --early-locks on passes `-p earlylocks=on` (transfers read with early locks, see
# docs/early-locking.md); the line then also gives the keys granted after a wait, the mean
# wait, the keys read unlocked, the commits refused after a wound and the locking reads
# restarted, from meridian_early_lock_* on the nodes.
# Prints one line per run (transactions/s, transfer retries, failed transfers and p99, the
# writes the leaders proposed to Raft, meridian_proposal_proposals_total over the 3 nodes from
# their metrics on BASE+50+i, validation, or STALLED when the run hit its timeout), then how
# many runs stalled or failed. With --keep-logs, the node logs of every
# stalled or failed run are copied there. Exits non-zero if any run stalled or failed.
set -euo pipefail
source "$(dirname "$0")/../../scripts/common.sh"
source "$(dirname "$0")/lib/loopback-cluster.sh"

RUNS=12
SHARDS=8
OPERATIONS=6000
THREADS=64
SPREAD=shards
EARLY_LOCKS=off
TIMEOUT_S=120
BASE_PORT=26900
BIN_DIR=""
KEEP=""
NODE_FLAGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --runs) RUNS="$2"; shift 2 ;;
    --shards) SHARDS="$2"; shift 2 ;;
    --operations) OPERATIONS="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --spread) SPREAD="$2"; shift 2 ;;
    --early-locks) EARLY_LOCKS="$2"; shift 2 ;;
    --timeout-s) TIMEOUT_S="$2"; shift 2 ;;
    --base-port) BASE_PORT="$2"; shift 2 ;;
    --bin-dir) BIN_DIR="$2"; shift 2 ;;
    --keep-logs) KEEP="$(realpath -m "$2")"; shift 2 ;;
    --) shift; NODE_FLAGS=("$@"); break ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

case "$EARLY_LOCKS" in
  on|off) ;;
  *) echo "--early-locks is on or off, not '$EARLY_LOCKS'" >&2; exit 2 ;;
esac
case "$SPREAD" in
  shards|oneshard) ;;
  *) echo "--spread is shards or oneshard, not '$SPREAD'" >&2; exit 2 ;;
esac
cd "$ROOT"
ycsb_workdir economy-repeat
METRICS_BASE=$((BASE_PORT + 50))
# field SECTION NAME: one figure of the run's economy.txt.
field() { awk -F', ' -v s="$1" -v f="$2" '$1 == s && $2 == f {print $3}' "$dir/economy.txt"; }
bad=0
echo "# closed economy x $RUNS: accountspread=$SPREAD, earlylocks=$EARLY_LOCKS, $SHARDS shards, $OPERATIONS transactions, $THREADS threads, node flags: ${NODE_FLAGS[*]:-(none)}"
for run in $(seq 1 "$RUNS"); do
  dir="$WORK/run$run"
  start_loopback_cluster "$WORK/meridian" "$BASE_PORT" "$dir" "$SHARDS" \
    --heartbeat-interval-ms 100 --election-timeout-min-ms 600 "${NODE_FLAGS[@]}"
  wait_every_shard_led "$WORK/meridian" "$ENDPOINTS" 120 || { echo "run $run: cluster did not elect" >&2; exit 1; }
  status=0
  timeout "$TIMEOUT_S" "$WORK/meridian-ycsb" economy -P bench/workloads/closedeconomy \
    -p "accountspread=$SPREAD" -p "earlylocks=$EARLY_LOCKS" -p "operationcount=$OPERATIONS" --threads "$THREADS" \
    --db meridian --endpoints "$ENDPOINTS" >"$dir/economy.txt" 2>"$dir/economy.err" || status=$?
  tps="$(awk -F', ' '$1 == "[OVERALL]" && $2 == "Throughput(ops/sec)" {printf "%.0f", $3}' "$dir/economy.txt")"
  proposed="$(metric_sum meridian_proposal_proposals_total)"
  retries="$(field '[TRANSFER]' Retries)"
  failed="$(field '[TRANSFER-FAILED]' Operations)"
  p99="$(field '[TRANSFER]' '99thPercentileLatency(us)')"
  validation="$(awk -F', ' '$1 == "[VALIDATION]" && $2 == "Status" {print $3}' "$dir/economy.txt")"
  if [[ $status == 124 ]]; then
    verdict="STALLED (no end within ${TIMEOUT_S} s)"
  elif [[ $status != 0 ]]; then
    verdict="FAILED (exit $status: $(tail -1 "$dir/economy.err"))"
  else
    verdict="${validation:-no validation line}"
  fi
  locks=""
  if [[ $EARLY_LOCKS == on ]]; then
    waited="$(metric_sum 'meridian_early_lock_keys_total{result="waited"}')"
    not_held="$(metric_sum 'meridian_early_lock_keys_total{result="not_held"}')"
    waits="$(metric_sum meridian_early_lock_waits_total)"
    wait_s="$(metric_sum meridian_early_lock_wait_seconds_total)"
    mean_ms="$(awk -v s="$wait_s" -v n="$waits" 'BEGIN {if (n > 0) printf "%.1f", s * 1000 / n; else print "-"}')"
    wounded="$(metric_sum meridian_early_lock_wounded_commits_total)"
    refreshes="$(metric_sum meridian_early_lock_refreshes_total)"
    locks="; early locks: $waited keys after a wait (mean wait $mean_ms ms), $not_held not held, $wounded commits refused after a wound, $refreshes refreshes"
  fi
  echo "run $run: ${tps:--} transactions/s, transfers: ${retries:--} retries, ${failed:--} failed, p99 ${p99:--} us; proposed ${proposed}${locks}; $verdict"
  stop_cluster
  if [[ $status != 0 ]]; then
    bad=$((bad + 1))
    if [[ -n "$KEEP" ]]; then
      mkdir -p "$KEEP/run$run"
      cp "$dir"/node*.log "$dir/economy.err" "$KEEP/run$run/"
    fi
  fi
  rm -rf "$dir"
done
echo "$bad of $RUNS runs stalled or failed"
[[ $bad == 0 ]]

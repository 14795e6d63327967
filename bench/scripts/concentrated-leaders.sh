#!/usr/bin/env bash
# One node leading every shard: does a node whose shards all have their home in its region keep
# replicating to, and talking with, its peers? (Issue #9: a peer accepts 1,024 streams per
# connection, and every shard a node leads keeps one replication stream open to each follower.)
#
#   bench/scripts/concentrated-leaders.sh [--shards 1024] [--records 20000] [--threads 16]
#                                         [--lead-timeout-s 300] [--base-port 26500]
#                                         [--bin-dir DIR]
#
# 1. starts 3 `meridian start` processes with --initial-shards N and --home-regions "=region1"
#    (node 1's region), so leaders move to node 1; waits until every shard has a leader and
#    then until node 1 leads all of them (meridian_raft_groups_led), or the timeout;
# 2. loads the records through every node (`meridian-ycsb load`) and prints its throughput and
#    errors;
# 3. prints node 1's replication streams and connections per peer (the
#    meridian_peer_replication_* gauges), and whether each node sees the other two alive
#    (`cluster status`), how many of each node's log lines name an h2 protocol error (calls
#    that failed with their connection), and node 1's warnings before the load (by kind) and
#    from the load on.
# --bin-dir runs the `meridian` and `meridian-ycsb` found there instead of building them.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
# shellcheck source=../../scripts/common.sh
source scripts/common.sh
# shellcheck source=lib/loopback-cluster.sh
source bench/scripts/lib/loopback-cluster.sh

SHARDS=1024 RECORDS=20000 THREADS=16 LEAD_TIMEOUT=300 BASE=26500 BIN_DIR=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --shards) SHARDS=$2; shift 2 ;;
    --records) RECORDS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --lead-timeout-s) LEAD_TIMEOUT=$2; shift 2 ;;
    --base-port) BASE=$2; shift 2 ;;
    --bin-dir) BIN_DIR=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

ycsb_workdir concentrated
METRICS_BASE=$((BASE + 300))
start_loopback_cluster "$WORK/meridian" "$BASE" "$WORK/data" "$SHARDS" --home-regions "=region1"
say "waiting until every shard has a leader"
boot_start=$SECONDS
wait_every_shard_led "$WORK/meridian" "$ENDPOINTS" 180 || { echo "error: shards without a leader after 180 s" >&2; exit 1; }
echo "every shard has a leader $((SECONDS - boot_start)) s after the nodes answered"

groups=$((SHARDS + 1))
say "waiting until node 1 leads all $groups groups (at most $LEAD_TIMEOUT s)"
start=$SECONDS led=0
while (( SECONDS - start < LEAD_TIMEOUT )); do
  led=$(metric_at 1 meridian_raft_groups_led)
  [[ "${led:-0}" -ge "$groups" ]] && break
  sleep 5
done
echo "node 1 leads ${led:-?} of $groups groups after $((SECONDS - start)) s"

warn_before=$(grep -c WARN "$WORK/data/node1.log" || true)
say "loading $RECORDS records with $THREADS threads"
"$WORK/meridian-ycsb" load -P bench/workloads/workloada --db meridian --endpoints "$ENDPOINTS" \
  -p recordcount="$RECORDS" --threads "$THREADS" > "$WORK/load.txt" 2> "$WORK/load.err" || true
grep -E 'Throughput|Return=' "$WORK/load.txt" || tail -5 "$WORK/load.err"

for peer in 2 3; do
  echo "node 1 -> node $peer: $(metric_at 1 "meridian_peer_replication_streams{peer=\"$peer\"}") replication streams on $(metric_at 1 "meridian_peer_replication_connections{peer=\"$peer\"}") connections"
done
"$WORK/meridian" cluster status --endpoints "$ENDPOINTS" --timeout-ms 10000 2>&1 \
  | sed -n '1,/^$/p' | head -8
for node in 1 2 3; do
  # Calls that failed with their HTTP/2 connection (a GOAWAY from the peer, as its rapid-reset
  # guard sent at boot before the peer listener allowed more resets); they are retried.
  echo "node $node: $(grep -c 'h2 protocol error' "$WORK/data/node$node.log" || true) log lines (boot and load) with an h2 protocol error"
done
echo "node 1's warnings before the load, by kind (digits as N):"
grep WARN "$WORK/data/node1.log" | head -n "$warn_before" | sed -E 's/^.*WARN //' | cut -c1-140 \
  | sed -E 's/[0-9]+/N/g' | sort | uniq -c | sort -rn | head -5 || true
warn_all=$(grep -c WARN "$WORK/data/node1.log" || true)
echo "warnings on node 1: $warn_before before the load, $((warn_all - warn_before)) from the load on"
grep WARN "$WORK/data/node1.log" | tail -n "+$((warn_before + 1))" | sed -E 's/^.*WARN //' \
  | cut -c1-140 | sort | uniq -c | sort -rn | head -5 || true

#!/usr/bin/env bash
# Failover and restart at scale (issue #9's targets), on a fresh 3-node loopback cluster:
#
#   bench/scripts/scale-failover.sh [--shards 1024] [--quiesce true|false] [--base-port 26500]
#                                   [--settle-s 20]
#
# 1. starts 3 `meridian start` processes with --initial-shards N (server's default, WAN-sized
#    Raft timings: election timeout 1.5-3 s), waits until every shard has a leader, lets idle
#    shards settle (quiesce);
# 2. SIGKILLs the node leading the most shards and times until every shard has a live leader
#    again, as the survivors report it (no client traffic);
# 3. restarts that node and times until it answers `cluster status` (it has opened every
#    replica and serves).
# Prints one line per measurement. Status polls every 100 ms; every wait is bounded.
set -euo pipefail
source "$(dirname "$0")/../../scripts/common.sh"
source "$(dirname "$0")/lib/loopback-cluster.sh"

SHARDS=1024
QUIESCE=true
BASE_PORT=26500
SETTLE_S=20
while [[ $# -gt 0 ]]; do
  case "$1" in
    --shards) SHARDS="$2"; shift 2 ;;
    --quiesce) QUIESCE="$2"; shift 2 ;;
    --base-port) BASE_PORT="$2"; shift 2 ;;
    --settle-s) SETTLE_S="$2"; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

ensure_build_deps
cd "$ROOT"
say "building meridian (release)"
cargo build --release --locked -p meridian-cli
WORK="$(mktemp -d /var/tmp/meridian-failover.XXXXXX)"
BIN="$WORK/meridian"
cp "$CARGO_TARGET_DIR/release/meridian" "$BIN"

declare -A PIDS=()
loopback_cluster "$BASE_PORT"
start_node() {
  start_loopback_node "$BIN" "$1" "$BASE_PORT" "$WORK" --initial-shards "$SHARDS" --quiesce "$QUIESCE"
  PIDS[$1]=$NODE_PID
}
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

# The shards table of one node's own status: "id leader lag..." rows.
status_of() {
  "$BIN" cluster status --endpoints "$1" --timeout-ms 3000 2>/dev/null \
    | awk '/^SHARDS/ {s=1; next} s && NF == 0 {s=0} s && $1 ~ /^[0-9]+$/ {print}'
}
# Leader column: the 4th field for the metadata row "(metadata)", else after the range, which
# may contain spaces; take the first field after the replicas list (a,b,c).
leaders() { awk '{for (i = 2; i <= NF; i++) if ($i ~ /^[0-9]+(,[0-9]+)+$/) {print $(i + 1); break}}'; }
now_ms() { date +%s%3N; }

for id in 1 2 3; do start_node "$id"; done
say "waiting for $SHARDS shards to elect leaders"
deadline=$(( $(now_ms) + 600000 ))
while :; do
  if rows="$(status_of "127.0.0.1:$((BASE_PORT + 1))")" && [[ -n "$rows" ]] \
    && [[ "$(leaders <<<"$rows" | grep -c '^none$' || true)" == 0 ]] \
    && [[ "$(wc -l <<<"$rows")" -ge "$SHARDS" ]]; then
    break
  fi
  (( $(now_ms) < deadline )) || { echo "cluster did not get ready" >&2; exit 1; }
  sleep 1
done
sleep "$SETTLE_S"

rows="$(status_of "127.0.0.1:$((BASE_PORT + 1))")"
victim="$(leaders <<<"$rows" | sort | uniq -c | sort -rn | awk 'NR == 1 {print $2}')"
led="$(leaders <<<"$rows" | grep -c "^$victim\$")"
say "killing node $victim, which leads $led of $((SHARDS + 1)) shards (quiesce=$QUIESCE)"
kill -9 "${PIDS[$victim]}"
wait "${PIDS[$victim]}" 2>/dev/null || true
killed=$(now_ms)
survivor="127.0.0.1:$((BASE_PORT + $( [[ $victim == 1 ]] && echo 2 || echo 1 )))"
deadline=$(( killed + 120000 ))
while :; do
  rows="$(status_of "$survivor" || true)"
  orphans="$(leaders <<<"$rows" | grep -cE "^(none|$victim)\$" || true)"
  [[ -n "$rows" && "$orphans" == 0 ]] && break
  (( $(now_ms) < deadline )) || { echo "$orphans shards still leaderless after 120 s" >&2; exit 1; }
  sleep 0.1
done
echo "failover: all $((SHARDS + 1)) shards led again $(( $(now_ms) - killed )) ms after SIGKILL of node $victim (it led $led)"

start_node "$victim"
restarted=$(now_ms)
deadline=$(( restarted + 120000 ))
until "$BIN" cluster status --endpoints "127.0.0.1:$((BASE_PORT + victim))" --timeout-ms 1000 >/dev/null 2>&1; do
  (( $(now_ms) < deadline )) || { echo "node $victim did not serve within 120 s" >&2; exit 1; }
  sleep 0.1
done
echo "restart: node $victim ($((SHARDS + 1)) replicas) serves status $(( $(now_ms) - restarted )) ms after start"

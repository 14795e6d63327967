#!/usr/bin/env bash
# Measures how long a node holding N keys takes to serve again after a restart.
#
#   scripts/restart-time.sh [RECORDS] [--kill]
#
# Starts a 3-node loopback cluster, loads RECORDS YCSB records (default 1,000,000; ~1.1 KB each)
# with meridian-ycsb, stops node 2 (SIGTERM, or SIGKILL with --kill), restarts it, and reports:
# process start → "node serving" (storage opened, Raft groups recovered, listeners up), and
# process start → every shard replica on the node applied up to its leader's commit.
source "$(dirname "$0")/common.sh"
RECORDS="${1:-1000000}"
SIGNAL=TERM
[[ "${2:-}" == "--kill" ]] && SIGNAL=KILL
BIN="$CARGO_TARGET_DIR/release"
[[ -x "$BIN/meridian" && -x "$BIN/meridian-ycsb" ]] || {
  ensure_build_deps
  cargo build --release --locked -p meridian-cli -p meridian-bench --manifest-path "$ROOT/Cargo.toml"
}
DIR="$(mktemp -d /tmp/meridian-restart.XXXXXX)"
BASE=29000
IC="1=127.0.0.1:$((BASE+101))@us-east/a,2=127.0.0.1:$((BASE+102))@eu-west/a,3=127.0.0.1:$((BASE+103))@ap-south/a"
declare -A PIDS
start_node() {
  local i=$1
  "$BIN/meridian" start --node-id "$i" --client-addr "127.0.0.1:$((BASE+i))" --peer-addr "127.0.0.1:$((BASE+100+i))" \
    --data-dir "$DIR/n$i" --initial-cluster "$IC" --heartbeat-interval-ms 100 --election-timeout-min-ms 600 \
    >>"$DIR/n$i.log" 2>&1 &
  PIDS[$i]=$!
}
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$DIR"; }
trap cleanup EXIT INT TERM
for i in 1 2 3; do start_node "$i"; done
sleep 3
say "loading $RECORDS records"
"$BIN/meridian-ycsb" load -P "$ROOT/bench/workloads/workloada" -p recordcount="$RECORDS" --threads 64 \
  --db meridian --endpoints "127.0.0.1:$((BASE+1))" --status-interval 30 | grep -E '^\[(OVERALL|INSERT)\]'
du -sh "$DIR/n2" | sed 's/^/node 2 data: /'
say "stopping node 2 with SIG$SIGNAL"
kill -"$SIGNAL" "${PIDS[2]}"; wait "${PIDS[2]}" 2>/dev/null || true
: >"$DIR/n2.log"
t0=$(date +%s.%N)
start_node 2
until grep -q "node serving" "$DIR/n2.log"; do sleep 0.01; done
t1=$(date +%s.%N)
# Caught up: node 2 has applied every entry in its log (no writes run during the restart, so
# its log already ends at the leader's commit) and every shard has a leader again.
until "$BIN/meridian" cluster status --endpoints "127.0.0.1:$((BASE+2))" 2>/dev/null | awk '
  /^SHARDS/ {s=1; next}
  s && NF == 0 {s=0}                                          # the table ends at a blank line
  s && $1 ~ /^[0-9]+$/ {
    k = NF + 1; for (i = NF; i > 1; i--) if ($i ~ /:/) k = i   # LAG columns hold "node:entries"
    # ... LEADER TERM APPLIED LAST-LOG QUIESCED LAG... HOME
    leader = $(k-5); applied = $(k-3); last = $(k-2)
    if (leader == "0" || leader == "-" || applied != last) bad = 1; n++ }
  END { exit !(n > 0 && !bad) }'; do sleep 0.05; done
t2=$(date +%s.%N)
awk -v r="$RECORDS" -v a="$t0" -v b="$t1" -v c="$t2" 'BEGIN {
  printf "restart of a node holding %s records: serving after %.2f s, all shards applied after %.2f s\n", r, b - a, c - a }'

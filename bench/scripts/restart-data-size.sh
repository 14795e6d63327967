#!/usr/bin/env bash
# Restart time against data size (issue #8): does a node holding many records serve again
# quickly after SIGKILL, and is the time flat in how much it holds?
#
#   bench/scripts/restart-data-size.sh [--sizes "1000000 10000000"] [--rounds 3] [--shards 8]
#                                      [--fieldcount 1] [--fieldlength 100]
#                                      [--base-port 26900] [--bin-dir DIR]
#
# Per size: start a fresh 3-node loopback cluster (--initial-shards N, 100 ms heartbeats),
# `meridian-ycsb bulk-load` SIZE YCSB records (fieldcount x fieldlength bytes each), report the
# load rate and each node's data directory size; then ROUNDS times: SIGKILL node V (rotating
# 1, 2, 3), wait 2 s, start it again on the same data, and time from that start until
#   status: the node answers `cluster status` through its own client port (every replica is
#           open and its gRPC server serves);
#   read:   the node itself serves a loaded key: an exact-staleness read (5 s, past the
#           default 3 s closed-timestamp lag) asked of it with its own region is answered
#           `served_by=V` with the value (its replica has caught up past that timestamp and
#           reads its own RocksDB; before that the client falls back to the leader).
# Polls every 50 ms (a figure is late by at most that plus one probe: a CLI process and its
# call); every wait is bounded (120 s). The writes were acknowledged before the
# kill and were not flushed on purpose: RocksDB replays its WAL on open, as after a crash.
# --bin-dir runs the `meridian` and `meridian-ycsb` found there instead of building them.
set -euo pipefail
source "$(dirname "$0")/../../scripts/common.sh"
source "$(dirname "$0")/lib/loopback-cluster.sh"

SIZES="1000000 10000000"
ROUNDS=3
SHARDS=8
FIELDCOUNT=1
FIELDLENGTH=100
BASE_PORT=26900
BIN_DIR=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --sizes) SIZES="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --shards) SHARDS="$2"; shift 2 ;;
    --fieldcount) FIELDCOUNT="$2"; shift 2 ;;
    --fieldlength) FIELDLENGTH="$2"; shift 2 ;;
    --base-port) BASE_PORT="$2"; shift 2 ;;
    --bin-dir) BIN_DIR="$2"; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

cd "$ROOT"
ycsb_workdir restart-data-size
BIN="$WORK/meridian"
RAFT_ARGS=(--heartbeat-interval-ms 100 --election-timeout-min-ms 600)
now_ms() { date +%s%3N; }
bytes_h() { awk -v b="$1" 'BEGIN {printf "%.2f GiB", b / 1073741824}'; }

# wait_until BOUND_MS CMD...: runs CMD every 50 ms until it succeeds; prints the elapsed ms
# since START_MS, or fails after BOUND_MS.
wait_until() {
  local bound=$1
  shift
  local deadline=$(( START_MS + bound ))
  until "$@" >/dev/null 2>&1; do
    (( $(now_ms) < deadline )) || return 1
    sleep 0.05
  done
  echo $(( $(now_ms) - START_MS ))
}
status_through() {
  "$BIN" cluster status --endpoints "127.0.0.1:$((BASE_PORT + $1))" --timeout-ms 1000
}
read_served_by() {
  local id=$1 out
  out="$("$BIN" kv get "$KEY" --endpoints "127.0.0.1:$((BASE_PORT + id))" --region "region$id" \
    --exact-staleness-ms 5000 --timeout-ms 1000 2>&1)" || return 1
  grep -q "served_by=$id\b" <<<"$out" && ! grep -q "(not found)" <<<"$out"
}

echo "# restart after SIGKILL vs data size: $SHARDS shards, ${FIELDCOUNT}x${FIELDLENGTH} B records, $(date -u +%FT%TZ)"
for size in $SIZES; do
  dir="$WORK/size-$size"
  PIDS=()
  start_loopback_cluster "$BIN" "$BASE_PORT" "$dir" "$SHARDS" "${RAFT_ARGS[@]}"
  wait_every_shard_led "$BIN" "$ENDPOINTS" 120 || { echo "cluster did not elect" >&2; exit 1; }
  say "bulk-loading $size records"
  "$WORK/meridian-ycsb" bulk-load -p "recordcount=$size" -p "fieldcount=$FIELDCOUNT" \
    -p "fieldlength=$FIELDLENGTH" --endpoints "$ENDPOINTS" --status-interval 30 \
    >"$dir/bulk-load.txt"
  rate="$(awk -F', ' '/Records\/sec/ {print $3}' "$dir/bulk-load.txt")"
  KEY="$("$BIN" kv scan --start user --limit 1 --endpoints "$ENDPOINTS" 2>/dev/null | cut -f1)" || true
  [[ -n "$KEY" ]] || { echo "no loaded key found" >&2; exit 1; }
  sizes=""
  for id in 1 2 3; do sizes+=" node$id=$(bytes_h "$(du -sb "$dir/node$id" | cut -f1)")"; done
  echo "size $size: bulk load $rate records/s; data on disk:$sizes"
  sleep 6 # so a read 5 s in the past sees the loaded records
  for round in $(seq 1 "$ROUNDS"); do
    victim=$(( (round - 1) % 3 + 1 ))
    kill -9 "${PIDS[$((victim - 1))]}"
    wait "${PIDS[$((victim - 1))]}" 2>/dev/null || true
    sleep 2
    START_MS=$(now_ms)
    start_loopback_node "$BIN" "$victim" "$BASE_PORT" "$dir" --initial-shards "$SHARDS" "${RAFT_ARGS[@]}"
    PIDS[$((victim - 1))]=$NODE_PID
    status_ms="$(wait_until 120000 status_through "$victim")" \
      || { echo "node $victim did not answer status within 120 s" >&2; exit 1; }
    read_ms="$(wait_until 120000 read_served_by "$victim")" \
      || { echo "node $victim did not serve a read within 120 s" >&2; exit 1; }
    echo "size $size round $round: node $victim after SIGKILL: status ${status_ms} ms, own read ${read_ms} ms"
  done
  stop_cluster
  rm -rf "$dir"
done

#!/usr/bin/env bash
# What an idle cluster costs as its shard count grows, with quiescence on and off, side by
# side in one run (bench/README.md, "Idle cost").
#
#   bench/scripts/idle-cost.sh [--shards "8 64 256 1024"] [--measure-s 20] [--settle-s 30]
#                              [--modes "true false"] [--base-port 26000] [--out FILE]
#                              [--bin-dir DIR] [--node-args "..."]
#
# For each shard count and each `--quiesce` mode: starts a fresh 3-node loopback cluster of
# real `meridian start` processes, waits until it answers and every shard has a leader, lets
# it settle (elections done, idle shards quiesced), then over the measure window reads each
# process's CPU time (/proc/<pid>/stat utime+stime) and RSS, and counts WARN/ERROR log lines.
# Prints one markdown table row per run (and appends them to --out, if given). --bin-dir runs
# the `meridian` found there instead of building it (two builds side by side); --node-args adds
# flags to every `meridian start`.
set -euo pipefail
source "$(dirname "$0")/../../scripts/common.sh"
source "$(dirname "$0")/lib/loopback-cluster.sh"

SHARDS="8 64 256 1024"
MODES="true false"
MEASURE_S=20
SETTLE_S=30
BASE_PORT=26000
OUT=""
SRC_BIN_DIR=""
NODE_ARGS=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --shards) SHARDS="$2"; shift 2 ;;
    --modes) MODES="$2"; shift 2 ;;
    --measure-s) MEASURE_S="$2"; shift 2 ;;
    --settle-s) SETTLE_S="$2"; shift 2 ;;
    --base-port) BASE_PORT="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --bin-dir) SRC_BIN_DIR="$2"; shift 2 ;;
    --node-args) NODE_ARGS="$2"; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

cd "$ROOT"
if [[ -z "$SRC_BIN_DIR" ]]; then
  ensure_build_deps
  say "building meridian (release)"
  cargo build --release --locked -p meridian-cli
  SRC_BIN_DIR="$CARGO_TARGET_DIR/release"
fi
# A private copy: a rebuild during the run must not change the binary between rows.
BIN_DIR="$(mktemp -d /var/tmp/meridian-idle-bin.XXXXXX)"
BIN="$BIN_DIR/meridian"
cp "$SRC_BIN_DIR/meridian" "$BIN"
TICKS=$(getconf CLK_TCK)

PIDS=()
WORK=""
stop_all() {
  for pid in "${PIDS[@]:-}"; do
    [[ -n "$pid" ]] && kill "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]:-}"; do
    [[ -n "$pid" ]] && wait "$pid" 2>/dev/null || true
  done
  PIDS=()
  [[ -n "$WORK" ]] && rm -rf "$WORK"
  WORK=""
}
trap 'stop_all; rm -rf "$BIN_DIR"' EXIT INT TERM

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
rss_kib() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
noisy_lines() { cat "$WORK"/node*.log | grep -cE ' (WARN|ERROR) ' || true; }

header="| shards | quiesce | idle CPU, 3 nodes (% of one core) | RSS, 3 nodes (MiB) | WARN+ERROR lines / min | shards quiesced (answering node) |"
echo "$header"
echo "|---:|---|---:|---:|---:|---:|"
[[ -n "$OUT" ]] && { echo "$header"; echo "|---:|---|---:|---:|---:|---:|"; } >>"$OUT"

for n in $SHARDS; do
  for mode in $MODES; do
    WORK="$(mktemp -d /var/tmp/meridian-idle.XXXXXX)"
    loopback_cluster "$BASE_PORT"
    endpoints=$ENDPOINTS
    for id in 1 2 3; do
      # shellcheck disable=SC2086 # NODE_ARGS is a list of flags
      start_loopback_node "$BIN" "$id" "$BASE_PORT" "$WORK" --initial-shards "$n" --quiesce "$mode" $NODE_ARGS
      PIDS+=("$NODE_PID")
    done
    if ! wait_every_shard_led "$BIN" "$endpoints" 300; then
      echo "cluster with $n shards (quiesce=$mode) did not get ready; logs in $WORK" >&2
      tail -20 "$WORK"/node1.log >&2
      exit 1
    fi
    sleep "$SETTLE_S"
    before=(); for pid in "${PIDS[@]}"; do before+=("$(cpu_ticks "$pid")"); done
    lines_before=$(noisy_lines)
    sleep "$MEASURE_S"
    total=0; rss=0; i=0
    for pid in "${PIDS[@]}"; do
      total=$((total + $(cpu_ticks "$pid") - before[i]))
      rss=$((rss + $(rss_kib "$pid")))
      i=$((i + 1))
    done
    lines=$(( $(noisy_lines) - lines_before ))
    status="$("$BIN" cluster status --endpoints "$endpoints" --timeout-ms 3000 2>/dev/null || true)"
    quiet=$(grep -cE '\syes\s+[0-9]+:' <<<"$status" || true)
    cpu=$(awk -v t="$total" -v hz="$TICKS" -v s="$MEASURE_S" 'BEGIN {printf "%.1f", 100 * t / hz / s}')
    per_min=$(awk -v l="$lines" -v s="$MEASURE_S" 'BEGIN {printf "%.0f", l * 60 / s}')
    row="| $n | $mode | $cpu | $((rss / 1024)) | $per_min | $quiet |"
    echo "$row"
    [[ -n "$OUT" ]] && echo "$row" >>"$OUT"
    stop_all
  done
done

# shellcheck shell=bash disable=SC2034  # sets CLUSTER, ENDPOINTS, NODE_PID, WORK and PIDS for the caller
# Shared by the bench/scripts/*.sh cluster benchmarks (sourced, not run): a 3-node loopback
# cluster of real `meridian start` processes. Node i (1..3) serves clients on BASE+i and peers
# on BASE+100+i, in region "region<i>", data under DIR/node<i>, log in DIR/node<i>.log.

# Sets CLUSTER (the --initial-cluster list) and ENDPOINTS (client addresses) for base port $1.
loopback_cluster() {
  local base=$1 id
  CLUSTER="" ENDPOINTS=""
  for id in 1 2 3; do
    CLUSTER+="${CLUSTER:+,}$id=127.0.0.1:$((base + 100 + id))@region$id/a"
    ENDPOINTS+="${ENDPOINTS:+,}127.0.0.1:$((base + id))"
  done
}

# start_loopback_node BIN ID BASE DIR [extra start args...]: starts node ID in the background
# (appending to its log) and sets NODE_PID. Needs CLUSTER from loopback_cluster.
start_loopback_node() {
  local bin=$1 id=$2 base=$3 dir=$4
  shift 4
  "$bin" start --node-id "$id" --client-addr "127.0.0.1:$((base + id))" \
    --peer-addr "127.0.0.1:$((base + 100 + id))" --data-dir "$dir/node$id" \
    --initial-cluster "$CLUSTER" "$@" >>"$dir/node$id.log" 2>&1 &
  NODE_PID=$!
}

# wait_every_shard_led BIN ENDPOINTS BOUND_S: until `cluster status` answers and no shard row
# shows "none" as its leader; fails after BOUND_S seconds.
wait_every_shard_led() {
  local bin=$1 endpoints=$2 bound=$3 status
  for _ in $(seq 1 "$bound"); do
    if status="$("$bin" cluster status --endpoints "$endpoints" --timeout-ms 3000 2>/dev/null)" \
      && ! grep -qE '^\s*[0-9]+\s.*\snone\s' <<<"$status"; then
      return 0
    fi
    sleep 1
  done
  return 1
}

# start_loopback_cluster BIN BASE DIR SHARDS [extra start args...]: starts nodes 1..3 with
# SHARDS data shards and appends their PIDs to the caller's PIDS array; sets CLUSTER and
# ENDPOINTS. With METRICS_BASE set, node i serves metrics on 127.0.0.1:METRICS_BASE+i. Does
# not wait: see wait_every_shard_led.
start_loopback_cluster() {
  local bin=$1 base=$2 dir=$3 shards=$4 id metrics
  shift 4
  loopback_cluster "$base"
  mkdir -p "$dir"
  for id in 1 2 3; do
    metrics=()
    [[ -n "${METRICS_BASE:-}" ]] && metrics=(--metrics-addr "127.0.0.1:$((METRICS_BASE + id))")
    start_loopback_node "$bin" "$id" "$base" "$dir" --initial-shards "$shards" "${metrics[@]}" "$@"
    PIDS+=("$NODE_PID")
  done
}

# metric_at ID NAME: metric NAME (an exact series name) of node ID's metrics endpoint
# (METRICS_BASE+ID), scraped with bash's /dev/tcp; empty if the node does not answer.
metric_at() {
  local id=$1 name=$2
  (
    exec 3<>"/dev/tcp/127.0.0.1/$((METRICS_BASE + id))" 2>/dev/null || exit 0
    printf 'GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n' >&3
    timeout 5 cat <&3 | awk -v n="$name" '$1 == n {print $2}'
  )
}

# metric_sum NAME: the sum of metric NAME over nodes 1..3 (metric_at); 0 where a node does not
# answer.
metric_sum() {
  local name=$1 id total=0 value
  for id in 1 2 3; do
    value=$(metric_at "$id" "$name")
    total=$(awk -v a="$total" -v b="${value:-0}" 'BEGIN {print a + b}')
  done
  echo "$total"
}

# ycsb_workdir NAME: builds `meridian` and `meridian-ycsb` unless BIN_DIR names a directory
# holding them, copies both into a fresh WORK directory (/var/tmp/meridian-NAME.XXXXXX), and
# sets PIDS=() with a trap that stops every node in PIDS (stop_cluster) and removes WORK.
ycsb_workdir() {
  if [[ -z "${BIN_DIR:-}" ]]; then
    ensure_build_deps
    say "building meridian and meridian-ycsb (release)"
    cargo build --release --locked -p meridian-cli -p meridian-bench
    BIN_DIR="$CARGO_TARGET_DIR/release"
  fi
  WORK="$(mktemp -d "/var/tmp/meridian-$1.XXXXXX")"
  cp "$BIN_DIR/meridian" "$BIN_DIR/meridian-ycsb" "$WORK/"
  PIDS=()
  trap 'stop_cluster; rm -rf "$WORK"' EXIT INT TERM
}

# stop_cluster: stops (and waits for) every node in PIDS, then empties it.
stop_cluster() {
  local pid
  for pid in "${PIDS[@]:-}"; do [[ -n "$pid" ]] && kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]:-}"; do [[ -n "$pid" ]] && wait "$pid" 2>/dev/null || true; done
  PIDS=()
}

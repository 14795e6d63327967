#!/usr/bin/env bash
# End-to-end check of the container cluster (docker/compose.yaml: 9 nodes, 3 per region), as
# CI runs it:
#
#   1. build meridian:local (docker/build-images.sh; the host's `meridian` binary is the CLI)
#   2. write the wan topology for the test's subnet and check that the nodes' --peer-dial flags
#      in compose.yaml are exactly the dial map `meridian-wan --print-dial-map` plans from it
#   3. `docker-compose -p meridian-ci up -d`, wait until the wan answers on its control port,
#      all nine nodes are healthy and every shard has a leader; print each container's CPU and
#      memory (`docker stats`)
#   4. write 100 keys spread over every shard and read them back; no write may commit faster
#      than the smallest quorum round trip its shard's replicas allow through the wan (80 ms:
#      one replica per region): the WAN is in the path
#   5. as a client in each region in turn (through the wan's client links for that region):
#      rewrite and read one key per shard, each no faster than its emulated floor
#      (client→leader RTT, + the leader's quorum RTT for a put); a table per region
#   6. `docker kill` (SIGKILL) the eu-west node that leads the most shards (its shards keep
#      a quorum only across us-east and ap-south, 200 ms apart); write 50 more keys, which
#      the others must accept, and read them back
#   7. `docker start` it; wait until it is healthy, answers status, and the shard leaders
#      report it fully replicated (lag 0 on every shard); read the new keys with it as the
#      only seed
#   8. zone survival: `meridian cluster placement 1 --home us-east --survive zone`; wait until
#      shard 1's voters are all in us-east (the others learners); then, as a client in us-east,
#      write its key 10 times: the fastest must beat the smallest cross-region round trip
#      (80 ms), or the commit still crosses a region
#   9. a region failure: `docker kill` all three ap-south nodes; write 30 keys (every shard
#      keeps a quorum in us-east and eu-west) and read them back; `docker start` them, wait
#      until they have caught up and every shard is led from its home region again
#  10. scan the whole keyspace through ap-south-1: exactly the 180 keys and values
#  11. read the wan's `status`: every peer link, and the client links the clients used, must
#      have forwarded bytes
#  12. `docker-compose down -v` — always, from an EXIT trap, also after a failure (which first
#      prints each container's log tail, then their states and health checks; the failure
#      itself is repeated as the last line, since CI shows the tail of the output)
#
# Exits 0 without running anything, saying SKIP, only when no Docker engine is reachable.
#
# Usage: docker/test.sh [--no-cargo]   (--no-cargo: use the already built release binary)
# Environment (defaults chosen not to collide with the other tests' loopback ports
# 21000-23999, nor with a demo cluster from compose.yaml's defaults on 7001-7009/10.77.0.0/24):
#   MERIDIAN_CI_PROJECT        compose project name (meridian-ci)
#   MERIDIAN_CI_PORT_BASE      node N's published client port is BASE+N, the wan's control
#                              port BASE+299 and its client links BASE+301..327: us-east,
#                              eu-west, ap-south, nine each (27000)
#   MERIDIAN_CI_SUBNET_PREFIX  the nodes' /24 (10.77.201)
#   MERIDIAN_CI_KILL           service to kill in step 6 (default: the eu-west node leading
#                              the most shards)
#   MERIDIAN_CI_WAIT_S         bound of every wait for health/leaders/catch-up (180)
set -euo pipefail
# A failure inside $(...) fails the command that uses it, as it would outside.
shopt -s inherit_errexit

DOCKER_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$DOCKER_DIR/.." && pwd)"

if ! docker info >/dev/null 2>&1; then
  echo "SKIP docker/test.sh: no Docker engine is reachable (\`docker info\` failed), so the container cluster test did not run"
  exit 0
fi

# scripts/common.sh: `say` and CARGO_TARGET_DIR (where build-images.sh puts the binary).
# shellcheck source=SCRIPTDIR/../scripts/common.sh
source "$REPO_ROOT/scripts/common.sh"

build_args=()
for arg in "$@"; do
  case "$arg" in
    --no-cargo) build_args+=(--no-cargo) ;;
    -h | --help)
      sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "error: unknown argument \"$arg\" (see --help)" >&2
      exit 2
      ;;
  esac
done

PROJECT="${MERIDIAN_CI_PROJECT:-meridian-ci}"
PORT_BASE="${MERIDIAN_CI_PORT_BASE:-27000}"
WAIT_S="${MERIDIAN_CI_WAIT_S:-180}"
export MERIDIAN_IMAGE="${MERIDIAN_IMAGE:-meridian:local}"
export MERIDIAN_SUBNET_PREFIX="${MERIDIAN_CI_SUBNET_PREFIX:-10.77.201}"
export MERIDIAN_PORT_WAN_CONTROL=$((PORT_BASE + 299))
# compose.yaml's default, pinned: steps 8 and 9 rely on shards 1-3 being homed in us-east.
export MERIDIAN_HOME_REGIONS="=us-east,user408376=eu-west,user716752=ap-south"
MERIDIAN="$CARGO_TARGET_DIR/release/meridian"
MERIDIAN_WAN="$CARGO_TARGET_DIR/release/meridian-wan"
# docker/wan.toml names the default subnet's addresses literally; the test's copy, with its own
# prefix, lives in WORK_DIR (made once the EXIT trap is set, removed by it) and compose mounts
# it (MERIDIAN_WAN_CONFIG).
WORK_DIR=""
KEYS_BEFORE_KILL=100
KEYS_DURING_OUTAGE=50
KEYS_DURING_REGION_OUTAGE=30
# Step 8's writes to the zone-survival shard (the same key each time).
ZONE_WRITES=10
# The shard step 8 gives zone survival, its home (compose.yaml's --home-regions homes shards
# 1-3 in us-east) and the region step 9 loses.
ZONE_SHARD=1
ZONE_HOME=us-east
LOST_REGION=ap-south
# Every CLI call's own budget, retries included: long enough to ride out an election
# (election timeouts are 1.5-3 s) plus the client's backoff.
CLI_TIMEOUT_MS=20000

# Node id -> service, region, published port and address on the compose network
# (compose.yaml): node ids go round the regions, so node N is in REGIONS[(N-1) % 3], zone
# a/b/c for the 1st/2nd/3rd node of its region, at <prefix>.<region 1-3><1-3>.
REGIONS=(us-east eu-west ap-south)
NODE_IDS=(1 2 3 4 5 6 7 8 9)
SERVICES=()
declare -A NODE_OF=() SERVICE_OF=() PORT_OF=() ADDR_OF=() REGION_OF=()
for id in "${NODE_IDS[@]}"; do
  region_index=$(((id - 1) % 3))
  nth=$(((id - 1) / 3 + 1))
  service="${REGIONS[$region_index]}-$nth"
  SERVICES+=("$service")
  NODE_OF[$service]=$id
  SERVICE_OF[$id]=$service
  REGION_OF[$id]=${REGIONS[$region_index]}
  PORT_OF[$service]=$((PORT_BASE + id))
  ADDR_OF[$service]="$MERIDIAN_SUBNET_PREFIX.$((region_index + 1))$nth:7001"
  export "MERIDIAN_PORT_$id=$((PORT_BASE + id))"
done
# Client links, as docker/wan.toml plans them: nine per region, in REGIONS order.
declare -A WAN_PORT=()
for region_index in "${!REGIONS[@]}"; do
  region="${REGIONS[$region_index]}"
  for id in "${NODE_IDS[@]}"; do
    WAN_PORT[$region,$id]=$((PORT_BASE + 300 + 9 * region_index + id))
    upper="${region^^}"
    export "MERIDIAN_PORT_WAN_${upper//-/_}_TO_$id=${WAN_PORT[$region,$id]}"
  done
done
# The wan container (no health check: there is no probe in the image; see wait_wan).
WAN_SERVICE=wan
# A client in region R reaches node N through the wan's published link client-R-to-N: its seed
# is R's first node, and seeds and leader addresses are the nodes' advertised client addresses,
# mapped by --dial.
declare -A DIAL_IN=()
for region in "${REGIONS[@]}"; do
  for id in "${NODE_IDS[@]}"; do
    DIAL_IN[$region]+="${DIAL_IN[$region]:+,}${ADDR_OF[${SERVICE_OF[$id]}]}=127.0.0.1:${WAN_PORT[$region,$id]}"
  done
done
if [[ -n "${MERIDIAN_CI_KILL:-}" && -z "${NODE_OF[$MERIDIAN_CI_KILL]:-}" ]]; then
  echo "error: MERIDIAN_CI_KILL=$MERIDIAN_CI_KILL is not one of: ${SERVICES[*]}" >&2
  exit 2
fi
# endpoints_of SERVICE...: their published client ports, comma-separated.
endpoints_of() {
  local service list=()
  for service in "$@"; do list+=("127.0.0.1:${PORT_OF[$service]}"); done
  (IFS=,; echo "${list[*]}")
}
ALL_ENDPOINTS="$(endpoints_of "${SERVICES[@]}")"

if command -v docker-compose >/dev/null 2>&1; then
  COMPOSE=(docker-compose)
elif docker compose version >/dev/null 2>&1; then
  COMPOSE=(docker compose)
else
  echo "error: neither docker-compose nor the \`docker compose\` plugin is installed" >&2
  exit 1
fi
COMPOSE+=(-p "$PROJECT" -f "$DOCKER_DIR/compose.yaml")

STARTED_AT=$SECONDS
log() { printf '[%4ds] %s\n' "$((SECONDS - STARTED_AT))" "$*"; }
# The failure, repeated as the last line of the output (after the diagnostics and the
# teardown, which push it far up): CI shows the output's tail.
FAILURE=""
fail() {
  FAILURE="$(printf '[%4ds] FAIL: %s' "$((SECONDS - STARTED_AT))" "$*")"
  printf '%s\n' "$FAILURE" >&2
  exit 1
}

# Phase timings for the summary: "name seconds" lines.
TIMINGS=()
phase_started=$SECONDS
phase_done() {
  TIMINGS+=("$(printf '%-44s %4d s' "$1" "$((SECONDS - phase_started))")")
  phase_started=$SECONDS
}

indent() {
  local line
  while IFS= read -r line; do printf '    %s\n' "$line"; done
}

container_of() { "${COMPOSE[@]}" ps -q "$1" 2>/dev/null || true; }

# ---- teardown, also on failure and Ctrl-C ------------------------------------------------------
cluster_created=0
dump_diagnostics() {
  echo "================ diagnostics: ${COMPOSE[*]} ================" >&2
  local service id
  # The wan's log first (its lines are mostly about links to a node that is down), then each
  # node's, then every container's state: CI shows the tail of the output.
  for service in "$WAN_SERVICE" "${SERVICES[@]}"; do
    echo "---- $service: the last 80 lines of its log" >&2
    "${COMPOSE[@]}" logs --no-color --timestamps --tail=80 "$service" >&2 || true
  done
  "${COMPOSE[@]}" ps >&2 || true
  for service in "$WAN_SERVICE" "${SERVICES[@]}"; do
    id="$(container_of "$service")"
    [[ -n "$id" ]] || continue
    echo "---- $service: state and the last health-check results" >&2
    # Passing checks print a whole status table: show only failing checks' output.
    docker inspect -f '{{.State.Status}} exit={{.State.ExitCode}} restarts={{.RestartCount}} started={{.State.StartedAt}}{{if .State.Health}}{{range .State.Health.Log}}
  check at {{.Start}}: exit {{.ExitCode}}{{if ne .ExitCode 0}}: {{.Output}}{{end}}{{end}}{{end}}' "$id" >&2 || true
  done
}
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  if ((status != 0)) && ((cluster_created)); then
    dump_diagnostics
  fi
  if ((cluster_created)); then
    local teardown_started=$SECONDS
    log "tearing down: ${COMPOSE[*]} down -v"
    # Its progress lines only when it fails (they would push the diagnostics out of CI's view).
    local teardown_out
    if ! teardown_out="$("${COMPOSE[@]}" down -v --remove-orphans --timeout 30 2>&1)"; then
      printf '%s\n' "$teardown_out" >&2
      echo "warning: teardown failed; clean up with: ${COMPOSE[*]} down -v --remove-orphans" >&2
      ((status != 0)) || status=1
    fi
    TIMINGS+=("$(printf '%-44s %4d s' "teardown (down -v)" "$((SECONDS - teardown_started))")")
  fi
  if ((${#TIMINGS[@]})); then
    echo "timings:"
    printf '  %s\n' "${TIMINGS[@]}"
  fi
  if [[ -n "$WORK_DIR" ]]; then
    rm -rf "$WORK_DIR"
  fi
  if ((status == 0)); then
    log "PASS docker/test.sh"
  else
    [[ -z "$FAILURE" ]] || echo "$FAILURE" >&2
    log "docker/test.sh failed (exit $status)"
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
WORK_DIR="$(mktemp -d "${TMPDIR:-/tmp}/meridian-docker-test.XXXXXX")"
chmod 0755 "$WORK_DIR"
export MERIDIAN_WAN_CONFIG="$WORK_DIR/wan.toml"

# ---- helpers -----------------------------------------------------------------------------------
# cli ENDPOINTS ARGS...: the host's meridian CLI against ENDPOINTS (comma-separated seeds),
# dialling nodes directly (the published ports and bridge addresses: no WAN on the way in).
cli() {
  local endpoints="$1"
  shift
  # (An empty MERIDIAN_DIAL is an error for the CLI, so unset a caller's rather than blank it.)
  env -u MERIDIAN_DIAL MERIDIAN_ENDPOINTS="$endpoints" "$MERIDIAN" "$@"
}

# cli_in REGION ARGS...: the host's CLI as a client in REGION: every node is dialled through
# the wan's client-REGION-to-N link (1 ms each way to the nodes of its own region, 40, 65 or
# 100 ms to the others: us-east is nodes 1, 4, 7, eu-west 2, 5, 8, ap-south 3, 6, 9).
cli_in() {
  local region="$1"
  shift
  MERIDIAN_ENDPOINTS="${ADDR_OF[$region-1]}" MERIDIAN_DIAL="${DIAL_IN[$region]}" "$MERIDIAN" "$@"
}

# wan_control COMMAND: one command on the wan's control port; prints the answer line.
wan_control() {
  # shellcheck disable=SC2016 # the inner script expands its own $1 and $2
  timeout 5 bash -c '
    exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    printf "%s\n" "$2" >&3
    IFS= read -r line <&3 || exit 1
    printf "%s\n" "$line"' _ "$MERIDIAN_PORT_WAN_CONTROL" "$1"
}

# wan_links: the wan's `status`, one link per line as `name forwarded_bytes one_way_ms
# accepted connect_failures`.
wan_links() {
  local answer
  answer="$(wan_control status)" || return 1
  [[ "$answer" == "ok "* ]] || return 1
  tr ';' '\n' <<<"${answer#ok }" | awk '
    {
      delete f
      for (i = 1; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
      if (f["name"] != "")
        print f["name"], f["forwarded_bytes"], f["one_way_ms"], f["accepted"], f["connect_failures"]
    }'
}

# wait_wan: until the wan container runs and its control port lists every link (bounded).
wait_wan() {
  local deadline=$((SECONDS + WAIT_S)) state links
  while true; do
    state="$(container_state "$WAN_SERVICE")"
    case "$state" in
      running/*) ;;
      exited/* | dead/* | missing) fail "the wan container is $state (its log: ${COMPOSE[*]} logs wan)" ;;
    esac
    if links="$(wan_links 2>/dev/null)" && (($(wc -l <<<"$links") == WAN_LINK_COUNT)); then
      log "  wan: running, $WAN_LINK_COUNT links on its control port 127.0.0.1:$MERIDIAN_PORT_WAN_CONTROL"
      return 0
    fi
    ((SECONDS < deadline)) || fail "the wan did not list its $WAN_LINK_COUNT links on 127.0.0.1:$MERIDIAN_PORT_WAN_CONTROL within ${WAIT_S} s (state $state)"
    sleep 1
  done
}

# key_for I: key I of this run, YCSB-shaped: "user" + a decimal spread uniformly over
# [0, 2^63) (Fibonacci hashing of I+1; distinct for every I used here). The default split
# points are laid out for exactly that shape, so the keys land in every data shard.
key_for() { printf 'user%d' "$(((($1 + 1) * 0x9E3779B97F4A7C15) & 0x7FFFFFFFFFFFFFFF))"; }
value_for() { printf 'value-%d-%s' "$1" "$RUN_ID"; }

# container_state SERVICE: "running/healthy", "exited/unhealthy", "missing", ...
container_state() {
  local id
  id="$(container_of "$1")"
  if [[ -z "$id" ]]; then
    echo missing
    return
  fi
  docker inspect -f '{{.State.Status}}/{{if .State.Health}}{{.State.Health.Status}}{{else}}no-healthcheck{{end}}' "$id" 2>/dev/null \
    || echo missing
}

# wait_healthy SERVICE...: until each is running and healthy; fails fast if one stops.
wait_healthy() {
  local deadline=$((SECONDS + WAIT_S)) line previous="" service state all
  while true; do
    line="" all=1
    for service in "$@"; do
      state="$(container_state "$service")"
      line+="$service=$state "
      case "$state" in
        running/healthy) ;;
        exited/* | dead/* | missing) fail "$service is $state while waiting for it to become healthy" ;;
        *) all=0 ;;
      esac
    done
    if [[ "$line" != "$previous" ]]; then
      log "  health: $line"
      previous="$line"
    fi
    ((all)) && return 0
    ((SECONDS < deadline)) || fail "not healthy within ${WAIT_S} s: $line"
    sleep 2
  done
}

# shard_rows: reads `meridian cluster status` output on stdin and prints one line per shard,
# "SHARD_ID LEADER LAG_CELL" (LEADER is a node id or "none"; LAG_CELL like "1:0,2:0,3:?"), and
# first a line "answered ANSWERED TOTAL" from the header. The table is parsed by column name:
# columns are separated by two or more spaces (cells such as a range or "LAST LOG" contain
# single spaces), so added columns do not break it.
shard_rows() {
  awk '
    function cells(line, out) {
      sub(/^ +/, "", line)
      return split(line, out, /  +/)
    }
    /^cluster / && match($0, /\([0-9]+ of [0-9]+ nodes answered\)/) {
      split(substr($0, RSTART + 1, RLENGTH - 2), words, " ")
      print "answered", words[1], words[3]
    }
    /^SHARDS/ { in_shards = 1; next }
    in_shards && NF > 0 && $1 == "ID" {
      n = cells($0, header)
      for (i = 1; i <= n; i++) {
        if (header[i] == "ID") id_col = i
        if (header[i] == "LEADER") leader_col = i
        if (header[i] ~ /^LAG/) lag_col = i
      }
      if (!id_col || !leader_col || !lag_col) {
        print "error: no ID, LEADER or LAG column in the SHARDS table of cluster status" > "/dev/stderr"
        exit 2
      }
      next
    }
    in_shards && NF == 0 { in_shards = 0; next }
    in_shards && leader_col && $1 ~ /^[0-9]+$/ {
      cells($0, row)
      lag = row[lag_col]
      gsub(/ +/, ",", lag)
      print row[id_col], row[leader_col], lag
    }
  '
}

# status_verdict [NODE_ID]: reads `meridian cluster status` output on stdin; prints a one-line
# summary; succeeds iff every node answered, every shard has a leader, and (with NODE_ID)
# the leaders report NODE_ID's replication lag as 0 on every shard it replicates.
status_verdict() {
  shard_rows | awk -v want="${1:-}" '
    $1 == "answered" { answered = $2; total = $3; next }
    {
      shards++
      if ($2 == "none") leaderless++
      if (want != "" && $2 != want) {
        n = split($3, lags, ",")
        for (i = 1; i <= n; i++) {
          split(lags[i], part, ":")
          if (part[1] == want && part[2] != "0") behind++
        }
      }
    }
    END {
      printf "%s/%s nodes answered, %d shards, %d without a leader", answered, total, shards, leaderless
      if (want != "") printf ", node %s behind on %d", want, behind
      printf "\n"
      exit !(total > 0 && answered == total && shards > 0 && leaderless == 0 && behind == 0)
    }'
}

# shard_leaders: reads `meridian cluster status` output on stdin and prints one line per data
# shard, "SHARD_ID LEADER REPLICAS LOW HIGH" (REPLICAS comma-separated node ids; LOW "-inf",
# HIGH "+inf" at the ends; keys unquoted), from the RANGE column
# (`["user202792", "user305584")`). The metadata shard is left out.
shard_leaders() {
  awk '
    function cells(line, out) {
      sub(/^ +/, "", line)
      return split(line, out, /  +/)
    }
    /^SHARDS/ { in_shards = 1; next }
    in_shards && NF > 0 && $1 == "ID" {
      n = cells($0, header)
      for (i = 1; i <= n; i++) {
        if (header[i] == "ID") id_col = i
        if (header[i] == "LEADER") leader_col = i
        if (header[i] == "RANGE") range_col = i
        if (header[i] == "REPLICAS") replicas_col = i
      }
      next
    }
    in_shards && NF == 0 { in_shards = 0; next }
    in_shards && leader_col && range_col && replicas_col && $1 ~ /^[0-9]+$/ {
      cells($0, row)
      range = row[range_col]
      if (range !~ /^\[.*\)$/) next
      range = substr(range, 2, length(range) - 2)
      split(range, bounds, ", ")
      gsub(/"/, "", bounds[1])
      gsub(/"/, "", bounds[2])
      print row[id_col], row[leader_col], row[replicas_col], bounds[1], bounds[2]
    }
  '
}

# shard_cell SHARD COLUMN: reads `meridian cluster status` output on stdin and prints that
# shard's cell in the SHARDS table's column COLUMN (its header text, e.g. HOME or MOVES).
shard_cell() {
  awk -v want_shard="$1" -v want_col="$2" '
    function cells(line, out) {
      sub(/^ +/, "", line)
      return split(line, out, /  +/)
    }
    /^SHARDS/ { in_shards = 1; next }
    in_shards && NF == 0 { in_shards = 0; next }
    in_shards && $1 == "ID" {
      n = cells($0, header)
      for (i = 1; i <= n; i++) {
        if (header[i] == "ID") id_col = i
        if (header[i] == want_col) col = i
      }
      next
    }
    in_shards && id_col && col && $1 ~ /^[0-9]+$/ {
      cells($0, row)
      if (row[id_col] == want_shard) print row[col]
    }
  '
}

# wait_cluster ENDPOINTS [NODE_ID]: until status_verdict holds (bounded).
wait_cluster() {
  local endpoints="$1" want="${2:-}" deadline=$((SECONDS + WAIT_S)) output verdict previous=""
  while true; do
    if output="$(cli "$endpoints" cluster status --timeout-ms 5000 2>&1)"; then
      if verdict="$(status_verdict "$want" <<<"$output")"; then
        log "  cluster: $verdict"
        LAST_STATUS="$output"
        return 0
      fi
    else
      verdict="status failed: $(tail -n1 <<<"$output")"
    fi
    if [[ "$verdict" != "$previous" ]]; then
      log "  cluster: $verdict"
      previous="$verdict"
    fi
    if ((SECONDS >= deadline)); then
      printf '%s\n' "$output" >&2
      fail "cluster not ready within ${WAIT_S} s: $verdict"
    fi
    sleep 1
  done
}

now_ms() { local us="${EPOCHREALTIME/[.,]/}"; echo $((us / 1000)); }

# put_keys ENDPOINTS FIRST COUNT FLOOR_MS: writes keys FIRST..FIRST+COUNT-1; prints progress,
# the fastest, median and slowest write (one CLI process each, so that includes connecting and
# any retries) and fails if any write committed faster than FLOOR_MS (0: no floor): while
# every shard has one replica per region a commit needs a follower in another region, so no
# write can beat the smallest quorum round trip of the wan.
put_keys() {
  local endpoints="$1" first="$2" count="$3" floor="$4" i key out status started took slowest=0 slowest_key=""
  local fastest=999999 fastest_key="" took_all=()
  for ((i = first; i < first + count; i++)); do
    key="$(key_for "$i")"
    status=0
    started="$(now_ms)"
    out="$(cli "$endpoints" kv put --timeout-ms "$CLI_TIMEOUT_MS" "$key" "$(value_for "$i")" 2>&1)" || status=$?
    took=$(($(now_ms) - started))
    if ((status == 3)); then
      fail "put $key: outcome unknown (exit 3): $out"
    elif ((status != 0)); then
      fail "put $key failed (exit $status): $out"
    fi
    if ((took > slowest)); then
      slowest=$took slowest_key=$key
    fi
    if ((took < fastest)); then
      fastest=$took fastest_key=$key
    fi
    took_all+=("$took")
    if (((i - first + 1) % 25 == 0)); then
      log "  wrote $((i - first + 1))/$count keys"
    fi
  done
  local median
  median="$(printf '%s\n' "${took_all[@]}" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')"
  log "  writes: fastest $fastest ms ($fastest_key), median $median ms, slowest $slowest ms ($slowest_key)"
  ((fastest >= floor)) \
    || fail "put $fastest_key committed in $fastest ms, faster than the smallest quorum round trip through the wan ($floor ms): the WAN is not in the write path"
}

# get_keys ENDPOINTS FIRST COUNT: reads keys FIRST..FIRST+COUNT-1 and checks every value.
get_keys() {
  local endpoints="$1" first="$2" count="$3" i key got expected
  for ((i = first; i < first + count; i++)); do
    key="$(key_for "$i")"
    expected="$(value_for "$i")"
    got="$(cli "$endpoints" kv get --timeout-ms "$CLI_TIMEOUT_MS" "$key" 2>&1)" \
      || fail "get $key failed: $got"
    [[ "$got" == "$expected" ]] || fail "get $key returned \"$got\", expected \"$expected\""
    if (((i - first + 1) % 25 == 0)); then
      log "  read $((i - first + 1))/$count keys, all as written"
    fi
  done
}

# ---- 1. images ---------------------------------------------------------------------------------
log "building the image (docker/build-images.sh ${build_args[*]:-})"
"$DOCKER_DIR/build-images.sh" "${build_args[@]}"
[[ -x "$MERIDIAN" ]] || fail "no host CLI at $MERIDIAN after the build"
phase_done "build image (incl. cargo build)"
RUN_ID="$(date +%s)-$$"

[[ -x "$MERIDIAN_WAN" ]] || fail "no host meridian-wan at $MERIDIAN_WAN after the build"

# ---- 2. the wan's topology, and the nodes' dial flags against it -------------------------------
# docker/wan.toml with the test's subnet prefix (its addresses are literal, see that file).
sed "s/10\.77\.0\./$MERIDIAN_SUBNET_PREFIX./g" "$DOCKER_DIR/wan.toml" >"$MERIDIAN_WAN_CONFIG"
chmod 0644 "$MERIDIAN_WAN_CONFIG"
planned="$("$MERIDIAN_WAN" --config "$MERIDIAN_WAN_CONFIG" --print-dial-map)" \
  || fail "meridian-wan rejects the topology $MERIDIAN_WAN_CONFIG (made from docker/wan.toml)"
planned_nodes="$(grep '^node ' <<<"$planned" | sort)"
# What compose.yaml gives each node: "node ID PEER_DIAL" from the resolved configuration.
configured_nodes="$("${COMPOSE[@]}" config | awk '
  /^ *- --node-id=/ { sub(/^ *- --node-id=/, ""); id = $0 }
  /^ *- --peer-dial=/ { sub(/^ *- --peer-dial=/, ""); dial = $0 }
  /^  [A-Za-z0-9_.-]+:$/ { if (id != "") print "node", id, dial; id = ""; dial = "" }
  END { if (id != "") print "node", id, dial }
' | sort)"
if [[ "$planned_nodes" != "$configured_nodes" ]]; then
  printf 'planned by meridian-wan --print-dial-map:\n%s\ncompose.yaml --peer-dial:\n%s\n' \
    "$planned_nodes" "$configured_nodes" >&2
  fail "the nodes' --peer-dial flags in compose.yaml do not match the links planned from docker/wan.toml"
fi
log "the nodes' --peer-dial flags match meridian-wan's plan:"
indent <<<"$planned"
# Links (peer + client) the wan must list: one per entry of the dial maps.
WAN_LINK_COUNT="$(tr ',' '\n' <<<"$(awk '{ print $3 }' <<<"$planned")" | grep -c =)"
phase_done "wan topology and dial-map check"

# ---- 3. cluster up -----------------------------------------------------------------------------
log "project $PROJECT: subnet $MERIDIAN_SUBNET_PREFIX.0/24, client ports $ALL_ENDPOINTS, wan control 127.0.0.1:$MERIDIAN_PORT_WAN_CONTROL"
cluster_created=1
# Leftovers of an earlier run that was killed before its trap ran.
"${COMPOSE[@]}" down -v --remove-orphans --timeout 10 >/dev/null 2>&1 || true
log "starting: ${COMPOSE[*]} up -d"
"${COMPOSE[@]}" up -d
wait_wan
# One-way delays as the running wan reports them (not as this script assumes).
declare -A ONE_WAY_MS=()
while read -r name bytes one_way accepted failures; do
  ONE_WAY_MS[$name]="$one_way"
done < <(wan_links)
rtt_of() { awk -v ms="${ONE_WAY_MS[$1]:-}" 'BEGIN { if (ms == "") exit 1; printf "%d", 2 * ms }'; }
# quorum_rtt LEADER REPLICAS: the round trip after which LEADER can first hold a quorum of
# REPLICAS (comma-separated node ids, all voting): with n replicas it needs floor(n/2)
# followers' acknowledgements, so the floor(n/2)-th smallest round trip from it to the others.
quorum_rtt() {
  local leader="$1" peer rtts=()
  for peer in ${2//,/ }; do
    [[ "$peer" == "$leader" ]] && continue
    rtts+=("$(rtt_of "peer-$leader-to-$peer" || fail "the wan has no link peer-$leader-to-$peer")")
  done
  local n=$((${#rtts[@]} + 1))
  ((n > 1)) || { echo 0; return; }
  printf '%s\n' "${rtts[@]}" | sort -n | awk -v k="$((n / 2))" 'NR == k'
}
# commit_floor STATUS: the smallest quorum round trip of any data shard in that `cluster
# status` output, whichever of its replicas leads: no write can commit faster.
commit_floor() {
  local shard leader replicas low high candidate best=""
  while read -r shard leader replicas low high; do
    for candidate in ${replicas//,/ }; do
      local rtt
      rtt="$(quorum_rtt "$candidate" "$replicas")"
      if [[ -z "$best" ]] || ((rtt < best)); then best=$rtt; fi
    done
  done < <(shard_leaders <<<"$1")
  [[ -n "$best" ]] || fail "no data shard in cluster status (parsing?)"
  echo "$best"
}
# The smallest round trip between two regions: a write to a zone-survival shard must beat it.
MIN_CROSS_REGION_RTT="$(for a in "${NODE_IDS[@]}"; do for b in "${NODE_IDS[@]}"; do
  if [[ "${REGION_OF[$a]}" != "${REGION_OF[$b]}" ]]; then
    rtt_of "peer-$a-to-$b" || fail "the wan has no link peer-$a-to-$b"
    echo
  fi
done; done | sort -n | awk 'NR == 1')"
((MIN_CROSS_REGION_RTT > 0)) || fail "the wan's cross-region links add no delay; this test expects the real matrix"
wait_healthy "${SERVICES[@]}"
phase_done "up -d until wan up, ${#SERVICES[@]} nodes healthy"

# The CLI talks to shard leaders at the client addresses they registered (the bridge IPs),
# not through the published ports; say so clearly if the host cannot reach them.
for service in "${SERVICES[@]}"; do
  address="${ADDR_OF[$service]}"
  timeout 5 bash -c ": </dev/tcp/${address%:*}/${address#*:}" 2>/dev/null \
    || fail "the host cannot reach $service at $address (its registered client address); the host CLI needs the compose network to be routable from the host (true for Docker on Linux)"
done
log "waiting for every shard to elect a leader"
wait_cluster "$ALL_ENDPOINTS"
phase_done "every shard has a leader"
MIN_COMMIT_MS="$(commit_floor "$LAST_STATUS")"
log "  smallest quorum round trip of any shard through the wan: $MIN_COMMIT_MS ms (no write may commit faster)"
((MIN_COMMIT_MS > 0)) || fail "a shard can commit without crossing the wan (is every shard spread over the regions?)"

# What nine idle nodes and the wan cost on this machine.
log "containers (docker stats, one sample):"
# shellcheck disable=SC2046 # one container id per word
docker stats --no-stream --format '{{.Name}}  cpu {{.CPUPerc}}  mem {{.MemUsage}}' \
  $("${COMPOSE[@]}" ps -q) 2>&1 | indent || log "  (docker stats failed)"

# ---- 4. 100 keys -------------------------------------------------------------------------------
log "writing $KEYS_BEFORE_KILL keys through the published ports of all ${#SERVICES[@]} nodes"
put_keys "$ALL_ENDPOINTS" 0 "$KEYS_BEFORE_KILL" "$MIN_COMMIT_MS"
phase_done "write $KEYS_BEFORE_KILL keys (one CLI process each)"
log "reading them back"
get_keys "$ALL_ENDPOINTS" 0 "$KEYS_BEFORE_KILL"
phase_done "read $KEYS_BEFORE_KILL keys (one CLI process each)"

# ---- 5. a client in each region, through the wan ------------------------------------------------
# One key per data shard (the first of the 100 in its range): rewrite it with the same value
# (the scan below still expects exactly the values written) and read it, as a client in each
# region in turn, dialling every node through the wan's client-REGION-to-N links. Floors: a get
# pays the client→leader round trip; a put pays that plus the leader's quorum round trip.
# (wait_cluster: every shard has a leader; it leaves the status in LAST_STATUS.)
# shard_picks: waits until every shard has a leader (wait_cluster, which leaves the status in
# LAST_STATUS), then sets PICKS to one line "SHARD LEADER REPLICAS INDEX" per data shard: the
# first of the keys 0..KEYS_BEFORE_KILL-1 inside its range (byte-wise comparison, as the shard
# boundaries are).
shard_picks() {
  wait_cluster "$ALL_ENDPOINTS"
  PICKS="$(LC_ALL=C awk '
    FILENAME == ARGV[1] { n++; id[n] = $1; leader[n] = $2; replicas[n] = $3; low[n] = $4; high[n] = $5; next }
    {
      for (j = 1; j <= n; j++)
        if (!(j in chosen) && (low[j] == "-inf" || $2 >= low[j]) && (high[j] == "+inf" || $2 < high[j]))
          chosen[j] = $1
    }
    END { for (j = 1; j <= n; j++) if (j in chosen) print id[j], leader[j], replicas[j], chosen[j] }
  ' <(shard_leaders <<<"$LAST_STATUS") \
    <(for ((i = 0; i < KEYS_BEFORE_KILL; i++)); do printf '%d %s\n' "$i" "$(key_for "$i")"; done))"
}
shard_picks
ZONE_KEY_INDEX=""
while read -r shard leader replicas index; do
  if [[ "$shard" == "$ZONE_SHARD" ]]; then ZONE_KEY_INDEX=$index; fi
done <<<"$PICKS"
[[ -n "$ZONE_KEY_INDEX" ]] || fail "none of the $KEYS_BEFORE_KILL keys is in shard $ZONE_SHARD"
# Client links the clients used (each seed's and every leader's): step 11 checks them.
declare -A CLIENT_LINKS_USED=()
for client_region in "${REGIONS[@]}"; do
  # Leaders as of now (one may have moved while the previous region's client ran).
  shard_picks
  log "as a client in $client_region (--dial ${DIAL_IN[$client_region]}): one key per shard"
  CLIENT_LINKS_USED[client-$client_region-to-${NODE_OF[$client_region-1]}]=1
  printf -v line '  %-5s %-16s %-22s %8s %9s %8s %9s' SHARD LEADER KEY "PUT ms" "floor" "GET ms" "floor"
  log "$line"
  checked=0
  while read -r shard leader replicas index; do
    [[ "$leader" =~ ^[0-9]+$ ]] || fail "shard $shard has no leader"
    key="$(key_for "$index")"
    link="client-$client_region-to-$leader"
    client_rtt="$(rtt_of "$link")" || fail "the wan has no link $link"
    quorum="$(quorum_rtt "$leader" "$replicas")"
    put_floor=$((client_rtt + quorum))
    get_floor=$client_rtt
    started="$(now_ms)"
    out="$(cli_in "$client_region" kv put --timeout-ms "$CLI_TIMEOUT_MS" "$key" "$(value_for "$index")" 2>&1 </dev/null)" \
      || fail "put $key through the wan from $client_region failed: $out"
    put_ms=$(($(now_ms) - started))
    started="$(now_ms)"
    got="$(cli_in "$client_region" kv get --timeout-ms "$CLI_TIMEOUT_MS" "$key" 2>&1 </dev/null)" \
      || fail "get $key through the wan from $client_region failed: $got"
    get_ms=$(($(now_ms) - started))
    [[ "$got" == "$(value_for "$index")" ]] || fail "get $key through the wan from $client_region returned \"$got\""
    printf -v line '  %-5s %-16s %-22s %8d %9s %8d %9s' "$shard" "$leader ${REGION_OF[$leader]}" "$key" "$put_ms" ">= $put_floor" "$get_ms" ">= $get_floor"
    log "$line"
    # The floors hold for the leader the status named; if another led meanwhile (an election,
    # or the leader-follow loop), they say nothing, so the shard is not judged.
    status_now="$(cli "$ALL_ENDPOINTS" cluster status --timeout-ms 5000 2>&1 </dev/null)" || status_now=""
    now_leader="$(shard_leaders <<<"$status_now" | awk -v s="$shard" '$1 == s { print $2 }')"
    if [[ "$now_leader" != "$leader" ]]; then
      log "  shard $shard: node ${now_leader:-none} leads now, not $leader: its floors are not checked"
      continue
    fi
    # Only now is it sure the client used this link (step 11 checks it carried bytes).
    CLIENT_LINKS_USED[$link]=1
    ((put_ms >= put_floor)) || fail "put $key from $client_region (shard $shard, leader $leader) took $put_ms ms, below its floor of $put_floor ms through the wan"
    ((get_ms >= get_floor)) || fail "get $key from $client_region (shard $shard, leader $leader) took $get_ms ms, below its floor of $get_floor ms through the wan"
    checked=$((checked + 1))
  done <<<"$PICKS"
  ((checked > 0)) || fail "no data shard holds any of the $KEYS_BEFORE_KILL keys (status parsing?)"
  log "  $checked shards: every put and get from $client_region at or above its floor"
done
phase_done "a client in each region through the wan (${#REGIONS[@]} x $(wc -l <<<"$PICKS") shards)"

# ---- 6. kill a node, write with the others -----------------------------------------------------
victim="${MERIDIAN_CI_KILL:-}"
if [[ -z "$victim" ]]; then
  # The eu-west node leading the most shards (the lowest id on a tie), so the writes below
  # need new leaders to be elected, and every shard it holds is left with one replica in
  # us-east and one in ap-south, the farthest pair (200 ms): a leader there must still
  # renew its lease and commit (with heartbeats that time out before an answer can come
  # back, it refused every write; see raft.heartbeat_interval_ms).
  leader_id="$(shard_rows <<<"$LAST_STATUS" | awk -v ids="${NODE_IDS[*]}" -v regions="$(for id in "${NODE_IDS[@]}"; do printf '%s ' "${REGION_OF[$id]}"; done)" '
    BEGIN { n = split(ids, id_list, " "); split(regions, region_list, " ") }
    $1 != "answered" && $2 != "none" { led[$2]++ }
    END {
      best = -1
      for (i = 1; i <= n; i++)
        if (region_list[i] == "eu-west" && led[id_list[i]] + 0 > best) { best = led[id_list[i]] + 0; top = id_list[i] }
      print top
    }
  ')"
  victim="${SERVICE_OF[$leader_id]:-eu-west-1}"
fi
victim_id="$(container_of "$victim")"
survivors=()
for service in "${SERVICES[@]}"; do
  [[ "$service" == "$victim" ]] || survivors+=("$service")
done
SURVIVOR_ENDPOINTS="$(endpoints_of "${survivors[@]}")"
log "cluster status before the kill:"
indent <<<"$LAST_STATUS"
log "docker kill $victim (node ${NODE_OF[$victim]}; SIGKILL, no graceful shutdown)"
docker kill "$victim_id" >/dev/null
sleep 1
state="$(container_state "$victim")"
[[ "$state" == exited/* ]] || fail "$victim should stay down after docker kill, but is $state"
phase_done "kill $victim"

log "writing $KEYS_DURING_OUTAGE more keys with $victim down (every shard keeps two of its three replicas)"
log "  (the first write to each shard $victim led waits for a new leader: election timeout 1.5-3 s)"
put_keys "$ALL_ENDPOINTS" "$KEYS_BEFORE_KILL" "$KEYS_DURING_OUTAGE" "$MIN_COMMIT_MS"
phase_done "write $KEYS_DURING_OUTAGE keys with 1 node down"
get_keys "$SURVIVOR_ENDPOINTS" "$KEYS_BEFORE_KILL" "$KEYS_DURING_OUTAGE"
# A peer being down must not make the others unhealthy: their check is about themselves.
for service in "${survivors[@]}"; do
  state="$(container_state "$service")"
  streak="$(docker inspect -f '{{.State.Health.FailingStreak}}' "$(container_of "$service")")"
  [[ "$state" == running/healthy && "$streak" == 0 ]] \
    || fail "$service is $state with $streak failed health checks in a row while $victim is down"
done
log "  the other ${#survivors[@]} nodes stayed healthy (their latest health checks passed)"
phase_done "read them back from the survivors"

# ---- 7. restart it, wait until it has caught up ------------------------------------------------
log "docker start $victim"
docker start "$victim_id" >/dev/null
wait_healthy "$victim"
phase_done "restart until $victim healthy"
log "waiting until the leaders report node ${NODE_OF[$victim]} ($victim) fully replicated"
wait_cluster "$ALL_ENDPOINTS" "${NODE_OF[$victim]}"
phase_done "restart until caught up (lag 0)"
log "cluster status after recovery:"
indent <<<"$LAST_STATUS"

VICTIM_ENDPOINT="127.0.0.1:${PORT_OF[$victim]}"
log "reading the keys written during the outage with $victim ($VICTIM_ENDPOINT) as the only seed"
get_keys "$VICTIM_ENDPOINT" "$KEYS_BEFORE_KILL" "$KEYS_DURING_OUTAGE"
phase_done "reads through the restarted node"

# ---- 8. zone survival: shard 1's votes move into us-east ---------------------------------------
log "meridian cluster placement $ZONE_SHARD --home $ZONE_HOME --survive zone"
out="$(cli "$ALL_ENDPOINTS" cluster placement "$ZONE_SHARD" --home "$ZONE_HOME" --survive zone \
  --timeout-ms 180000 2>&1)" || fail "placement failed: $out"
indent <<<"$out"
# Settled when every replica outside us-east is a learner and nothing else is moving: the
# MOVES cell lists exactly those (e.g. "5 learner, 6 learner"), with three replicas in us-east.
deadline=$((SECONDS + WAIT_S))
previous=""
while true; do
  status_out="$(cli "$ALL_ENDPOINTS" cluster status --timeout-ms 5000 2>&1)" || status_out=""
  replicas="$(shard_leaders <<<"$status_out" | awk -v s="$ZONE_SHARD" '$1 == s { print $3 }')"
  moves="$(shard_cell "$ZONE_SHARD" MOVES <<<"$status_out")"
  home="$(shard_cell "$ZONE_SHARD" HOME <<<"$status_out")"
  want="" at_home=0
  # (MOVES lists nodes in id order.)
  for node in $(tr ',' '\n' <<<"$replicas" | sort -n); do
    if [[ "${REGION_OF[$node]}" == "$ZONE_HOME" ]]; then
      at_home=$((at_home + 1))
    else
      want+="${want:+, }$node learner"
    fi
  done
  seen="replicas [$replicas], home $home, moves $moves"
  [[ "$seen" != "$previous" ]] && log "  shard $ZONE_SHARD: $seen"
  previous=$seen
  if [[ "$home" == "$ZONE_HOME (zone)" && -n "$want" && "$moves" == "$want" ]] && ((at_home == 3)); then
    break
  fi
  ((SECONDS < deadline)) || fail "shard $ZONE_SHARD did not settle to three voters in $ZONE_HOME within ${WAIT_S} s: $seen"
  sleep 1
done
LAST_STATUS="$status_out"
phase_done "zone survival for shard $ZONE_SHARD settled"

zone_key="$(key_for "$ZONE_KEY_INDEX")"
zone_leader="$(shard_leaders <<<"$LAST_STATUS" | awk -v s="$ZONE_SHARD" '$1 == s { print $2 }')"
[[ "${REGION_OF[$zone_leader]:-}" == "$ZONE_HOME" ]] \
  || fail "shard $ZONE_SHARD is led by node $zone_leader, not from $ZONE_HOME"
CLIENT_LINKS_USED[client-us-east-to-$zone_leader]=1
log "as a client in us-east: $ZONE_WRITES writes of $zone_key (shard $ZONE_SHARD, leader node $zone_leader)"
took_all=()
for ((n = 0; n < ZONE_WRITES; n++)); do
  started="$(now_ms)"
  out="$(cli_in us-east kv put --timeout-ms "$CLI_TIMEOUT_MS" "$zone_key" "$(value_for "$ZONE_KEY_INDEX")" 2>&1 </dev/null)" \
    || fail "put $zone_key through the wan failed: $out"
  took_all+=("$(($(now_ms) - started))")
done
sorted="$(printf '%s\n' "${took_all[@]}" | sort -n)"
fastest="$(head -n1 <<<"$sorted")"
median="$(awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }' <<<"$sorted")"
log "  writes: fastest $fastest ms, median $median ms, slowest $(tail -n1 <<<"$sorted") ms (the smallest cross-region round trip is $MIN_CROSS_REGION_RTT ms)"
((fastest < MIN_CROSS_REGION_RTT)) \
  || fail "no write to the zone-survival shard beat the smallest cross-region round trip ($MIN_CROSS_REGION_RTT ms): its commits still cross a region"
got="$(cli_in us-east kv get --timeout-ms "$CLI_TIMEOUT_MS" "$zone_key" 2>&1 </dev/null)" || fail "get $zone_key failed: $got"
[[ "$got" == "$(value_for "$ZONE_KEY_INDEX")" ]] || fail "get $zone_key returned \"$got\""
phase_done "$ZONE_WRITES writes to the zone-survival shard"

# ---- 9. lose a whole region --------------------------------------------------------------------
lost=()
kept=()
for service in "${SERVICES[@]}"; do
  if [[ "${REGION_OF[${NODE_OF[$service]}]}" == "$LOST_REGION" ]]; then lost+=("$service"); else kept+=("$service"); fi
done
KEPT_ENDPOINTS="$(endpoints_of "${kept[@]}")"
log "docker kill ${lost[*]} (all of $LOST_REGION; SIGKILL)"
lost_ids=()
for service in "${lost[@]}"; do lost_ids+=("$(container_of "$service")"); done
docker kill "${lost_ids[@]}" >/dev/null
sleep 1
for service in "${lost[@]}"; do
  state="$(container_state "$service")"
  [[ "$state" == exited/* ]] || fail "$service should stay down after docker kill, but is $state"
done
phase_done "kill $LOST_REGION (${#lost[@]} nodes)"
first=$((KEYS_BEFORE_KILL + KEYS_DURING_OUTAGE))
log "writing $KEYS_DURING_REGION_OUTAGE keys with $LOST_REGION down (no floor: shard $ZONE_SHARD commits inside $ZONE_HOME)"
put_keys "$KEPT_ENDPOINTS" "$first" "$KEYS_DURING_REGION_OUTAGE" 0
get_keys "$KEPT_ENDPOINTS" "$first" "$KEYS_DURING_REGION_OUTAGE"
phase_done "write+read $KEYS_DURING_REGION_OUTAGE keys without $LOST_REGION"

log "docker start ${lost[*]}"
docker start "${lost_ids[@]}" >/dev/null
wait_healthy "${lost[@]}"
for service in "${lost[@]}"; do
  log "waiting until the leaders report node ${NODE_OF[$service]} ($service) fully replicated"
  wait_cluster "$ALL_ENDPOINTS" "${NODE_OF[$service]}"
done
phase_done "restart $LOST_REGION until caught up"
# Leaders follow their home regions (--home-regions): after the region is back, every shard
# homed there is led from there again (the placement loop's leader transfers).
log "waiting until every shard with a home region is led from it"
deadline=$((SECONDS + WAIT_S))
previous=""
while true; do
  status_out="$(cli "$ALL_ENDPOINTS" cluster status --timeout-ms 5000 2>&1)" || status_out=""
  away=""
  homed=0
  while read -r shard leader replicas low high; do
    home="$(shard_cell "$shard" HOME <<<"$status_out")"
    home="${home% (zone)}"
    [[ "$home" == "-" || -z "$home" ]] && continue
    homed=$((homed + 1))
    [[ "${REGION_OF[$leader]:-none}" == "$home" ]] || away+="${away:+, }shard $shard led by $leader (home $home)"
  done < <(shard_leaders <<<"$status_out")
  # Every data shard has a home (MERIDIAN_HOME_REGIONS covers the whole key space).
  ((homed > 0)) || away="no shard has a home region${away:+; $away}"
  [[ -n "$status_out" && -z "$away" ]] && break
  [[ "$away" != "$previous" ]] && log "  not yet: ${away:-no status}"
  previous=$away
  ((SECONDS < deadline)) || fail "leaders did not return home within ${WAIT_S} s: $away"
  sleep 1
done
LAST_STATUS="$status_out"
log "cluster status after $LOST_REGION's return:"
indent <<<"$LAST_STATUS"
phase_done "every leader back in its home region"

# ---- 10. the whole keyspace through a restarted node -------------------------------------------
LOST_ENDPOINT="127.0.0.1:${PORT_OF[${lost[0]}]}"
total=$((KEYS_BEFORE_KILL + KEYS_DURING_OUTAGE + KEYS_DURING_REGION_OUTAGE))
log "scanning the whole keyspace through ${lost[0]} ($LOST_ENDPOINT): expecting exactly the $total keys"
expected="$(for ((i = 0; i < total; i++)); do printf '%s\t%s\n' "$(key_for "$i")" "$(value_for "$i")"; done | LC_ALL=C sort)"
scanned="$(cli "$LOST_ENDPOINT" kv scan --timeout-ms "$CLI_TIMEOUT_MS" --limit 10000 | LC_ALL=C sort)" \
  || fail "scan through $LOST_ENDPOINT failed"
if [[ "$scanned" != "$expected" ]]; then
  diff <(printf '%s\n' "$expected") <(printf '%s\n' "$scanned") | head -n 20 >&2 || true
  fail "the scan does not match the $total keys written (diff above: < expected, > scanned)"
fi
log "  scan returned exactly the $total keys with their values"
phase_done "scan through a restarted $LOST_REGION node"

# ---- 11. the wan carried the peer traffic ------------------------------------------------------
log "the wan's links (control \`status\`):"
links="$(wan_links)" || fail "the wan's control port did not answer status"
printf -v line '  %-22s %8s %10s %9s %9s' LINK "ONE-WAY" "BYTES" ACCEPTED "CONN-FAIL"
log "$line"
idle=()
while read -r name bytes one_way accepted failures; do
  printf -v line '  %-22s %5s ms %10s %9s %9s' "$name" "$one_way" "$bytes" "$accepted" "$failures"
  log "$line"
  if [[ "$name" == peer-* || -n "${CLIENT_LINKS_USED[$name]:-}" ]] && ! ((${bytes:-0} > 0)); then
    idle+=("$name")
  fi
done <<<"$links"
((${#idle[@]} == 0)) || fail "no bytes crossed these wan links: ${idle[*]} (are the nodes dialling their peers through the wan?)"
log "  every peer link and the ${#CLIENT_LINKS_USED[@]} client links the clients used forwarded bytes"
phase_done "wan status: bytes on every link"

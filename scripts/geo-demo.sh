#!/usr/bin/env bash
# Meridian across three emulated regions: what a geo-distributed client actually waits for.
#
#   scripts/geo-demo.sh [--ops N] [--base-port P] [--scale F] [--shards S] [--home RULES] [--keep]
#
# Starts `meridian-wan` with the default latency matrix scaled by F (us-east↔eu-west 80 ms,
# eu-west↔ap-south 130 ms, us-east↔ap-south 200 ms round trips at F=1): one link per ordered node
# pair and one per (client region, node). Starts three nodes, one per region, each dialling its
# peers through its links (`--peer-dial`). Then, from a client in each region (`--dial` maps
# every node to that region's link), runs N `meridian kv put` and N linearizable `meridian kv
# get` calls spread over the shards, and prints p50/p99 per client region and operation, split by
# the region leading the key's shard.
#
# Every number is the wall time of one `meridian kv` process: process start, connect (shard map
# from the client's own-region node, through a 0 ms link), then the operation. The get rows whose
# shard is led in the client's own region show that fixed cost (a leader-lease read pays no
# round trip). --home passes RULES to every node as --home-regions (e.g. "=eu-west": every shard
# led from eu-west once the leader-follow loop has moved it; the run waits for that). Ports P+1..3 (client API), P+101..103 (Raft), P+200..205 (peer links),
# P+220..228 (client links), P+299 (control). Everything is stopped by PID on exit.
source "$(dirname "$0")/common.sh"

OPS=20
BASE=28000
SCALE=1
SHARDS=6
KEEP=0
HOME_RULES=""
usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case "$1" in
    --ops) OPS="${2:?--ops needs a value}"; shift 2 ;;
    --base-port) BASE="${2:?--base-port needs a value}"; shift 2 ;;
    --scale) SCALE="${2:?--scale needs a value}"; shift 2 ;;
    --shards) SHARDS="${2:?--shards needs a value}"; shift 2 ;;
    --home) HOME_RULES="${2:?--home needs rules, e.g. =eu-west}"; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$OPS" =~ ^[0-9]+$ ]] && ((OPS >= 1 && OPS <= 10000)) || { echo "error: --ops must be in 1..=10000" >&2; exit 2; }
[[ "$SHARDS" =~ ^[0-9]+$ ]] && ((SHARDS >= 1 && SHARDS <= 64)) || { echo "error: --shards must be in 1..=64" >&2; exit 2; }
[[ "$BASE" =~ ^[0-9]+$ ]] && ((BASE >= 1024 && BASE + 299 <= 65535)) || { echo "error: --base-port must leave room for P+299" >&2; exit 2; }
awk -v f="$SCALE" 'BEGIN { exit !(f ~ /^[0-9]*\.?[0-9]+$/ && f > 0 && f <= 50) }' \
  || { echo "error: --scale must be a number in (0, 50]" >&2; exit 2; }

ensure_build_deps
say "building meridian and meridian-wan (release)"
cargo build --release --locked -p meridian-cli -p meridian-wan --manifest-path "$ROOT/Cargo.toml"
BIN="$CARGO_TARGET_DIR/release"

REGIONS=(us-east eu-west ap-south)            # node i is in REGIONS[i-1]
READY_TIMEOUT_S=90
STOP_TIMEOUT_S=10
CONTROL="127.0.0.1:$((BASE + 299))"
DIR="$(mktemp -d /tmp/meridian-geo.XXXXXX)"
PIDS=()

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  ((${#PIDS[@]})) && say "stopping ${#PIDS[@]} processes"
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  local deadline=$((SECONDS + STOP_TIMEOUT_S))
  for pid in "${PIDS[@]}"; do
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if ((KEEP)); then echo "logs and data kept in $DIR" >&2; else rm -rf "$DIR"; fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

rtt() { awk -v r="$1" -v f="$SCALE" 'BEGIN { printf "%d", r * f + 0.5 }'; }
RTT_UE=$(rtt 80); RTT_EA=$(rtt 130); RTT_UA=$(rtt 200)

# 1. The WAN: a topology file for meridian-wan, which plans the links and the dial maps.
cat >"$DIR/wan.toml" <<EOF
listen_host = "127.0.0.1"
peer_base_port = $((BASE + 200))
client_base_port = $((BASE + 220))
client_regions = ["us-east", "eu-west", "ap-south"]

[matrix]
same_region_rtt_ms = 0
rtt = [
  { a = "us-east", b = "eu-west", rtt_ms = $RTT_UE },
  { a = "eu-west", b = "ap-south", rtt_ms = $RTT_EA },
  { a = "us-east", b = "ap-south", rtt_ms = $RTT_UA },
]
EOF
for i in 1 2 3; do
  cat >>"$DIR/wan.toml" <<EOF

[[node]]
id = $i
region = "${REGIONS[i-1]}"
peer_addr = "127.0.0.1:$((BASE + 100 + i))"
client_addr = "127.0.0.1:$((BASE + i))"
EOF
done
"$BIN/meridian-wan" --config "$DIR/wan.toml" --print-dial-map >"$DIR/dial-maps"
declare -A PEER_DIAL CLIENT_DIAL
while read -r kind who map; do
  if [[ "$kind" == node ]]; then
    PEER_DIAL[$who]="$map"
  else
    # id=link → advertised-client-address=link, the form `meridian --dial` takes.
    CLIENT_DIAL[$who]="$(tr ',' '\n' <<<"$map" \
      | awk -F= -v base="$BASE" '{ printf "%s127.0.0.1:%d=%s", (NR > 1 ? "," : ""), base + $1, $2 }')"
  fi
done <"$DIR/dial-maps"

say "starting meridian-wan: round trips us-east↔eu-west ${RTT_UE} ms, eu-west↔ap-south ${RTT_EA} ms, us-east↔ap-south ${RTT_UA} ms"
"$BIN/meridian-wan" --config "$DIR/wan.toml" --control "$CONTROL" >"$DIR/wan.out" 2>"$DIR/wan.log" &
PIDS+=($!)
deadline=$((SECONDS + 15))
until grep -qx ready "$DIR/wan.out"; do
  kill -0 "${PIDS[-1]}" 2>/dev/null || { echo "error: meridian-wan exited:" >&2; tail -5 "$DIR/wan.log" >&2; exit 1; }
  ((SECONDS < deadline)) || { echo "error: meridian-wan not ready after 15 s" >&2; exit 1; }
  sleep 0.1
done
echo "  $(grep -c '^link ' "$DIR/wan.out") links up, control at $CONTROL" >&2

# control CMD: one line to meridian-wan's control port, one answer line back (bounded).
control() {
  local reply
  exec {fd}<>"/dev/tcp/${CONTROL%:*}/${CONTROL##*:}"
  printf '%s\n' "$1" >&"$fd"
  read -r -t 5 reply <&"$fd" || reply="error no answer"
  exec {fd}>&-
  printf '%s\n' "$reply"
}

# 2. Three nodes, one per region, each reaching its peers through its own links. Raft timings
#    are the server's WAN-sized defaults up to the scale where the longest round trip (200 ms
#    x SCALE) nears the heartbeat interval, which openraft also uses as each heartbeat's
#    timeout; from there, heartbeats of 1.5x that round trip and elections 3x to 6x them.
read -r HEARTBEAT_MS ELECTION_MIN_MS < <(awk -v f="$SCALE" 'BEGIN {
  hb = int(1.5 * 200 * f + 0.999); if (hb < 400) hb = 400
  em = 3 * hb; if (em < 1500) em = 1500
  print hb, em }')
IC="1=127.0.0.1:$((BASE + 101))@us-east/a,2=127.0.0.1:$((BASE + 102))@eu-west/a,3=127.0.0.1:$((BASE + 103))@ap-south/a"
for i in 1 2 3; do
  "$BIN/meridian" start --node-id "$i" --region "${REGIONS[i-1]}" --zone a \
    --client-addr "127.0.0.1:$((BASE + i))" --peer-addr "127.0.0.1:$((BASE + 100 + i))" \
    --data-dir "$DIR/node$i" --initial-cluster "$IC" --initial-shards "$SHARDS" \
    --heartbeat-interval-ms "$HEARTBEAT_MS" --election-timeout-min-ms "$ELECTION_MIN_MS" \
    --peer-dial "${PEER_DIAL[$i]}" ${HOME_RULES:+--home-regions "$HOME_RULES"} >"$DIR/node$i.log" 2>&1 &
  PIDS+=($!)
  echo "  node $i (${REGIONS[i-1]}) pid $! dials peers via ${PEER_DIAL[$i]}" >&2
done

# cluster_status: the status table, asked of the nodes directly (not through the WAN).
ENDPOINTS_DIRECT="127.0.0.1:$((BASE + 1)),127.0.0.1:$((BASE + 2)),127.0.0.1:$((BASE + 3))"
cluster_status() {
  timeout 15 "$BIN/meridian" cluster status --endpoints "$ENDPOINTS_DIRECT" --timeout-ms 5000 2>/dev/null
}
# shard_rows STATUS: `shard_id start_key leader_id` per data shard ("-" for an open start).
shard_rows() {
  awk '/^SHARDS/ { s = 1; next }
       s && NF == 0 { s = 0 }
       s && $1 ~ /^[0-9]+$/ && $1 != "0" {
         line = $0
         start = "-"
         if (match(line, /\["[^"]*",/)) start = substr(line, RSTART + 2, RLENGTH - 4)
         sub(/\[[^)]*\)/, "", line)
         split(line, f, " ")
         print f[1], start, f[3] }' <<<"$1"
}

say "waiting for every shard to elect a leader (at most ${READY_TIMEOUT_S} s)"
deadline=$((SECONDS + READY_TIMEOUT_S))
while :; do
  for pid in "${PIDS[@]}"; do
    kill -0 "$pid" 2>/dev/null || { echo "error: process $pid exited; logs in $DIR" >&2; KEEP=1; exit 1; }
  done
  STATUS="$(cluster_status || true)"
  rows="$(shard_rows "$STATUS")"
  if [[ -n "$rows" ]] && (($(wc -l <<<"$rows") == SHARDS)) && ! awk '$3 == "none" || $3 == "0" { bad = 1 } END { exit !bad }' <<<"$rows" \
     && grep -q "(3 of 3 nodes answered)" <<<"$STATUS"; then
    break
  fi
  ((SECONDS < deadline)) || { echo "error: cluster not ready after ${READY_TIMEOUT_S} s; logs in $DIR" >&2; KEEP=1; exit 1; }
  sleep 0.5
done
echo "  ready after $SECONDS s" >&2

# With home regions, measure only once every homed shard is led from its home (the HOME
# column, last in the table).
if [[ -n "$HOME_RULES" ]]; then
  say "waiting for leaders to move to their home regions (at most 60 s)"
  deadline=$((SECONDS + 60))
  until awk -v regions="${REGIONS[*]}" '
      BEGIN { split(regions, R, " ") }
      /^SHARDS/ { s = 1; next }
      s && NF == 0 { s = 0 }
      s && $1 ~ /^[0-9]+$/ && $1 != "0" {
        home = $NF; line = $0; sub(/\[[^)]*\)/, "", line); split(line, f, " ")
        if (home != "-" && R[f[3]] != home) bad = 1 }
      END { exit bad }' <<<"$STATUS"; do
    ((SECONDS < deadline)) || { echo "error: leaders not in their home regions after 60 s; logs in $DIR" >&2; KEEP=1; exit 1; }
    sleep 1
    STATUS="$(cluster_status || true)"
  done
  rows="$(shard_rows "$STATUS")"
  echo "  leaders home after $SECONDS s" >&2
fi

# One key per data shard: its start key plus a suffix (the open-start shard gets "!geo").
mapfile -t SHARD_IDS < <(awk '{ print $1 }' <<<"$rows")
mapfile -t KEYS < <(awk '{ print ($2 == "-" ? "!geo" : $2 "-geo") }' <<<"$rows")
leader_region() { # SHARD_ID → region of its leader, from the latest status
  local leader
  leader="$(awk -v s="$1" '$1 == s { print $3 }' <<<"$(shard_rows "$STATUS")")"
  [[ "$leader" =~ ^[1-3]$ ]] && echo "${REGIONS[leader-1]}" || echo "?"
}
print_leaders() {
  local line=""
  for sid in "${SHARD_IDS[@]}"; do line+="  shard $sid → $(leader_region "$sid")"; done
  echo "leaders:$line"
}
LEADERS_BEFORE="$(print_leaders)"
echo "$LEADERS_BEFORE" >&2

# 3. From each region: N puts, then N linearizable gets, round-robin over the shards' keys.
now_us() { local t; t=$(date +%s%N); echo $((t / 1000)); }
SAMPLES="$DIR/samples"   # region op leader_region ms
: >"$SAMPLES"
for i in 1 2 3; do
  region="${REGIONS[i-1]}"
  # The region's own node first: the shard map comes over a 0 ms link.
  endpoints="127.0.0.1:$((BASE + i))"
  for j in 1 2 3; do ((j != i)) && endpoints+=",127.0.0.1:$((BASE + j))"; done
  for op in put get; do
    say "client in $region: $OPS × kv $op"
    for ((n = 0; n < OPS; n++)); do
      k=$((n % ${#KEYS[@]}))
      args=(kv --timeout-ms 10000 "$op" -- "${KEYS[k]}")
      [[ "$op" == put ]] && args+=("from-$region-$n")
      t0=$(now_us)
      if ! out="$(MERIDIAN_ENDPOINTS="$endpoints" MERIDIAN_DIAL="${CLIENT_DIAL[$region]}" \
                 timeout 30 "$BIN/meridian" "${args[@]}" 2>&1)"; then
        echo "error: kv $op ${KEYS[k]} from $region failed: $out" >&2
        exit 1
      fi
      t1=$(now_us)
      echo "$region $op $(leader_region "${SHARD_IDS[k]}") $(((t1 - t0) / 1000)).$(printf '%03d' $(((t1 - t0) % 1000)))" >>"$SAMPLES"
    done
  done
done

STATUS="$(cluster_status || true)"
LEADERS_AFTER="$(print_leaders)"
[[ "$LEADERS_AFTER" == "$LEADERS_BEFORE" ]] \
  || echo "note: leadership moved during the run; rows are labelled with the leader seen before it" >&2

# 4. The report: p50/p99 (nearest rank) per client region × operation, overall and per leader
#    region, with the emulated round trip the operation cannot beat.
rtt_between() {
  [[ "$1" == "$2" ]] && { echo 0; return; }
  case "$(printf '%s\n' "$1" "$2" | sort | tr '\n' ' ')" in
    "eu-west us-east ") echo "$RTT_UE" ;;
    "ap-south eu-west ") echo "$RTT_EA" ;;
    "ap-south us-east ") echo "$RTT_UA" ;;
    *) echo "?" ;;
  esac
}
quorum_rtt() { # the leader's nearest other region decides a 3-replica quorum
  local best=""
  for r in "${REGIONS[@]}"; do
    [[ "$r" == "$1" ]] && continue
    local v; v=$(rtt_between "$1" "$r")
    [[ -z "$best" || "$v" -lt "$best" ]] && best=$v
  done
  echo "$best"
}
percentiles() { # stdin: ms values → "n p50 p99"
  sort -n | awk '{ v[NR] = $1 } END {
    if (NR == 0) { print 0, "-", "-"; exit }
    p50 = int((NR * 50 + 99) / 100); p99 = int((NR * 99 + 99) / 100)
    printf "%d %.1f %.1f\n", NR, v[p50], v[p99] }'
}
{
  echo
  echo "Meridian over emulated WAN ($(date -u +%Y-%m-%dT%H:%MZ), scale $SCALE, $SHARDS shards, $OPS ops per region and operation)"
  echo "round trips: us-east↔eu-west ${RTT_UE} ms, eu-west↔ap-south ${RTT_EA} ms, us-east↔ap-south ${RTT_UA} ms"
  echo "$LEADERS_BEFORE"
  echo "each sample = wall time of one \`meridian kv\` process (start + connect + operation)"
  echo
  printf '%-9s %-4s %-13s %4s %9s %9s %14s\n' CLIENT OP "SHARD LEADER" N "P50 ms" "P99 ms" "FLOOR ms"
  for region in "${REGIONS[@]}"; do
    for op in put get; do
      read -r n p50 p99 < <(awk -v r="$region" -v o="$op" '$1 == r && $2 == o { print $4 }' "$SAMPLES" | percentiles)
      printf '%-9s %-4s %-13s %4s %9s %9s %14s\n' "$region" "$op" "(all)" "$n" "$p50" "$p99" ""
      for leader in "${REGIONS[@]}"; do
        read -r n p50 p99 < <(awk -v r="$region" -v o="$op" -v l="$leader" '$1 == r && $2 == o && $3 == l { print $4 }' "$SAMPLES" | percentiles)
        ((n > 0)) || continue
        floor=$(rtt_between "$region" "$leader")
        [[ "$op" == put ]] && floor="$floor+$(quorum_rtt "$leader")"
        printf '%-9s %-4s %-13s %4s %9s %9s %14s\n' "" "" "$leader" "$n" "$p50" "$p99" "$floor"
      done
    done
  done
  echo
  echo "FLOOR = emulated round trips the operation cannot beat: client→leader, plus for a put the"
  echo "leader's round trip to its nearest follower (a quorum of 3 needs one follower)."
  echo "Bytes that crossed the links (meridian-wan control 'status'):"
  control status | sed 's/^ok //' | tr ';' '\n' \
    | awk '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
             if (f["name"] != "") printf "  %-22s %6s ms one way  %10s bytes\n", f["name"], f["one_way_ms"], f["forwarded_bytes"] }'
}

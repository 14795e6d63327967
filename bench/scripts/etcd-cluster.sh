#!/usr/bin/env bash
# Start or stop a 3-member etcd cluster on loopback for benchmarking.
#
#   bench/scripts/etcd-cluster.sh start DIR   # data, logs and pid files under DIR
#   bench/scripts/etcd-cluster.sh stop DIR    # stops only the members whose pid files are in DIR
#   bench/scripts/etcd-cluster.sh status DIR
#
# Members m1..m3 listen for clients on 127.0.0.1:23791-23793 and for peers on
# 127.0.0.1:23801-23803. Durability is etcd's default: the WAL is fsynced before a write is
# acknowledged. `start` waits until every member reports healthy, at most
# ETCD_CLUSTER_START_TIMEOUT_S seconds (default 30), and stops what it started if they do not.
# `stop` sends SIGTERM to each recorded pid that is still an etcd serving this DIR, waits up to
# ETCD_CLUSTER_STOP_TIMEOUT_S seconds (default 10), then SIGKILL.
#
# Client endpoints for meridian-ycsb:
#   --endpoints http://127.0.0.1:23791,http://127.0.0.1:23792,http://127.0.0.1:23793
set -euo pipefail

MEMBERS=(m1 m2 m3)
CLIENT_PORTS=(23791 23792 23793)
PEER_PORTS=(23801 23802 23803)
START_TIMEOUT_S="${ETCD_CLUSTER_START_TIMEOUT_S:-30}"
STOP_TIMEOUT_S="${ETCD_CLUSTER_STOP_TIMEOUT_S:-10}"
ETCD_BIN="${ETCD_BIN:-etcd}"
ETCDCTL_BIN="${ETCDCTL_BIN:-etcdctl}"

usage() {
    echo "usage: $0 start|stop|status DIR" >&2
    exit 2
}

endpoints() {
    local list=()
    for port in "${CLIENT_PORTS[@]}"; do list+=("http://127.0.0.1:${port}"); done
    (IFS=,; echo "${list[*]}")
}

initial_cluster() {
    local list=()
    for i in "${!MEMBERS[@]}"; do list+=("${MEMBERS[$i]}=http://127.0.0.1:${PEER_PORTS[$i]}"); done
    (IFS=,; echo "${list[*]}")
}

# Prints the pid recorded for member $2 in dir $1 if that process is still an etcd started with
# this member's data dir; prints nothing otherwise (stale pid file, pid reused by another process).
live_pid() {
    local dir="$1" member="$2" pid_file="$1/$2.pid" pid cmdline
    [[ -f "$pid_file" ]] || return 0
    pid="$(cat "$pid_file")"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 0
    [[ -r "/proc/$pid/cmdline" ]] || return 0
    cmdline="$(tr '\0' ' ' < "/proc/$pid/cmdline")"
    if [[ "$cmdline" == *etcd* && "$cmdline" == *"--data-dir $dir/$member.etcd"* ]]; then
        echo "$pid"
    fi
}

healthy() {
    ETCDCTL_API=3 "$ETCDCTL_BIN" --endpoints "$(endpoints)" --command-timeout=2s \
        endpoint health >/dev/null 2>&1
}

stop_cluster() {
    local dir="$1" pids=()
    for member in "${MEMBERS[@]}"; do
        local pid
        pid="$(live_pid "$dir" "$member")"
        if [[ -n "$pid" ]]; then
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$pid")
        fi
    done
    local waited=0
    while (( waited < STOP_TIMEOUT_S * 10 )); do
        local alive=0
        for pid in "${pids[@]}"; do
            if kill -0 "$pid" 2>/dev/null; then alive=1; fi
        done
        (( alive == 0 )) && break
        sleep 0.1
        waited=$((waited + 1))
    done
    for pid in "${pids[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then
            echo "member pid $pid did not stop in ${STOP_TIMEOUT_S}s; sending SIGKILL" >&2
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    for member in "${MEMBERS[@]}"; do rm -f "$dir/$member.pid"; done
    echo "stopped ${#pids[@]} etcd member(s) in $dir"
}

start_cluster() {
    local dir="$1"
    command -v "$ETCD_BIN" >/dev/null || { echo "etcd not found (apt-get install etcd-server)" >&2; exit 1; }
    command -v "$ETCDCTL_BIN" >/dev/null || { echo "etcdctl not found (apt-get install etcd-client)" >&2; exit 1; }
    mkdir -p "$dir"
    for member in "${MEMBERS[@]}"; do
        if [[ -n "$(live_pid "$dir" "$member")" ]]; then
            echo "member $member is already running from $dir; stop it first" >&2
            exit 1
        fi
    done
    local state=new
    [[ -d "$dir/${MEMBERS[0]}.etcd/member" ]] && state=existing
    for i in "${!MEMBERS[@]}"; do
        local member="${MEMBERS[$i]}"
        # setsid: the members outlive this script and do not get the caller's terminal signals.
        setsid "$ETCD_BIN" \
            --name "$member" \
            --data-dir "$dir/$member.etcd" \
            --listen-client-urls "http://127.0.0.1:${CLIENT_PORTS[$i]}" \
            --advertise-client-urls "http://127.0.0.1:${CLIENT_PORTS[$i]}" \
            --listen-peer-urls "http://127.0.0.1:${PEER_PORTS[$i]}" \
            --initial-advertise-peer-urls "http://127.0.0.1:${PEER_PORTS[$i]}" \
            --initial-cluster "$(initial_cluster)" \
            --initial-cluster-token meridian-bench \
            --initial-cluster-state "$state" \
            >"$dir/$member.log" 2>&1 </dev/null &
        echo $! > "$dir/$member.pid"
    done
    local deadline=$((SECONDS + START_TIMEOUT_S))
    until healthy; do
        if (( SECONDS >= deadline )); then
            echo "etcd cluster not healthy after ${START_TIMEOUT_S}s; logs in $dir/*.log" >&2
            stop_cluster "$dir" >&2
            exit 1
        fi
        sleep 0.5
    done
    echo "etcd cluster healthy: $(endpoints)"
}

status_cluster() {
    local dir="$1"
    for member in "${MEMBERS[@]}"; do
        local pid
        pid="$(live_pid "$dir" "$member")"
        echo "$member: ${pid:-not running}"
    done
    if healthy; then echo "health: ok"; else echo "health: not healthy"; fi
}

[[ $# -eq 2 ]] || usage
DIR="$(mkdir -p "$2" && cd "$2" && pwd)"
case "$1" in
    start) start_cluster "$DIR" ;;
    stop) stop_cluster "$DIR" ;;
    status) status_cluster "$DIR" ;;
    *) usage ;;
esac

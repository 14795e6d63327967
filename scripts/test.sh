#!/usr/bin/env bash
# The whole test suite: unit, property, conformance, multi-process cluster tests, the
# benchmark harness's own tests (against a real etcd it starts here), then the short Jepsen
# matrix (jepsen/ci.sh: real clusters under kill/pause/partition/clock faults, checked for
# linearizability and lost writes, plus the checkers' negative controls). Between the two, the
# container cluster test (docker/test.sh; it says SKIP where no Docker engine runs). Set
# MERIDIAN_SKIP_JEPSEN=1 to skip the Jepsen matrix (about 5 minutes), MERIDIAN_SKIP_DOCKER=1
# to skip the containers (about 1 minute).
source "$(dirname "$0")/common.sh"
ensure_build_deps
ensure_packages etcd:etcd-server etcdctl:etcd-client fusermount3:fuse3 faketime:faketime
command -v cargo-nextest >/dev/null || cargo install --locked cargo-nextest

ETCD_DIR="$(mktemp -d /tmp/meridian-test-etcd.XXXXXX)"
ETCD_PORT="${MERIDIAN_TEST_ETCD_PORT:-23790}"
cleanup() {
  if [[ -n "${ETCD_PID:-}" ]]; then kill "$ETCD_PID" 2>/dev/null || true; wait "$ETCD_PID" 2>/dev/null || true; fi
  rm -rf "$ETCD_DIR"
}
trap cleanup EXIT INT TERM
say "starting etcd on 127.0.0.1:$ETCD_PORT for the benchmark driver tests"
etcd --name meridian-test --data-dir "$ETCD_DIR/data" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 10))" \
  --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 10))" \
  --initial-cluster "meridian-test=http://127.0.0.1:$((ETCD_PORT + 10))" >"$ETCD_DIR/etcd.log" 2>&1 &
ETCD_PID=$!
for _ in $(seq 1 50); do
  ETCDCTL_API=3 etcdctl --endpoints "127.0.0.1:$ETCD_PORT" endpoint health >/dev/null 2>&1 && break
  sleep 0.2
done
export MERIDIAN_BENCH_ETCD="http://127.0.0.1:$ETCD_PORT"

say "building and running the test suite (release profile, shared with the demo)"
cd "$ROOT"
prune_stale_binaries
report_disk "before the test suite"
status=0
run_started="$(date +%s)"
cargo nextest run --workspace --release --locked --no-fail-fast "$@" || status=$?
# The run linked this generation's binaries: older ones, and those of retired targets, go.
prune_unlisted_binaries "$run_started"
report_disk "after the test suite"
((status == 0)) || exit "$status"

if [[ "${MERIDIAN_SKIP_DOCKER:-0}" != 1 ]]; then
  say "running the container cluster test (docker/test.sh: images, compose up, kill, recover)"
  "$ROOT/docker/test.sh" --no-cargo
fi

if [[ "${MERIDIAN_SKIP_JEPSEN:-0}" != 1 ]]; then
  say "running the short Jepsen matrix (jepsen/ci.sh)"
  "$ROOT/jepsen/ci.sh"
  report_disk "after the Jepsen matrix"
fi

#!/usr/bin/env bash
# One command for the geo benchmark: three regions behind emulated WAN delays, per-region
# latency of writes, reads, follower reads and transactions, the LINE test (move, then kill,
# the metadata shard's leader) and the same transactions with a central timestamp oracle.
#
#   bench/run-geo.sh [geo options]     e.g. --ops 200 --concurrency 4 --scale 1
#
# On a fresh Debian machine it installs the build's packages (libclang-dev, protobuf-compiler,
# g++ via apt-get), builds `meridian-ycsb` and `meridian` in release and runs
# `meridian-ycsb geo "$@"` from the repository root. Results land in
# bench/results/<UTC date>/geo/ unless --out says otherwise; see bench/README.md, "Geo".
# Every node the run starts is stopped when it ends, fails or is interrupted.
source "$(dirname "$0")/../scripts/common.sh"

ensure_build_deps

cd "$ROOT"
say "building meridian-ycsb and meridian (release; RocksDB takes 20-40 minutes on a cold build)"
cargo build --release --locked -p meridian-bench -p meridian-cli

say "running the geo benchmark: meridian-ycsb geo $*"
exec "$CARGO_TARGET_DIR/release/meridian-ycsb" geo "$@"

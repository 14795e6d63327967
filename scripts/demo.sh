#!/usr/bin/env bash
# The main job: build Meridian and run `meridian demo` (a local 3-node, 3-region cluster on
# loopback, sample data, a short mixed workload, throughput and latency, clean shutdown).
# Extra arguments go to `meridian demo` (see `meridian demo --help`).
source "$(dirname "$0")/common.sh"
ensure_build_deps
say "building meridian (release; the first build compiles RocksDB and takes 20-40 min)"
cargo build --release --locked -p meridian-cli --manifest-path "$ROOT/Cargo.toml"
exec "$CARGO_TARGET_DIR/release/meridian" demo "$@"

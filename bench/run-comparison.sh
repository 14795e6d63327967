#!/usr/bin/env bash
# One command for the side-by-side YCSB comparison of Meridian, etcd and embedded RocksDB.
#
#   bench/run-comparison.sh [compare options]     e.g. --records 100000 --operations 100000 --threads 64
#
# On a fresh Debian machine it installs what is missing (etcd-server and etcd-client, plus
# libclang-dev, protobuf-compiler and g++ for the build, via apt-get), builds `meridian-ycsb`
# and `meridian` in release, and runs `meridian-ycsb compare "$@"` from the repository root.
# Results land in bench/results/<UTC date>/ unless --out says otherwise; see bench/README.md.
# Every etcd and meridian process the comparison starts is stopped when it ends, fails or is
# interrupted (Ctrl-C).
source "$(dirname "$0")/../scripts/common.sh"

ensure_build_deps
ensure_packages etcd:etcd-server etcdctl:etcd-client

cd "$ROOT"
say "building meridian-ycsb and meridian (release; RocksDB takes 20-40 minutes on a cold build)"
cargo build --release --locked -p meridian-bench -p meridian-cli

say "running the comparison: meridian-ycsb compare $*"
# compare finds `meridian` next to itself ($CARGO_TARGET_DIR/release/meridian).
exec "$CARGO_TARGET_DIR/release/meridian-ycsb" compare "$@"

#!/usr/bin/env bash
# Runs one Meridian Jepsen test: installs what is missing (nftables, fuse3), builds `meridian`,
# `meridian-lazyfs` and the harness (release, shared target dir), and runs the harness with all
# arguments. See
# jepsen/harness/src/main.rs for what a run does and how to read jepsen/store/<run>/.
#
#   jepsen/run.sh --workload register|set|bank|append --nemesis none|kill|pause|partition|clock|clock-chain|power-loss|membership|all
#                 [--time-limit SECONDS] [--concurrency N] [--nodes 3|5] [--seed S]
#                 [--negative-control lost-ack|stale-read|wrong-total|fractured-read]
#                 [--base-port P] [--store DIR] [--linearizable (append)]
#                 [--shards N] [--keys N] [--write-gap-ms MS (register: parked-lease reads)]
#
# Exit status: 0 valid, 1 invalid/unknown, 2 bad arguments, 3 harness failure, 130 interrupted.
set -euo pipefail

# shellcheck source=../scripts/common.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/scripts/common.sh"
cd "$ROOT"

ensure_build_deps
# The partition nemesis cuts traffic with nftables (the harness runs as root, as CI does).
ensure_packages nft:nftables
# The power-loss nemesis puts the nodes' data on lazyfs, a FUSE filesystem (fusermount3).
ensure_packages fusermount3:fuse3
# The clock nemesis jumps and strobes running nodes' wall clocks with libfaketime.
ensure_packages faketime:faketime

say "building meridian, meridian-lazyfs and meridian-jepsen (release, $CARGO_TARGET_DIR)"
cargo build --release --locked -p meridian-cli -p meridian-lazyfs -p meridian-jepsen-harness

exec "$CARGO_TARGET_DIR/release/meridian-jepsen" "$@"

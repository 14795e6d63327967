# Shared by scripts/demo.sh and scripts/test.sh: checks and installs what a fresh Debian
# machine lacks, and sets the shared build directory.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# One target directory outside the clone, reused by every checkout and by CI: RocksDB's C++
# build (librocksdb-sys) takes 20-40 minutes cold on a 2-core machine.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/meridian-target}"

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

# apt_install PACKAGE ...: installs Debian packages (as root, or through sudo).
apt_install() {
  say "installing missing system packages: $*"
  local SUDO=
  [[ $(id -u) -ne 0 ]] && SUDO=sudo
  if ! command -v apt-get >/dev/null; then
    echo "error: need Debian packages $* (libclang for RocksDB's bindings, protoc for gRPC) and apt-get is not available" >&2
    exit 1
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}

# ensure_packages CMD_OR_FILE:PACKAGE ...: installs each Debian package whose probe is missing.
ensure_packages() {
  local missing=()
  for spec in "$@"; do
    local probe="${spec%%:*}" pkg="${spec##*:}"
    if [[ "$probe" == /* ]]; then
      compgen -G "$probe" >/dev/null || missing+=("$pkg")
    else
      command -v "$probe" >/dev/null 2>&1 || missing+=("$pkg")
    fi
  done
  if ((${#missing[@]})); then
    apt_install "${missing[@]}"
  fi
}

# The fixed LIBCLANG_PATH every cargo invocation in this repository sees (.cargo/config.toml
# names it): a symlink to the directory holding the libclang that clang-sys loads at build time.
# The path never changes, so cargo never reruns librocksdb-sys (~20 min) because of it; the
# link is repointed when the machine's LLVM changes.
MERIDIAN_LIBCLANG_LINK=/var/tmp/meridian-libclang

# find_libclang_dir: the directory of the newest libclang that clang-sys accepts when building
# bindings. It loads exactly `libclang.so` or `libclang-*.so` (not `libclang-cpp.so.N`, which
# Debian images often carry without libclang itself, nor the versioned `libclang.so.1`).
find_libclang_dir() {
  local lib
  lib="$(ls /usr/lib/llvm-*/lib/libclang.so /usr/lib/llvm-*/lib/libclang-[0-9]*.so 2>/dev/null \
         | sort -V | tail -n1)"
  if [[ -z "$lib" ]]; then
    lib="$(ls /usr/lib/*-linux-gnu/libclang.so /usr/lib/*-linux-gnu/libclang-[0-9]*.so 2>/dev/null \
           | sort -V | tail -n1)"
  fi
  [[ -n "$lib" ]] && dirname "$lib"
}

# prune_stale_binaries: before a build, deletes from the shared target directory's
# release/deps every executable (`name-<hash>`) named after no target of the workspace (a test
# file since removed or merged) and not linked in the last hour (another checkout sharing the
# directory may be running it); it needs no build (`cargo metadata`), so their space is free
# before the build needs it. Older generations of current targets go after the run
# (`prune_unlisted_binaries`, which knows exactly which are current). Each binary is hundreds
# of MB with debug line tables; left alone they filled this machine's disk (79 GB) and made
# the linker fail, and stop 52's CI ran out of space two minutes into the tests.
prune_stale_binaries() {
  local deps="${CARGO_TARGET_DIR:-/var/tmp/meridian-target}/release/deps" targets
  [[ -d "$deps" ]] || return 0
  command -v python3 >/dev/null || return 0
  targets="$(mktemp)" || return 0
  if (cd "$ROOT" && cargo metadata --no-deps --locked --format-version 1 >"$targets" 2>/dev/null); then
    python3 "$ROOT/scripts/prune_binaries.py" retired "$deps" "$targets" >&2 || true
  fi
  rm -f "$targets"
}

# prune_unlisted_binaries SINCE: after a test run that began at SINCE (epoch seconds), deletes
# every executable in release/deps linked before SINCE that is neither one of the workspace's
# current test binaries (nextest's list; nothing is rebuilt, the run just built them) nor a
# program cargo uplifted to release/ (the same file): older generations (each change to the
# dependency graph or to a package's features links new ones beside the old) and binaries of
# test targets that no longer exist. What was linked during the run and is not listed belongs
# to another checkout sharing the directory, and stays.
prune_unlisted_binaries() {
  local release="${CARGO_TARGET_DIR:-/var/tmp/meridian-target}/release" since="$1" list
  [[ -d "$release/deps" ]] || return 0
  command -v python3 >/dev/null || { say "python3 missing: stale test binaries not pruned"; return 0; }
  list="$(mktemp)" || return 0
  if cargo nextest list --workspace --release --locked --list-type binaries-only \
       --message-format json >"$list" 2>/dev/null; then
    python3 "$ROOT/scripts/prune_binaries.py" unlisted "$release" "$list" "$since" >&2 ||
      say "pruning stale test binaries failed (left in place)"
  fi
  rm -f "$list"
}

# report_disk LABEL: prints the free space where the build and the tests write (the shared
# target directory and /tmp) and warns below 4 GiB. The machines share their disk with others
# and have been seen with under 300 MB free; a test that then fails with ENOSPC says so in
# its own output, and this line puts the figure beside it.
report_disk() {
  local target="${CARGO_TARGET_DIR:-/var/tmp/meridian-target}" dir free
  for dir in "$target" /tmp; do
    [[ -d "$dir" ]] || dir="$(dirname "$dir")"
    free="$(df -Pk "$dir" 2>/dev/null | awk 'NR == 2 { print $4 }')" || true
    [[ -n "$free" ]] || continue
    say "disk $1: $((free / 1024)) MiB free under $dir"
    if ((free < 4 * 1024 * 1024)); then
      echo "warning: under 4 GiB free under $dir; tests that write RocksDB or etcd data may fail with 'No space left on device'" >&2
    fi
  done
}

ensure_build_deps() {
  command -v cargo >/dev/null || { echo "error: cargo (Rust toolchain) is required" >&2; exit 1; }
  # libclang: bindgen for librocksdb-sys. protoc: tonic-prost-build. g++: RocksDB itself.
  # make: tikv-jemalloc-sys builds jemalloc with configure and make.
  ensure_packages protoc:protobuf-compiler g++:g++ make:make
  if [[ -z "$(find_libclang_dir)" ]]; then
    apt_install libclang-dev
  fi
  local dir
  dir="$(find_libclang_dir)"
  if [[ -z "$dir" ]]; then
    echo "error: libclang-dev is installed but no libclang.so or libclang-*.so was found under /usr/lib" >&2
    exit 1
  fi
  if [[ "$(readlink "$MERIDIAN_LIBCLANG_LINK" 2>/dev/null)" != "$dir" ]]; then
    ln -sfn "$dir" "$MERIDIAN_LIBCLANG_LINK"
  fi
  export LIBCLANG_PATH="$MERIDIAN_LIBCLANG_LINK"
}

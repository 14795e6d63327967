# Shared by scripts/demo.sh and scripts/test.sh: checks and installs what a fresh Debian
# machine lacks, and sets the shared build directory.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# One target directory outside the clone, reused by every checkout and by CI: RocksDB's C++
# build (librocksdb-sys) takes ~20 minutes cold on a 2-core machine.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/meridian-target}"

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

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
    say "installing missing system packages: ${missing[*]}"
    if [[ $(id -u) -ne 0 ]]; then
      SUDO=sudo
    else
      SUDO=
    fi
    if ! command -v apt-get >/dev/null; then
      echo "error: need Debian packages ${missing[*]} (libclang for RocksDB's bindings, protoc for gRPC) and apt-get is not available" >&2
      exit 1
    fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

ensure_build_deps() {
  command -v cargo >/dev/null || { echo "error: cargo (Rust toolchain) is required" >&2; exit 1; }
  # libclang: bindgen for librocksdb-sys. protoc: tonic-prost-build. g++: RocksDB itself.
  ensure_packages "/usr/lib/llvm-*/lib/libclang*.so*:libclang-dev" protoc:protobuf-compiler g++:g++
  if [[ -z "${LIBCLANG_PATH:-}" ]]; then
    LIBCLANG_PATH="$(dirname "$(ls /usr/lib/llvm-*/lib/libclang*.so* 2>/dev/null | sort -V | tail -n1)")"
    export LIBCLANG_PATH
  fi
}

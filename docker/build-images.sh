#!/usr/bin/env bash
# Builds the container image `meridian:local` offline, FROM scratch.
#
# No base image is pulled: the image holds exactly
#   /usr/local/bin/meridian                the release binary (node and CLI in one), debug
#                                          info stripped (symbols kept)
#   every shared library `ldd` lists       at the path `ldd` printed, symlinks resolved
#   the dynamic loader                     at the binary's interpreter path (PT_INTERP)
#   /etc/nsswitch.conf                     "hosts: files dns", so host names resolve
#   /data (uid 10001), /tmp (1777)         the node's data directory and a scratch dir
# and runs as uid:gid 10001:10001 (numeric; there is no /etc/passwd). There is no shell, so
# health checks and debugging go through the `meridian` binary itself.
#
# Usage: docker/build-images.sh [--no-cargo]
#   --no-cargo   use the binary already in $CARGO_TARGET_DIR/release (CI that built it before)
# Environment:
#   MERIDIAN_IMAGE        image tag to build (default meridian:local)
#   MERIDIAN_IMAGE_STRIP  0 keeps the binary's debug info in the image (~460 MB instead of ~25)
#   CARGO_TARGET_DIR      cargo's target directory (default /var/tmp/meridian-target, see
#                         scripts/common.sh; shared so RocksDB is not rebuilt)
#
# Idempotent: an unchanged binary gives the same image id (the legacy builder caches COPY by
# content), and a replaced `meridian:local` is removed once nothing uses it.
set -euo pipefail

DOCKER_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$DOCKER_DIR/.." && pwd)"
IMAGE="${MERIDIAN_IMAGE:-meridian:local}"
# The numeric user the node runs as. /data belongs to it, and so does a named volume that
# Docker initialises from /data.
NODE_UID=10001
NODE_GID=10001

# scripts/common.sh: `say`, `ensure_build_deps` (protoc, g++, libclang) and CARGO_TARGET_DIR.
# shellcheck source=SCRIPTDIR/../scripts/common.sh
source "$REPO_ROOT/scripts/common.sh"

die() {
  printf 'error: %s\n' "$*" >&2
  exit 1
}

run_cargo=1
for arg in "$@"; do
  case "$arg" in
    --no-cargo) run_cargo=0 ;;
    -h | --help)
      sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
      exit 0
      ;;
    *) die "unknown argument \"$arg\" (see --help)" ;;
  esac
done

command -v docker >/dev/null 2>&1 || die "the docker CLI is not installed"
docker info >/dev/null 2>&1 \
  || die "no Docker engine is reachable (\`docker info\` failed): start dockerd or set DOCKER_HOST"
for tool in ldd cp stat sha256sum; do
  command -v "$tool" >/dev/null 2>&1 || die "\`$tool\` is required to assemble the image"
done

# ---- 1. the release binary -------------------------------------------------------------------
BINARY="$CARGO_TARGET_DIR/release/meridian"
if ((run_cargo)); then
  ensure_build_deps
  say "building the release binary: cargo build --release --locked -p meridian-cli (target dir $CARGO_TARGET_DIR)"
  say "a cold build compiles RocksDB (~20 min on 2 cores); if another build holds the target dir, cargo prints 'Blocking waiting for file lock' and waits for it"
  started=$SECONDS
  (cd "$REPO_ROOT" && cargo build --release --locked -p meridian-cli) \
    || die "cargo build failed (see the compiler output above)"
  say "binary ready after $((SECONDS - started)) s: $BINARY"
fi
[[ -x "$BINARY" ]] || die "no executable at $BINARY (run without --no-cargo to build it)"

# ---- 2. the build context: a root file system ------------------------------------------------
CONTEXT="$(mktemp -d "${TMPDIR:-/tmp}/meridian-image.XXXXXX")"
trap 'rm -rf "$CONTEXT"' EXIT
ROOTFS="$CONTEXT/rootfs"
mkdir -p "$ROOTFS/usr/local/bin" "$ROOTFS/etc" "$ROOTFS/tmp" "$CONTEXT/data"
chmod 1777 "$ROOTFS/tmp"
chmod 0755 "$CONTEXT/data"
say "assembling the image root in $CONTEXT"
# The release profile keeps line tables, and RocksDB's C++ is compiled with full DWARF: the
# binary is ~460 MB, ~25 MB of it code. The image gets it without debug info but with its
# symbol table, so a panic's backtrace (RUST_BACKTRACE=1) still names functions; the host's
# $BINARY keeps everything for line numbers. MERIDIAN_IMAGE_STRIP=0 copies it unchanged.
if [[ "${MERIDIAN_IMAGE_STRIP:-1}" != 0 ]] && command -v strip >/dev/null 2>&1; then
  strip --strip-debug -o "$ROOTFS/usr/local/bin/meridian" "$BINARY" \
    || die "strip --strip-debug $BINARY failed"
  say "copied the binary without debug info ($(($(stat -c %s "$BINARY") / 1048576)) MiB -> $(($(stat -c %s "$ROOTFS/usr/local/bin/meridian") / 1048576)) MiB)"
else
  cp "$BINARY" "$ROOTFS/usr/local/bin/meridian"
  say "copied the binary unstripped ($(($(stat -c %s "$BINARY") / 1048576)) MiB)"
fi
printf 'hosts: files dns\n' >"$ROOTFS/etc/nsswitch.conf"

# copy_into_rootfs PATH: copies PATH (symlinks followed) to the same path under the root.
copy_into_rootfs() {
  local path="$1"
  [[ "$path" == /* && -e "$path" ]] || die "library \"$path\" from ldd does not exist"
  mkdir -p "$ROOTFS$(dirname "$path")"
  cp -L "$path" "$ROOTFS$path"
  printf '    %s\n' "$path" >&2
}

ldd_output="$(ldd "$BINARY" 2>&1)" || true
if grep -qE 'not a dynamic executable|statically linked' <<<"$ldd_output"; then
  say "the binary is static: no libraries to copy"
else
  if grep -q 'not found' <<<"$ldd_output"; then
    die "ldd cannot resolve every library of $BINARY:"$'\n'"$ldd_output"
  fi
  say "copying the shared libraries and the loader ldd lists:"
  copied=0
  while read -r first second third _; do
    # Three shapes: `libX.so.N => /path (0x…)`, `/lib64/ld-linux… (0x…)` (the loader), and
    # `linux-vdso.so.1 (0x…)` (in the kernel, nothing to copy).
    if [[ "$second" == "=>" && "$third" == /* ]]; then
      copy_into_rootfs "$third"
    elif [[ "$first" == /* ]]; then
      copy_into_rootfs "$first"
    else
      continue
    fi
    copied=$((copied + 1))
  done <<<"$ldd_output"
  ((copied > 0)) || die "ldd listed no libraries for a dynamic executable:"$'\n'"$ldd_output"
  # The loader must sit at the interpreter path written into the binary; ldd prints it, but
  # check rather than find out from an `exec format error` / `no such file` at run time.
  if command -v readelf >/dev/null 2>&1; then
    interpreter="$(readelf -l "$BINARY" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')"
    if [[ -n "$interpreter" && ! -e "$ROOTFS$interpreter" ]]; then
      copy_into_rootfs "$interpreter"
    fi
  fi
fi

# Provenance labels: the commit the binary was built from (marked when the tree was dirty)
# and the binary's digest, so `docker image inspect` tells which build an image holds.
revision="$(git -C "$REPO_ROOT" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
if [[ "$revision" != unknown && -n "$(git -C "$REPO_ROOT" status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
  revision="$revision-dirty"
fi
binary_sha256="$(sha256sum "$BINARY" | cut -d' ' -f1)"
# With --no-cargo the binary may come from another checkout than the one labelled.
built_here=$([[ $run_cargo == 1 ]] && echo yes || echo "no (--no-cargo)")

cat >"$CONTEXT/Dockerfile" <<EOF
# Generated by docker/build-images.sh; see that script for the layout.
FROM scratch
COPY rootfs/ /
COPY --chown=$NODE_UID:$NODE_GID data/ /data/
LABEL org.opencontainers.image.title="meridian" \\
      org.opencontainers.image.description="Meridian node and CLI (FROM scratch: binary, its ldd libraries, the loader)" \\
      org.opencontainers.image.revision="$revision" \\
      io.meridian.binary.sha256="$binary_sha256" \\
      io.meridian.binary.built-from-this-checkout="$built_here"
USER $NODE_UID:$NODE_GID
WORKDIR /data
VOLUME ["/data"]
# Client API (Kv, Cluster) and Raft peer transport, as in the README's examples.
EXPOSE 7001 7101
ENTRYPOINT ["/usr/local/bin/meridian"]
CMD ["--help"]
EOF

# ---- 3. the image ----------------------------------------------------------------------------
previous_id="$(docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)"
say "building image $IMAGE (legacy builder: no registry, no BuildKit frontend image to pull)"
DOCKER_BUILDKIT=0 docker build --quiet=false --tag "$IMAGE" "$CONTEXT" >&2 \
  || die "docker build of $IMAGE failed (see above)"
image_id="$(docker image inspect -f '{{.Id}}' "$IMAGE")"
if [[ -n "$previous_id" && "$previous_id" != "$image_id" ]]; then
  # The old image is now untagged; drop it unless a container still uses it.
  if docker image rm "$previous_id" >/dev/null 2>&1; then
    say "removed the previous $IMAGE image ${previous_id#sha256:}"
  else
    say "kept the previous $IMAGE image ${previous_id#sha256:} (a container still uses it)"
  fi
fi

# A smoke test that needs no cluster: the loader, the libraries and the binary all work.
version="$(docker run --rm --network none "$IMAGE" --version 2>&1 | head -n1)" \
  || die "the image does not run (\`docker run --rm $IMAGE --version\`):"$'\n'"$version"
size_bytes="$(docker image inspect -f '{{.Size}}' "$IMAGE")"
say "built $IMAGE: ${image_id#sha256:} ($((size_bytes / 1024 / 1024)) MiB, $version, revision $revision)"

#!/usr/bin/env bash
# Builds the container image `meridian:local` offline, FROM scratch.
#
# No base image is pulled: the image holds exactly
#   /usr/local/bin/meridian                the release binary (node and CLI in one), debug
#                                          info stripped (symbols kept)
#   /usr/local/bin/meridian-wan            the WAN emulator (delaying TCP proxy) that
#                                          compose.yaml runs between the regions, likewise
#   every shared library `ldd` lists       for either binary, at the path `ldd` printed,
#                                          symlinks resolved
#   the dynamic loader                     at the binary's interpreter path (PT_INTERP)
#   /etc/nsswitch.conf                     "hosts: files dns", so host names resolve
#   /data (uid 10001), /tmp (1777)         the node's data directory and a scratch dir
# and runs as uid:gid 10001:10001 (numeric; there is no /etc/passwd). There is no shell, so
# health checks and debugging go through the `meridian` binary itself.
#
# Usage: docker/build-images.sh [--no-cargo]
#   --no-cargo   use the binaries already in $CARGO_TARGET_DIR/release (CI that built them
#                before)
# Environment:
#   MERIDIAN_IMAGE        image tag to build (default meridian:local)
#   MERIDIAN_IMAGE_STRIP  0 keeps the binaries' debug info in the image (~500 MB instead of ~30)
#   CARGO_TARGET_DIR      cargo's target directory (default /var/tmp/meridian-target, see
#                         scripts/common.sh; shared so RocksDB is not rebuilt)
#
# Idempotent: unchanged binaries give the same image id (the legacy builder caches COPY by
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

# ---- 1. the release binaries -----------------------------------------------------------------
BINARY="$CARGO_TARGET_DIR/release/meridian"
WAN_BINARY="$CARGO_TARGET_DIR/release/meridian-wan"
if ((run_cargo)); then
  ensure_build_deps
  say "building the release binaries: cargo build --release --locked -p meridian-cli -p meridian-wan (target dir $CARGO_TARGET_DIR)"
  say "a cold build compiles RocksDB (~20 min on 2 cores); if another build holds the target dir, cargo prints 'Blocking waiting for file lock' and waits for it"
  started=$SECONDS
  (cd "$REPO_ROOT" && cargo build --release --locked -p meridian-cli -p meridian-wan) \
    || die "cargo build failed (see the compiler output above)"
  say "binaries ready after $((SECONDS - started)) s: $BINARY, $WAN_BINARY"
fi
for binary in "$BINARY" "$WAN_BINARY"; do
  [[ -x "$binary" ]] || die "no executable at $binary (run without --no-cargo to build it)"
done

# ---- 2. the build context: a root file system ------------------------------------------------
CONTEXT="$(mktemp -d "${TMPDIR:-/tmp}/meridian-image.XXXXXX")"
trap 'rm -rf "$CONTEXT"' EXIT
ROOTFS="$CONTEXT/rootfs"
mkdir -p "$ROOTFS/usr/local/bin" "$ROOTFS/etc" "$ROOTFS/tmp" "$CONTEXT/data"
chmod 1777 "$ROOTFS/tmp"
chmod 0755 "$CONTEXT/data"
say "assembling the image root in $CONTEXT"
# The release profile keeps line tables, and RocksDB's C++ is compiled with full DWARF: the
# binary is ~460 MB, ~25 MB of it code (meridian-wan: ~25 MB, ~3 MB of it code). The image
# gets both without debug info but with their symbol tables, so a panic's backtrace
# (RUST_BACKTRACE=1) still names functions; the host's copies keep everything for line
# numbers. MERIDIAN_IMAGE_STRIP=0 copies them unchanged.
# install_binary SOURCE: copies SOURCE to /usr/local/bin/<its name> in the root.
install_binary() {
  local source="$1" dest
  dest="$ROOTFS/usr/local/bin/$(basename "$source")"
  if [[ "${MERIDIAN_IMAGE_STRIP:-1}" != 0 ]] && command -v strip >/dev/null 2>&1; then
    strip --strip-debug -o "$dest" "$source" || die "strip --strip-debug $source failed"
    say "copied $(basename "$source") without debug info ($(($(stat -c %s "$source") / 1048576)) MiB -> $(($(stat -c %s "$dest") / 1048576)) MiB)"
  else
    cp "$source" "$dest"
    say "copied $(basename "$source") unstripped ($(($(stat -c %s "$source") / 1048576)) MiB)"
  fi
}
install_binary "$BINARY"
install_binary "$WAN_BINARY"
printf 'hosts: files dns\n' >"$ROOTFS/etc/nsswitch.conf"

# copy_into_rootfs PATH: copies PATH (symlinks followed) to the same path under the root.
copy_into_rootfs() {
  local path="$1"
  [[ "$path" == /* && -e "$path" ]] || die "library \"$path\" from ldd does not exist"
  mkdir -p "$ROOTFS$(dirname "$path")"
  cp -L "$path" "$ROOTFS$path"
  printf '    %s\n' "$path" >&2
}

# copy_libraries BINARY: the shared libraries and the loader BINARY needs (a library both
# binaries use is simply copied twice, to the same place).
copy_libraries() {
  local binary="$1" ldd_output first second third rest copied=0 interpreter
  ldd_output="$(ldd "$binary" 2>&1)" || true
  if grep -qE 'not a dynamic executable|statically linked' <<<"$ldd_output"; then
    say "$(basename "$binary") is static: no libraries to copy"
    return
  fi
  if grep -q 'not found' <<<"$ldd_output"; then
    die "ldd cannot resolve every library of $binary:"$'\n'"$ldd_output"
  fi
  say "copying the shared libraries and the loader ldd lists for $(basename "$binary"):"
  while read -r first second third rest; do
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
    interpreter="$(readelf -l "$binary" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')"
    if [[ -n "$interpreter" && ! -e "$ROOTFS$interpreter" ]]; then
      copy_into_rootfs "$interpreter"
    fi
  fi
}
copy_libraries "$BINARY"
copy_libraries "$WAN_BINARY"

# Provenance labels: the commit the binary was built from (marked when the tree was dirty)
# and the binary's digest, so `docker image inspect` tells which build an image holds.
revision="$(git -C "$REPO_ROOT" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
if [[ "$revision" != unknown && -n "$(git -C "$REPO_ROOT" status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
  revision="$revision-dirty"
fi
binary_sha256="$(sha256sum "$BINARY" | cut -d' ' -f1)"
wan_binary_sha256="$(sha256sum "$WAN_BINARY" | cut -d' ' -f1)"
# With --no-cargo the binaries may come from another checkout than the one labelled.
built_here=$([[ $run_cargo == 1 ]] && echo yes || echo "no (--no-cargo)")

cat >"$CONTEXT/Dockerfile" <<EOF
# Generated by docker/build-images.sh; see that script for the layout.
FROM scratch
COPY rootfs/ /
COPY --chown=$NODE_UID:$NODE_GID data/ /data/
LABEL org.opencontainers.image.title="meridian" \\
      org.opencontainers.image.description="Meridian node and CLI, and the meridian-wan WAN emulator (FROM scratch: binaries, their ldd libraries, the loader)" \\
      org.opencontainers.image.revision="$revision" \\
      io.meridian.binary.sha256="$binary_sha256" \\
      io.meridian.wan-binary.sha256="$wan_binary_sha256" \\
      io.meridian.binary.built-from-this-checkout="$built_here"
USER $NODE_UID:$NODE_GID
WORKDIR /data
VOLUME ["/data"]
# Client API (Kv, Cluster) and Raft peer transport, as in the README's examples. (The
# meridian-wan container's ports come from its topology file, see docker/wan.toml.)
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

# A smoke test that needs no cluster: the loader, the libraries and both binaries work.
version="$(docker run --rm --network none "$IMAGE" --version 2>&1 | head -n1)" \
  || die "the image does not run (\`docker run --rm $IMAGE --version\`):"$'\n'"$version"
wan_version="$(docker run --rm --network none --entrypoint /usr/local/bin/meridian-wan "$IMAGE" --version 2>&1 | head -n1)" \
  || die "meridian-wan does not run in the image (\`docker run --rm --entrypoint /usr/local/bin/meridian-wan $IMAGE --version\`):"$'\n'"$wan_version"
size_bytes="$(docker image inspect -f '{{.Size}}' "$IMAGE")"
say "built $IMAGE: ${image_id#sha256:} ($((size_bytes / 1024 / 1024)) MiB, $version, $wan_version, revision $revision)"

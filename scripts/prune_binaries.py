"""Deletes stale executables from the shared target directory's release/deps (see
`prune_stale_binaries` and `prune_unlisted_binaries` in scripts/common.sh, which call it).

  prune_binaries.py retired  DEPS METADATA_JSON
      every `name-<16 hex>` executable named after no target in `cargo metadata --no-deps`
      and not linked in the last hour (another checkout sharing the directory may run it);
  prune_binaries.py unlisted RELEASE NEXTEST_LIST_JSON SINCE
      every executable in RELEASE/deps linked before SINCE (epoch seconds) that is neither in
      `cargo nextest list --list-type binaries-only` nor the same file as a program cargo
      uplifted to RELEASE (what was linked since belongs to another checkout, and stays).
"""

import json
import os
import re
import sys
import time


def executables(directory):
    """Paths of the executable files without an extension directly in `directory`."""
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if "." not in name and os.path.isfile(path) and os.access(path, os.X_OK):
            yield path


def remove(paths, what, where):
    count = freed = 0
    for path in paths:
        freed += os.stat(path).st_size
        os.remove(path)
        count += 1
    print(f"==> removed {count} {what} from {where} ({freed / 2**30:.1f} GiB)")


def retired(deps, metadata):
    with open(metadata) as f:
        packages = json.load(f)["packages"]
    names = {t["name"].replace("-", "_") for p in packages for t in p["targets"]}
    hour_ago = time.time() - 3600

    def stale(path):
        m = re.fullmatch(r"(.+)-[0-9a-f]{16}", os.path.basename(path))
        return (
            m is not None
            and m.group(1).replace("-", "_") not in names
            and os.stat(path).st_mtime < hour_ago
        )

    paths = [p for p in executables(deps) if stale(p)]
    if paths:
        remove(paths, "executables of retired targets", deps)


def unlisted(release, listing, since):
    with open(listing) as f:
        binaries = json.load(f)["rust-binaries"].values()
    keep = {os.path.realpath(b["binary-path"]) for b in binaries}
    uplifted = {os.stat(p).st_ino for p in executables(release)}

    def stale(path):
        st = os.stat(path)
        return (
            os.path.realpath(path) not in keep
            and st.st_ino not in uplifted
            and st.st_mtime < since
        )

    deps = os.path.join(release, "deps")
    remove([p for p in executables(deps) if stale(p)], "stale executables", deps)


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "retired" and len(args) == 2:
        retired(*args)
    elif mode == "unlisted" and len(args) == 3:
        unlisted(args[0], args[1], float(args[2]))
    else:
        sys.exit(__doc__)

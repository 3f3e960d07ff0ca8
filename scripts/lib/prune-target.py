#!/usr/bin/env python3
"""Keep the shared cargo target directory from filling the disk.

scripts/test builds into one target directory that outlives a checkout
($HOME/.cache/csi-rs-target), so every tree ever built leaves its artefacts
there: incremental caches and a new `name-<hash>` per changed crate. Left
alone it grew to 77 GB here and a CI run died with "No space left on device"
while compiling tests. Cargo has no garbage collector for target directories,
so this prunes, only when the disk is short (below --min-free-gib):

1. the `incremental` directories (a cache: cargo rebuilds what it needs);
2. then, if still short, every artefact in `deps` that a newer one of the same
   crate name and kind superseded. This may cost one rebuild of a crate built
   in two configurations; it never breaks a build, as cargo checks fingerprints.

Usage: prune-target.py TARGET_DIR [--min-free-gib N]
"""
import os
import re
import shutil
import sys
from collections import defaultdict

ARTEFACT = re.compile(r"^(?P<name>.+)-(?P<hash>[0-9a-f]{16})(?P<ext>\..*)?$")
GIB = 1 << 30


def free_gib(path):
    return shutil.disk_usage(path).free / GIB


def drop_incremental(target):
    for profile in ("debug", "release"):
        shutil.rmtree(os.path.join(target, profile, "incremental"), ignore_errors=True)


def drop_superseded(target):
    freed = 0
    for profile in ("debug", "release"):
        deps = os.path.join(target, profile, "deps")
        if not os.path.isdir(deps):
            continue
        groups = defaultdict(list)
        for entry in os.scandir(deps):
            m = ARTEFACT.match(entry.name)
            if m and entry.is_file(follow_symlinks=False):
                st = entry.stat(follow_symlinks=False)
                groups[(m["name"], m["ext"] or "")].append((st.st_mtime, st.st_size, entry.path))
        for versions in groups.values():
            versions.sort()
            for _, size, path in versions[:-1]:
                os.remove(path)
                freed += size
    return freed


def main(argv):
    if not argv or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    target, min_free = argv[0], 20.0
    if len(argv) == 3 and argv[1] == "--min-free-gib":
        min_free = float(argv[2])
    if not os.path.isdir(target):
        return 0
    before = free_gib(target)
    if before >= min_free:
        return 0
    drop_incremental(target)
    if free_gib(target) < min_free:
        drop_superseded(target)
    print(
        f"[prune-target] {target}: {before:.1f} GiB free was below {min_free:.0f} GiB;"
        f" pruned to {free_gib(target):.1f} GiB free"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

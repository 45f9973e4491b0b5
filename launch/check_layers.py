#!/usr/bin/env python3
"""Checks that every #include "folder/..." points down the layers of docs/architecture.md: a folder
includes only itself and the folders below it. The static libraries make the linker refuse an
upward call; this also catches an upward include of a header-only piece (an inline function, a
struct), which the linker never sees. Exit 1 naming each upward include; 0 when there is none.

  python3 launch/check_layers.py            # from the repository root (ctest `layers` runs it)
"""
import pathlib
import re
import sys

# Each folder and the folders it may include (besides itself). Keep in step with CMakeLists.txt's
# libraries and docs/architecture.md's map.
BELOW = {
    "common": set(),
    "model": {"common"},
    "data": {"common"},
    "sharding": {"common"},
    "optim": {"sharding", "common"},
    "config": {"optim", "sharding", "model", "data", "common"},
    "offload": {"optim", "sharding", "common"},
    "memory": {"config", "optim", "sharding", "model", "data", "common"},
    "checkpoint": {"memory", "config", "optim", "sharding", "model", "data", "common"},
    "trainer": {"checkpoint", "memory", "config", "offload", "optim", "sharding", "model", "data", "common"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/[^"]+"', re.M)


def main() -> int:
    root = pathlib.Path(__file__).resolve().parent.parent
    upward = []
    checked = 0
    for folder, allowed in BELOW.items():
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in (".h", ".cpp", ".cu", ".cuh"):
                continue
            checked += 1
            text = path.read_text(encoding="utf-8")
            for match in INCLUDE.finditer(text):
                target = match.group(1)
                if target in BELOW and target != folder and target not in allowed:
                    line = text.count("\n", 0, match.start()) + 1
                    upward.append(f"{path.relative_to(root)}:{line}: {folder}/ includes {match.group(0).split(None, 1)[-1].strip()} "
                                  f"({target}/ is not below {folder}/)")
    for problem in upward:
        print(problem)
    print(f"{checked} files in {len(BELOW)} folders: {len(upward)} upward include(s)")
    return 1 if upward else 0


if __name__ == "__main__":
    sys.exit(main())

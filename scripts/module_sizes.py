#!/usr/bin/env python
"""The size of the packages' modules, as a report (size is no gate: a module is split by concept, never by count).

    .venv/bin/python scripts/module_sizes.py [--top 15]

Prints each package's lines and modules, the largest modules, and how many lines run over 120 characters (ruff
refuses them in CI).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("genesis_fp16", "genesis_fp16_tools", "agents", "infrastructure", "benchmarks")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=15, help="how many of the largest modules to list (default 15)")
    args = parser.parse_args(argv)
    sizes, long_lines = {}, 0
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            lines = path.read_text(encoding="utf-8").splitlines()
            sizes[str(path.relative_to(ROOT))] = len(lines)
            long_lines += sum(len(line) > 120 for line in lines)
    for package in PACKAGES:
        mine = [n for p, n in sizes.items() if p.startswith(package + "/")]
        print(f"{package:20s} {sum(mine):7,d} lines in {len(mine):3d} modules")
    print(f"\nthe {args.top} largest modules:")
    for path, n in sorted(sizes.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"  {n:6,d}  {path}")
    print(f"\nlines over 120 characters: {long_lines}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

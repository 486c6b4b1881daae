#!/usr/bin/env python
"""Write anew the line numbers of docs/ARCHITECTURE.md's code references.

    .venv/bin/python scripts/architecture_lines.py [--check]

A reference is ``path:LINE`` in backticks followed by the code on that line in
backticks and parentheses, e.g. `` `genesis_fp16/training/trainer.py:42` (`def _account(`) ``.
Each LINE becomes the first line of ``path`` that holds the code. ``--check``
writes nothing and exits 1 when a reference is stale or its code is gone
(tests/test_architecture.py runs the same check).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
REFERENCE = re.compile(r"`(?P<path>[\w./-]+\.py):(?P<line>\d+)` \(`(?P<code>[^`]+)`\)")


def where(path: str, code: str) -> int:
    """The first line of ``path`` (repository-relative) that holds ``code``; 0 when none does."""
    lines = (ROOT / path).read_text(encoding="utf-8").splitlines() if (ROOT / path).is_file() else []
    return next((i for i, line in enumerate(lines, 1) if code in line), 0)


def problems(text: str) -> list[str]:
    """Every reference of ``text`` whose line does not hold its code, or whose code is nowhere in its file."""
    out = []
    for m in REFERENCE.finditer(text):
        found = where(m["path"], m["code"])
        if found == 0:
            out.append(f"{m['path']}: `{m['code']}` is gone")
        elif found != int(m["line"]):
            out.append(f"{m['path']}:{m['line']}: `{m['code']}` is at line {found}")
    return out


def renumbered(text: str) -> str:
    return REFERENCE.sub(lambda m: f"`{m['path']}:{where(m['path'], m['code'])}` (`{m['code']}`)", text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 on a stale reference")
    args = parser.parse_args(argv)
    text = DOC.read_text(encoding="utf-8")
    if args.check:
        found = problems(text)
        print("\n".join(found) or "every reference holds")
        return 1 if found else 0
    gone = [p for p in problems(text) if p.endswith("is gone")]
    if gone:
        print("\n".join(gone))
        return 1
    DOC.write_text(renumbered(text), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""The seed's benchmark script name, now a thin wrapper over `genesis-fp16 bench`.

    python scripts/benchmark_fp16_training.py              # full matrix
    python scripts/benchmark_fp16_training.py --quick      # CI smoke run

Writes <out-dir>/fp16_vs_fp32_results.csv, .json and .png (default out-dir:
benchmark_results/). Every other option is passed to `genesis-fp16 bench`;
see `genesis-fp16 bench --help` and docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

STEM = "fp16_vs_fp32_results"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, add_help=True
    )
    parser.add_argument(
        "--out-dir", type=Path, default=Path("benchmark_results"), help="where the CSV, JSON and plot go"
    )
    args, rest = parser.parse_known_args(argv)
    from genesis_fp16.cli import app

    out = args.out_dir
    command = [
        "bench",
        *rest,
        "--csv",
        str(out / f"{STEM}.csv"),
        "--json",
        str(out / f"{STEM}.json"),
        "--plot",
        str(out / f"{STEM}.png"),
    ]
    try:
        app(args=command, prog_name="genesis-fp16")
    except SystemExit as exc:  # the app always exits; its code is ours
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

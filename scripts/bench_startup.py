"""Start-up time of a `genesis-fp16` command: the figure in docs/PERFORMANCE.md ("Start-up").

    python scripts/bench_startup.py --runs 10 -- --help
    python scripts/bench_startup.py --runs 10 --tree /path/to/other/checkout -- rollout status

Runs ``python -m genesis_fp16.cli ARGS`` in fresh interpreters from ``--tree``
(default: this checkout, first on PYTHONPATH) and prints the median wall time
and the median CPU time (user + system) of the child. CPU time is the figure
to compare across machines and load; the load average before and after is
printed beside it.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("args", nargs="*", help="the command's arguments (after --)")
    opts = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=str(opts.tree), OMP_NUM_THREADS="1")
    walls, cpus = [], []
    load_before = os.getloadavg()
    for _ in range(opts.runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "genesis_fp16.cli", *opts.args],
            cwd=opts.tree,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
        )
        walls.append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    print(
        f"genesis-fp16 {' '.join(opts.args)} ({opts.tree}): wall median {statistics.median(walls):.2f} s "
        f"(min {min(walls):.2f}, max {max(walls):.2f}), CPU median {statistics.median(cpus):.2f} s, {opts.runs} runs; "
        f"load average {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after"
    )


if __name__ == "__main__":
    main()

"""Issue 37's determinism benchmark: N default `genesis-fp16 evolve` runs, each
in a fresh state dir, half of them beside a CPU burner, must give identical
reports apart from timings and ids.

    python scripts/determinism_check.py [--runs 10] [--budget 40] [--cache PATH] [--out DIR]

Every run shares one precision cache (``--cache``, default a fresh file under
``--out``: the first run measures ``auto``, the others reuse its decision, as
every state dir of a user does with ``~/.cache/genesis-fp16/precision.json``).
The burner is one busy Python process per CPU core, started before the odd
runs and stopped after them. Prints one line per run (its precision and the
decision's source) and the fields that differ from the first run's report;
exits 1 when any does. Not a test: it takes minutes and the machine's load is
the point.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

VOLATILE = {
    "wall_s",
    "run_id",
    "replay_db",
    "run_manifest",
    "time_share",
    "elapsed_s",
    "wm_wall_s",
    "critic_wall_s",
    "time",
    "cost_s",
    "at",
    "seconds",
    "speed",
    "speed_low",
}


def burn() -> None:
    while True:
        pass


def strip(value: Any, volatile: frozenset[str] | set[str] = VOLATILE) -> Any:
    """A report without the fields that differ between equal runs (timings, ids, paths: ``volatile``, at any depth);
    a precision decision by its precision alone (the first run measured, the others read the cache)."""
    if isinstance(value, dict):
        if "source" in value and "reason" in value and "precision" in value:
            return {"precision": value["precision"]}
        return {k: strip(v, volatile) for k, v in value.items() if k not in volatile}
    if isinstance(value, list):
        return [strip(v, volatile) for v in value]
    return value


def diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two JSON values differ, as ``.path: a != b`` lines."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in diff(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--budget", type=int, default=None, help="evolve --budget (default: evolve's own)")
    parser.add_argument("--cache", type=Path, default=None, help="GENESIS_FP16_PRECISION_CACHE for every run")
    parser.add_argument(
        "--out", type=Path, default=None, help="where the state dirs and reports go (default: a temp dir)"
    )
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="determinism-"))
    cache = args.cache or out / "precision.json"
    reports = []
    for k in range(args.runs):
        burners = (
            [multiprocessing.Process(target=burn, daemon=True) for _ in range(os.cpu_count() or 1)] if k % 2 else []
        )
        for b in burners:
            b.start()
        try:
            env = {
                **os.environ,
                "GENESIS_FP16_STATE_DIR": str(out / f"state{k}"),
                "GENESIS_FP16_PRECISION_CACHE": str(cache),
            }
            report_path = out / f"report{k}.json"
            cmd = [sys.executable, "-m", "genesis_fp16.cli", "evolve", "--json", str(report_path)]
            if args.budget is not None:
                cmd += ["--budget", str(args.budget)]
            subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
        finally:
            for b in burners:
                b.terminate()
                b.join()
        report = json.loads(report_path.read_text())
        reports.append(strip(report))
        decision = report.get("precision_decision") or {}
        print(
            f"run {k} ({'burner' if burners else 'quiet'}): precision {report.get('precision')} "
            f"({decision.get('source')})"
        )
    differing = 0
    for k, report in enumerate(reports[1:], start=1):
        diffs = diff(reports[0], report)
        differing += bool(diffs)
        print(f"run {k} vs run 0: {len(diffs)} field(s) differ" + "".join(f"\n  {d}" for d in diffs[:20]))
    print(f"{args.runs - differing}/{args.runs} reports identical apart from timings and ids ({out})")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())

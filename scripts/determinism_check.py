"""Same seed, same report, on a quiet machine and a loaded one: run the
default `genesis-fp16 evolve` N times, each in a fresh state dir, every other
run beside a busy loop on every core, and compare every report with the
first apart from timings and run ids.

    python scripts/determinism_check.py [--runs 10] [--json out.json] [-- EVOLVE_ARGS...]

The state dirs are fresh; the host-level caches the user's state dirs share
(such as `auto`'s measured precision) are not touched, which is the point: a
second run in a fresh state dir must decide as the first did. Run from the
repository root with the project's Python. Exit status 1 when any report
differs from the first.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
# what may differ between two runs of one seed: wall and CPU times, the run's
# identity and where its files are
VOLATILE = {"wall_s", "run_id", "replay_db", "run_manifest", "time_share", "started", "ended", "updated"}
VOLATILE_SUFFIXES = ("_s", "_seconds", "_ms")


def comparable(value: Any) -> Any:
    """``value`` without the fields that may differ between runs of one seed."""
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items() if k not in VOLATILE and not k.endswith(VOLATILE_SUFFIXES)}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """The paths at which ``a`` and ``b`` differ (leaves only)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for key in sorted(set(a) | set(b)):
            out += differences(a.get(key), b.get(key), f"{path}.{key}" if path else key)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [path or "<root>"]


def _burn(stop: Any) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def run_once(index: int, loaded: bool, evolve_args: list[str], out_dir: Path) -> dict[str, Any]:
    state = out_dir / f"state{index}"
    report = out_dir / f"report{index}.json"
    stop = multiprocessing.Event()
    burners = [multiprocessing.Process(target=_burn, args=(stop,), daemon=True) for _ in range(os.cpu_count() or 1)] if loaded else []
    for proc in burners:
        proc.start()
    env = dict(os.environ, GENESIS_FP16_STATE_DIR=str(state))
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "genesis_fp16.cli", "evolve", *evolve_args, "--json", str(report)],
                              cwd=ROOT, env=env, capture_output=True, text=True)
    finally:
        stop.set()
        for proc in burners:
            proc.join(timeout=10)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"run {index}: evolve exited {done.returncode}:\n{done.stderr[-2000:]}")
    data = json.loads(report.read_text())
    return {"index": index, "loaded": loaded, "wall_s": round(wall, 1), "report": data}


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    evolve_args: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, evolve_args = argv[:at], argv[at + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json", type=Path, default=None, help="write the per-run summary here")
    args = parser.parse_args(argv)
    if args.runs < 2:
        parser.error("--runs: expected at least 2 (the first is compared with the others)")
    results = []
    with tempfile.TemporaryDirectory(prefix="determinism-") as tmp:
        for i in range(args.runs):
            res = run_once(i, loaded=i % 2 == 1, evolve_args=evolve_args, out_dir=Path(tmp))
            report = res["report"]
            diff = differences(comparable(results[0]["report"]), comparable(report)) if results else []
            res["differences"] = diff
            results.append(res)
            print(f"run {i:>2} {'loaded' if res['loaded'] else 'quiet ':6} wall {res['wall_s']:>6.1f} s  "
                  f"precision {report.get('precision')}  held-out {report.get('heldout_return')}  "
                  f"episodes {report.get('real_episodes')}  differing fields vs run 0: {len(diff)}"
                  + (f" ({', '.join(diff[:5])}{', ...' if len(diff) > 5 else ''})" if diff else ""), flush=True)
    same = sum(not r["differences"] for r in results[1:])
    print(f"{same} of {args.runs - 1} reports identical to run 0 apart from timings and ids "
          f"({sum(r['loaded'] for r in results)} runs beside a busy loop on every core)")
    if args.json is not None:
        summary = [{k: v for k, v in r.items() if k != "report"} | {"precision": r["report"].get("precision"),
                    "heldout_return": r["report"].get("heldout_return")} for r in results]
        args.json.write_text(json.dumps({"evolve_args": evolve_args, "runs": summary}, indent=2) + "\n")
    return 0 if same == args.runs - 1 else 1


if __name__ == "__main__":
    sys.exit(main())

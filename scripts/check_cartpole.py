#!/usr/bin/env python
"""Learning check: how many seeds reach a mean evaluation return >= 475 on
CartPole-v1 within 100,000 steps, ours beside Stable-Baselines3's PPO on the
same seeds, settings and machine (8 envs x 128 steps, 4 epochs, minibatch 256,
the settings of configs/base.yaml; SB3 set up as scripts/bench_ppo_vs_sb3.py
sets it up).

    .venv/bin/python scripts/check_cartpole.py [--seeds 1 2 ... 20] [--impls ours sb3] [--jobs 2] [--json PATH]

Each run is its own subprocess with one torch thread (OMP_NUM_THREADS=1);
``--jobs`` runs that many side by side (a run's result does not depend on the
load: ours and SB3 are seeded). The output names the CPU and the flags its
floating-point paths depend on (AMX, AVX512-BF16, AVX2): the same seed can
learn differently on another CPU kind. SB3 needs the ``bench`` extra
(``pip install -e '.[dev,bench]'``); ``--impls ours`` runs without it.

Exit status 0 when ours solves at least ``--need`` seeds (default: all but
one) and, with SB3 run, at least as many seeds as SB3; 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # benchmarks/ (the host report) is not installed
sys.path.insert(0, str(ROOT / "scripts"))  # bench_ppo_vs_sb3's workers


def _worker(impl: str, seed: int, steps: int, overrides: list[str]) -> dict:
    """One run by bench_ppo_vs_sb3's workers: the same config for both (its overrides too), on the CPU."""
    import bench_ppo_vs_sb3 as bench

    bench.OVERRIDES[:] = overrides
    return (bench.worker_sb3 if impl == "sb3" else bench.worker_ours)("CartPole-v1", steps, seed, "auto")


def _spawn(impl: str, seed: int, steps: int, overrides: list[str]) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", impl, "--seeds", str(seed), "--steps", str(steps)]
    cmd += [f"--set={o}" for o in overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"{impl} seed {seed} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return {"seed": seed, **json.loads(proc.stdout.strip().splitlines()[-1])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(1, 21)))
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--threshold", type=float, default=475.0)
    ap.add_argument("--need", type=int, default=None, help="seeds ours must solve (default: all but one)")
    ap.add_argument("--impls", nargs="+", choices=["ours", "sb3"], default=["ours", "sb3"])
    ap.add_argument("--jobs", type=int, default=1, help="runs side by side, one process each")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="a key=value override of our config")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--worker", choices=["ours", "sb3"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.worker, args.seeds[0], args.steps, args.overrides)))
        return
    if "sb3" in args.impls:
        try:
            import stable_baselines3  # noqa: F401
        except ImportError:
            raise SystemExit("stable-baselines3 is not installed: pip install -e '.[dev,bench]' (or --impls ours)")
    from benchmarks.baselines.common import host

    where = host()
    print(
        f"{where['cpu']}, flags {' '.join(where['flags']) or 'none of avx2/avx512/amx'}, torch {where['torch']}, "
        f"{len(args.seeds)} seeds, {args.jobs} job(s), load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    jobs = [(impl, seed) for seed in args.seeds for impl in args.impls]
    rows: dict[str, list[dict]] = {impl: [] for impl in args.impls}
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [(impl, seed, pool.submit(_spawn, impl, seed, args.steps, args.overrides)) for impl, seed in jobs]
        for impl, seed, fut in futures:
            row = fut.result()
            rows[impl].append(row)
            print(
                f"seed {seed:3d} {impl:4s}: eval return {row['eval_return']:6.1f} after {row['env_steps']} steps",
                flush=True,
            )
    solved = {impl: sum(r["eval_return"] >= args.threshold for r in rs) for impl, rs in rows.items()}
    need = len(args.seeds) - 1 if args.need is None else args.need
    ok = solved.get("ours", 0) >= need and solved.get("ours", 0) >= solved.get("sb3", 0)
    print(
        "solved (eval return >= %g): %s"
        % (args.threshold, ", ".join(f"{impl} {n}/{len(args.seeds)}" for impl, n in solved.items()))
    )
    for impl, rs in rows.items():
        failed = [f"{r['seed']} ({r['eval_return']:.1f})" for r in rs if r["eval_return"] < args.threshold]
        print(f"  {impl} below: {', '.join(failed) or 'none'}")
    print(f"{'PASS' if ok else 'FAIL'}: ours must solve >= {need}" + (" and >= SB3's count" if "sb3" in rows else ""))
    if args.json:
        from genesis_fp16.base.storage import atomic_write_text

        summary = {
            "rows": rows,
            "solved": solved,
            "need": need,
            "ok": ok,
            "threshold": args.threshold,
            "steps": args.steps,
            "seeds": args.seeds,
            "overrides": args.overrides,
            "host": where,
            "load_avg_end": list(os.getloadavg()),
        }
        atomic_write_text(args.json, json.dumps(summary, indent=2))
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()

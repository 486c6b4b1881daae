#!/usr/bin/env python
"""Our PPO against itself: precisions (fp32, bf16, fp16, auto) and the CPU
fast path (``plain``: the switch off; ``no_<piece>[+<piece>]``: pieces left out), by
CPU time, in pairs.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_ppo_variants.py --env CartPole-v1 --steps 30720 \\
        --variants fp32,bf16,auto --repeats 5 --json out.json

Settings are configs/base.yaml's with 8 in-process envs on the CPU (the
`bench_ppo_vs_sb3.py` settings). Each run trains in its own subprocess
(``OMP_NUM_THREADS=1``) and is timed by the process's CPU time over
training; repeat ``r`` runs every variant on seed ``seed + r``, the order
rotated each repeat, so a ratio to the first variant is read per pair. The
final evaluation (20 deterministic episodes) shows whether the variant still
learns; for reduced precision the guard's FP32 policy canary runs as
configured (its count, and any rollback, are in the JSON). The machine's
load average before each run is recorded too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED = dict(num_envs=8, num_steps=128, update_epochs=4, minibatch_size=256)
PRECISIONS = ("fp32", "bf16", "fp16", "auto")


def _variant(name: str) -> tuple[dict, tuple[str, ...]]:
    """(config fields, fast-path pieces) of a variant name."""
    from agents.ppo.fast import PIECES

    if name in PRECISIONS:
        return {"precision": name}, PIECES
    if name == "plain":
        return {"cpu_fast_path": False}, PIECES
    left_out = set(name[3:].split("+")) if name.startswith("no_") else set()
    if left_out and left_out <= set(PIECES):
        return {}, tuple(p for p in PIECES if p not in left_out)
    raise SystemExit(
        f"variant {name!r}: expected one of {', '.join(PRECISIONS)}, plain, or no_<piece>[+<piece>...] for pieces of "
        f"{', '.join(PIECES)}"
    )


def worker(env_id: str, steps: int, seed: int, name: str) -> dict:
    from agents.ppo.config import load_config
    from agents.ppo.ppo import PPO
    from bench_ppo_vs_sb3 import train_timed  # scripts/ is this script's own folder on the path

    fields, pieces = _variant(name)
    cfg = load_config(
        ROOT / "configs" / "base.yaml",
        env_id=env_id,
        total_steps=steps,
        seed=seed,
        vec_env="sync",
        device="cpu",
        **SHARED,
        **fields,
    )
    ppo = PPO(cfg, fast_pieces=pieces)
    result, cpu, eval_return = train_timed(ppo)
    return {
        "variant": name,
        "seed": seed,
        "env_steps": result.env_steps,
        "cpu_s": cpu,
        "wall_s": result.wall_s,
        "env_steps_per_cpu_s": result.env_steps / cpu,
        "eval_return": eval_return,
        "time_split_s": result.time_split_s,
        "precision": ppo.trainer.precision.name,
        "decision": ppo.guard.training.decision.line(),
        "canaries": len(ppo.guard.canaries),
        "rollbacks": ppo.guard.rollbacks,
        "fast_path": result.optimizations["fast_path_pieces"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--steps", type=int, default=30_720)
    ap.add_argument("--variants", default="fp32,bf16,auto", help="comma-separated; ratios are to the first")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.env, args.steps, args.seed, args.worker)))
        return
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    for name in names:
        _variant(name)  # a bad name stops here, before any run
    env = dict(os.environ, OMP_NUM_THREADS="1")
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for rep in range(args.repeats):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            load = os.getloadavg()[0]
            cmd = [
                sys.executable,
                __file__,
                "--env",
                args.env,
                "--steps",
                str(args.steps),
                "--seed",
                str(args.seed + rep),
                "--worker",
                name,
            ]
            res = json.loads(
                subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout.strip().splitlines()[-1]
            )
            res["load_before"] = load
            runs[name].append(res)
            print(
                f"repeat {rep + 1}/{args.repeats} {name:>16}: {res['env_steps_per_cpu_s']:>9,.0f} env steps per "
                f"CPU-s, eval {res['eval_return']:.1f}, "
                f"{res['precision']}, {res['canaries']} canaries, rollbacks {res['rollbacks'] or 'none'} (load "
                f"{load:.1f})",
                flush=True,
            )
    first = names[0]
    summary = {}
    for name in names:
        rates = [r["env_steps_per_cpu_s"] for r in runs[name]]
        pairs = [r["env_steps_per_cpu_s"] / f["env_steps_per_cpu_s"] for r, f in zip(runs[name], runs[first])]
        summary[name] = {
            "median_env_steps_per_cpu_s": statistics.median(rates),
            "ratio_to_first_per_pair": pairs,
            "median_ratio_to_first": statistics.median(pairs),
            "eval_returns": [r["eval_return"] for r in runs[name]],
            "precision": sorted({r["precision"] for r in runs[name]}),
            "canaries": [r["canaries"] for r in runs[name]],
            "rollbacks": [r["rollbacks"] for r in runs[name]],
        }
        s = summary[name]
        print(
            f"{name:>16}: median {s['median_env_steps_per_cpu_s']:,.0f} env steps per CPU-s, "
            f"x{s['median_ratio_to_first']:.3f} of {first} "
            f"(pairs {', '.join(f'{p:.3f}' for p in pairs)}), eval median {statistics.median(s['eval_returns']):.1f}"
        )
    if args.json:
        from benchmarks.baselines.common import host

        where = host()  # CPU model, the flags a figure is read against, cores, torch, date
        out = {
            "env": args.env,
            "steps": args.steps,
            "repeats": args.repeats,
            "variants": names,
            "settings": SHARED,
            "summary": summary,
            "runs": runs,
            "torch": where["torch"],
            "cpu": where["cpu"],
            "cpu_flags": where["flags"],
            "date": where["date"],
        }
        tmp = args.json.with_suffix(args.json.suffix + ".tmp")
        tmp.write_text(json.dumps(out, indent=2))
        os.replace(tmp, args.json)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

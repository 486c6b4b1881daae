#!/usr/bin/env python
"""Measure each PPO stage on its own: environment stepping, batched inference, the update.

    .venv/bin/python scripts/diagnose_performance.py --test all|env|inference|update [--env CartPole-v1] [--clock
    cpu|wall] [--json PATH]
    .venv/bin/python scripts/diagnose_performance.py --compare BEFORE.json AFTER.json

env:       sync (our in-process vector env) vs sync_gymnasium (gymnasium SyncVectorEnv) vs async
           (subprocess AsyncVectorEnv), 8 envs, env steps/s with random actions
inference: the rollout's per-step actor forward and pick, batched (one forward for all envs),
           in chunks of 4 and per env; vector steps/s
update:    one PPO update (4 epochs x minibatches over an 8x128 rollout) in FP32, AMP BF16,
           AMP FP16 (CPU: slow by design, shown for completeness), torch.compile, and FP32
           with 2 torch threads instead of 1; and the floor: the same minibatches' loss and
           backward alone (no clipping, optimizer or trainer); updates/s

Repeats alternate the variants within one run and report medians: on a shared
machine only ratios measured side by side mean much. ``--clock cpu`` (the
default) times by this process's CPU time, which other people's load moves
much less than the wall clock; the ``async`` env variant is always timed by
the wall clock (its work runs in subprocesses, whose CPU time this process
does not see). The load average is recorded. Run with OMP_NUM_THREADS=1 on
small CPUs (PPO's 64-unit MLPs lose to thread wake-ups otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


CLOCK = {"cpu": time.process_time, "wall": time.perf_counter}
now = time.process_time  # set by --clock


def _cfg(env_id: str, **kw):
    from agents.ppo.config import load_config

    base = dict(env_id=env_id, device=kw.pop("device", "auto"), eval_episodes=0)
    return load_config(ROOT / "configs" / "base.yaml", **base, **kw)


def bench_env(env_id: str, repeats: int, steps: int) -> dict:

    from agents.ppo.envs import make_env_fn, make_vector_env

    fns = [make_env_fn(env_id, i) for i in range(8)]
    envs = {mode: make_vector_env(fns, mode) for mode in ("sync", "sync_gymnasium", "async")}
    samples = {m: [] for m in envs}
    try:
        for mode, env in envs.items():
            env.reset(seed=0)
        for _ in range(repeats):
            for mode, env in envs.items():
                env.action_space.seed(0)
                actions = [env.action_space.sample() for _ in range(steps)]
                clock = time.perf_counter if mode == "async" else now  # subprocess work is not this process's CPU time
                t0 = clock()
                for a in actions:
                    env.step(a)
                samples[mode].append(steps * 8 / (clock() - t0))
    finally:
        for env in envs.values():
            env.close()
    return {
        f"env.{m}": {"value": statistics.median(v), "unit": "env steps/s", "samples": v} for m, v in samples.items()
    }


def bench_inference(env_id: str, repeats: int, steps: int) -> dict:
    import torch

    from agents.ppo.ppo import PPO

    variants = {
        "inference.batched": dict(batch_inference=True),
        "inference.chunk4": dict(batch_inference=True, inference_batch_size=4),
        "inference.per_env": dict(batch_inference=False),
    }
    learners = {k: PPO(_cfg(env_id, vec_env="sync", **v)) for k, v in variants.items()}
    first = next(iter(learners.values()))
    obs = torch.randn(first.cfg.num_envs, first.obs_dim)
    samples = {k: [] for k in learners}
    for _ in range(repeats):
        for name, ppo in learners.items():
            with torch.inference_mode():  # one rollout's perturbations, as the training loop draws them
                rollout = ppo.net.perturbation(ppo._draw_noise())
            t0 = now()
            for i in range(steps):
                ppo.act(obs, rollout[i % len(rollout)])
            samples[name].append(steps / (now() - t0))
    for ppo in learners.values():
        ppo.close()
    return {
        k: {"value": statistics.median(v), "unit": "vector steps/s (8 envs)", "samples": v} for k, v in samples.items()
    }


def _forward_backward(ppo, adv, ret) -> None:
    """`PPO._update`'s minibatches through the loss and its backward alone: no clipping, optimizer step or trainer."""
    import torch

    from genesis_fp16.base.seeds import torch_generator

    cfg, data = ppo.cfg, ppo.buffer.flat(adv, ret)
    gen = torch_generator(0, "diagnose_performance.minibatches")
    for _epoch in range(cfg.update_epochs):
        perm = torch.randperm(cfg.batch_size, generator=gen)
        shuffled = {k: v[perm] for k, v in data.items()}
        for start in range(0, cfg.batch_size, cfg.minibatch_size):
            ppo._loss(ppo.net, {k: v[start : start + cfg.minibatch_size] for k, v in shuffled.items()})[0].backward()
            ppo.net.zero_grad(set_to_none=True)


def bench_update(env_id: str, repeats: int, updates: int, device: str) -> dict:
    import torch

    import numpy as np

    from agents.ppo.ppo import PPO, gae

    variants = {
        "update.fp32": dict(precision="fp32"),
        "update.amp_bf16": dict(precision="bf16"),
        "update.amp_fp16": dict(precision="fp16"),
        "update.compiled_fp32": dict(precision="fp32", use_torch_compile=True),
        "update.fp32_2threads": dict(precision="fp32", num_workers=2),
        "update.fp32_forward_backward": dict(
            precision="fp32"
        ),  # the floor: the same minibatches' loss and backward only
    }
    learners = {}
    for name, v in variants.items():
        ppo = PPO(_cfg(env_id, vec_env="sync", device=device, total_steps=1024, **v))
        ppo.train()  # one rollout + one update: fills the buffers, warms up (and compiles)
        learners[name] = ppo
    info = {}
    samples = {k: [] for k in learners}
    for _ in range(repeats):
        for name, ppo in learners.items():
            rows = ppo.buffer.rows
            adv = torch.from_numpy(
                gae(
                    rows["rew"],
                    rows["val"],
                    rows["done"],
                    np.zeros(ppo.cfg.num_envs, np.float32),
                    ppo.cfg.gamma,
                    ppo.cfg.gae_lambda,
                )
            )
            ret = adv + ppo.buffer.val
            torch.set_num_threads(ppo.cfg.optimizations.num_workers or 1)  # each variant its own thread count
            step = _forward_backward if name == "update.fp32_forward_backward" else PPO._update
            t0 = now()
            for _ in range(updates):
                step(ppo, adv, ret)
            samples[name].append(updates / (now() - t0))
    for name, ppo in learners.items():
        info[name] = {
            "precision": ppo.trainer.precision.name,
            "scaler": ppo.trainer.scaler.is_enabled(),
            "compile_active": bool(getattr(ppo.forward, "active", False)),
        }
        ppo.close()
    return {
        k: {
            "value": statistics.median(v),
            "unit": "updates/s (8x128 rollout, 4 epochs, mb 256)",
            "samples": v,
            **info[k],
        }
        for k, v in samples.items()
    }


def meta() -> dict:
    import torch

    from genesis_fp16.precision.capability import cpu_name

    cpu = cpu_name()
    return {
        "torch": torch.__version__,
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch_threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_avg": list(os.getloadavg()),
    }


def compare(before: Path, after: Path) -> None:
    from rich.console import Console

    from genesis_fp16.base.terminal import Table  # columns fold what does not fit instead of cutting it

    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    table = Table(title=f"{before} -> {after}")
    for col in ("measurement", "unit", "before", "after", "after/before"):
        table.add_column(col)
    for key in sorted(set(a["results"]) | set(b["results"])):
        x, y = a["results"].get(key), b["results"].get(key)
        ratio = f"{y['value'] / x['value']:.2f}x" if x and y and x["value"] else "-"
        table.add_row(
            key, (x or y)["unit"], f"{x['value']:,.1f}" if x else "-", f"{y['value']:,.1f}" if y else "-", ratio
        )
    Console(width=140).print(table)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--test", choices=["all", "env", "inference", "update"], default="all")
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda (for the update test)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    ap.add_argument(
        "--clock",
        choices=sorted(CLOCK),
        default="cpu",
        help="cpu: this process's CPU time (default); wall: elapsed time",
    )
    args = ap.parse_args()
    global now
    now = CLOCK[args.clock]
    if args.compare:
        for p in args.compare:
            if not p.exists():
                raise SystemExit(f"--compare: {p} not found (expected a JSON written by --json)")
        compare(*args.compare)
        return
    results = {}
    if args.test in ("all", "env"):
        results.update(bench_env(args.env, args.repeats, 500))
    if args.test in ("all", "inference"):
        results.update(bench_inference(args.env, args.repeats, 500))
    if args.test in ("all", "update"):
        results.update(bench_update(args.env, args.repeats, 3, args.device))
    data = {"meta": {**meta(), "clock": args.clock}, "env": args.env, "results": results}
    for key, r in results.items():
        extra = f" ({r['precision']}, scaler={r['scaler']}, compiled={r['compile_active']})" if "precision" in r else ""
        print(f"{key:24s} {r['value']:12,.1f} {r['unit']}{extra}")
    if args.json:
        from genesis_fp16.base.storage import atomic_write_text

        atomic_write_text(args.json, json.dumps(data, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

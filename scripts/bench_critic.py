"""Time the critic's training step FP32 vs BF16 and measure what each hidden
size learns; the figures behind Critic's default size.

    python scripts/bench_critic.py --json out.json
    python scripts/bench_critic.py --hiddens 64,128 --rounds 5 --quality-steps 0

A training step is the Critic's own: the TD3 target (smoothing noise, the
target network's twins, in FP32), then `GuardedTraining.step` (autocast
forward, ``mse(q1, y) + mse(q2, y)``, backward, Adam) and the Polyak update;
``Critic._train_sync`` runs ``--steps`` of them unguarded, and the per-call
work (normaliser, validation) is amortised in the figure. The clock is the
thread's CPU time (time.thread_time) with one torch thread, so other
processes on a shared machine cost little; precisions and sizes are
interleaved round by round and the median is reported.

Quality: each size trains ``--quality-steps`` steps on a one-step task
(every transition terminal, so Q(s, a) = r(s, a)) with a smooth nonlinear
reward of the env's sizes; ``val`` is the held-out TD loss in value units
(the sum over the two twins of the share of the reward's variance left unexplained: 2 is nothing learned).

Measured (torch 2.13.0+cpu, flags amx_bf16 avx2 avx512_bf16, one thread,
batch 256, median of 3 rounds x 50 steps, 1500 quality steps on 4096
transitions; ``--rounds 3 --steps 50``):

    env          hidden  fp32 ms  bf16 ms  bf16 x  val fp32  val bf16
    Pendulum         64    1.561    1.786    0.87    0.0185    0.0186
    Pendulum        128    2.154    2.296    0.94    0.0104    0.0104
    Pendulum        256    4.161    3.635    1.14    0.0074    0.0075
    HalfCheetah      64    1.576    1.837    0.86    0.2653    0.2650
    HalfCheetah     128    2.205    2.383    0.93    0.2828    0.2821
    HalfCheetah     256    4.275    3.742    1.14    0.2524    0.2528

Hence the default of 64 units, in FP32 unless a ledger or setting says
otherwise: BF16 pays only from 256 units on this host, and at 64 the step is
mostly per-step overhead (target, guard, Adam), not matrix work.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from genesis_fp16.training.guarded import UNGUARDED  # noqa: E402
from genesis_fp16.base.seeds import torch_generator  # noqa: E402
from infrastructure.critic import Critic  # noqa: E402
from infrastructure.transitions import Transitions  # noqa: E402

ENVS = {"Pendulum": (3, 1, 2.0), "HalfCheetah": (17, 6, 1.0)}  # obs_dim, act_dim, action bound


def _flags() -> list[str]:
    from genesis_fp16.precision.capability import cpu_flags

    return sorted(cpu_flags() & {"amx_bf16", "avx512_bf16", "avx2"})


def _task(obs_dim: int, act_dim: int, bound: float, n: int, seed: int) -> Transitions:
    g = torch_generator(seed, "bench_critic.task")
    w, v = torch.randn(obs_dim, 8, generator=g) / obs_dim**0.5, torch.randn(act_dim, 8, generator=g) / act_dim**0.5
    obs = torch.randn(n, obs_dim, generator=g)
    act = (torch.rand(n, act_dim, generator=g) * 2 - 1) * bound
    rew = (torch.sin(obs @ w) * torch.tanh(act @ v / bound)).sum(1) - 0.1 * (act**2).sum(1)
    return Transitions(obs, act, rew, torch.randn(n, obs_dim, generator=g), torch.ones(n))


def _critic(obs_dim: int, act_dim: int, bound: float, hidden: int, precision: str, batch: int) -> Critic:
    return Critic(
        obs_dim,
        act_dim,
        action_low=[-bound] * act_dim,
        action_high=[bound] * act_dim,
        precision=precision,
        guard=UNGUARDED,
        hidden=hidden,
        batch_size=batch,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hiddens", default="64,128,256")
    parser.add_argument("--envs", default="Pendulum,HalfCheetah")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=100, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quality-steps", type=int, default=1500)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    hiddens = [int(h) for h in args.hiddens.split(",")]
    envs = [e for e in args.envs.split(",") if e]
    precisions = ("fp32", "bf16")
    configs = [(e, h, p) for e in envs for h in hiddens for p in precisions]
    critics, data = {}, {}
    for env in envs:
        obs_dim, act_dim, bound = ENVS[env]
        data[env] = _task(obs_dim, act_dim, bound, 4096, 0)
    for env, hidden, prec in configs:
        critics[(env, hidden, prec)] = _critic(*ENVS[env], hidden, prec, args.batch)

    def policy_for(act_dim: int):
        return lambda obs: torch.zeros(len(obs), act_dim)

    load_before = os.getloadavg()
    times: dict[tuple, list[float]] = {c: [] for c in configs}
    for c in configs:  # warm-up: the first call builds the trainer
        critics[c]._train_sync(data[c[0]], policy_for(ENVS[c[0]][1]), 10, False)
    for _ in range(args.rounds):
        for c in configs:
            start = time.thread_time()
            critics[c]._train_sync(data[c[0]], policy_for(ENVS[c[0]][1]), args.steps, False)
            times[c].append((time.thread_time() - start) / args.steps * 1e3)
    quality: dict[tuple, float] = {}
    if args.quality_steps:
        for env, hidden, prec in configs:
            obs_dim, act_dim, bound = ENVS[env]
            critic = _critic(obs_dim, act_dim, bound, hidden, prec, args.batch)
            quality[(env, hidden, prec)] = critic._train_sync(
                data[env], policy_for(act_dim), args.quality_steps, False
            ).val_loss
    rows = []
    for env in envs:
        for hidden in hiddens:
            fp32, bf16 = (statistics.median(times[(env, hidden, p)]) for p in precisions)
            rows.append(
                {
                    "env": env,
                    "hidden": hidden,
                    "fp32_ms": round(fp32, 3),
                    "bf16_ms": round(bf16, 3),
                    "bf16_speedup": round(fp32 / bf16, 2),
                    "val_fp32": quality.get((env, hidden, "fp32")),
                    "val_bf16": quality.get((env, hidden, "bf16")),
                }
            )
    result: dict[str, Any] = {
        "torch": torch.__version__,
        "cpu_flags": _flags(),
        "cpu": platform.processor() or platform.machine(),
        "batch": args.batch,
        "steps": args.steps,
        "rounds": args.rounds,
        "quality_steps": args.quality_steps,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "rows": rows,
    }
    print(
        f"torch {result['torch']}, CPU flags {' '.join(result['cpu_flags'])}, one thread, batch {args.batch}, "
        f"median of {args.rounds} rounds x {args.steps} steps (ms CPU per step); loadavg {load_before[0]:.2f} -> "
        f"{os.getloadavg()[0]:.2f}"
    )
    print(f"{'env':<12}{'hidden':>7}{'fp32 ms':>9}{'bf16 ms':>9}{'bf16 x':>8}{'val fp32':>10}{'val bf16':>10}")
    for r in rows:
        val = "".join(f"{v:>10.4f}" if v is not None else f"{'-':>10}" for v in (r["val_fp32"], r["val_bf16"]))
        print(f"{r['env']:<12}{r['hidden']:>7}{r['fp32_ms']:>9.3f}{r['bf16_ms']:>9.3f}{r['bf16_speedup']:>8.2f}{val}")
    print(json.dumps(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

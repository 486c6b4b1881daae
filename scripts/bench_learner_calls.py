"""Time whole training calls of the world model and the critic by CPU clock:
``WorldModel``'s and ``Critic``'s ``train()`` work (run inline, without the
event loop's worker thread), unguarded, per precision.

    python scripts/bench_learner_calls.py [--steps 200] [--rounds 5] [--precisions fp32 bf16 fp16] [--json out.json]

One torch thread and the thread's CPU time (``time.thread_time``), so other
processes on a shared machine cost little; precisions are interleaved round
by round (after one warm-up call each) and the median call is reported, with
the load average before and after. The data: 6 trajectories of 100 steps of
a 3-dimensional system with one action (Pendulum's sizes), each learner at its
default size.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))


def _cpu_flags() -> str:
    from genesis_fp16.precision.capability import cpu_flags

    flags = cpu_flags()
    return " ".join(f for f in ("amx_bf16", "avx512_bf16", "avx512f", "avx2") if f in flags) or "unknown"


def calls(precision: str, steps: int, state: Path) -> dict[str, Callable[[], Any]]:
    from count_host_reads import _trajectories

    from genesis_fp16.training.guarded import UNGUARDED
    from genesis_fp16.base.settings import load_settings
    from infrastructure.critic import Critic
    from infrastructure.transitions import Transitions
    from infrastructure.world_model import WorldModel

    trajs = _trajectories()
    wm = WorldModel(
        3,
        1,
        precision=precision,
        guard=UNGUARDED,
        checkpoint_dir=state / f"wm-{precision}",
        seed=0,
        settings=load_settings(state_dir=state),
    )
    critic = Critic(
        3,
        1,
        action_low=[-2.0],
        action_high=[2.0],
        precision=precision,
        guard=UNGUARDED,
        checkpoint_dir=state / f"critic-{precision}",
        seed=0,
        settings=load_settings(state_dir=state),
    )
    data = Transitions.from_trajectories(trajs)

    def policy(obs: torch.Tensor) -> torch.Tensor:
        return torch.zeros(len(obs), 1)

    return {
        "world_model": lambda: wm._train_sync(trajs, steps, False),
        "critic": lambda: critic._train_sync(data, policy, steps, False),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16", "fp16"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        runs = {p: calls(p, args.steps, Path(tmp)) for p in args.precisions}
        for p in args.precisions:  # warm-up: the trainers built, the first call's set-up
            for fn in runs[p].values():
                fn()
        for _ in range(args.rounds):
            for p in args.precisions:
                for name, fn in runs[p].items():
                    start = time.thread_time()
                    fn()
                    times.setdefault((name, p), []).append(time.thread_time() - start)
    rows = [
        {"learner": name, "precision": p, "steps": args.steps, "median_cpu_s": statistics.median(t), "rounds": t}
        for (name, p), t in times.items()
    ]
    for row in rows:
        print(
            f"{row['learner']:12s} {row['precision']:5s} {args.steps} steps: {row['median_cpu_s'] * 1000:.1f} CPU-ms "
            "a call "
            f"({row['median_cpu_s'] / args.steps * 1e6:.0f} us a step)"
        )
    meta = {
        "torch": torch.__version__,
        "cpu_flags": _cpu_flags(),
        "machine": platform.machine(),
        "threads": 1,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d"),
    }
    print(
        f"torch {meta['torch']}, CPU flags {meta['cpu_flags']}, load {load_before[0]:.2f} -> "
        f"{meta['load_after'][0]:.2f}"
    )
    if args.json:
        args.json.write_text(json.dumps({**meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

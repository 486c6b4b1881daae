"""Time the world model's training at each torch thread count: the figure
behind GENESIS_FP16_TORCH_THREADS's default (docs/EMBEDDING.md).

    python scripts/bench_torch_threads.py --steps 200 --repeats 3 --json out.json

One process; the counts alternate (1, torch's default, 1, ...) so that a change
of load hits both. Wall time is what a user waits; process CPU time shows what
extra threads cost the machine. The load average before and after is printed:
on a shared machine a wall-clock ratio under load says how threads behave
under that load, nothing more.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from genesis_fp16_tools.bench.stamp import INTERESTING_FLAGS
from genesis_fp16.training.guarded import UNGUARDED
from genesis_fp16.precision.capability import cpu_flags
from genesis_fp16.base.seeds import numpy_rng
from genesis_fp16.base.settings import Settings
from infrastructure.trajectory import Trajectory
from infrastructure.world_model import WorldModel


def _trajectories(n: int, length: int, obs_dim: int, act_dim: int) -> list[Trajectory]:
    rng = numpy_rng(0, "bench_torch_threads.trajectories")
    out = []
    for _ in range(n):
        obs = rng.normal(size=(length + 1, obs_dim)).astype(np.float32)
        out.append(
            Trajectory(
                obs=obs[:-1],
                action=rng.normal(size=(length, act_dim)),
                reward=rng.normal(size=length),
                next_obs=obs[1:],
                done=np.zeros(length, dtype=bool),
            )
        )
    return out


def _time_train(threads: int, steps: int, trajs: list[Trajectory], state_dir: Path) -> dict[str, float]:
    settings = Settings(state_dir=state_dir, torch_threads=threads, precision="fp32")
    wm = WorldModel(
        trajs[0].obs.shape[1],
        trajs[0].action.shape[1],
        agent="threads_bench",
        guard=UNGUARDED,
        settings=settings,
        seed=0,
    )
    wall, cpu = time.perf_counter(), time.process_time()
    asyncio.run(wm.train(steps, trajectories=trajs, save=False))
    return {"wall_s": time.perf_counter() - wall, "process_cpu_s": time.process_time() - cpu}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps per timing (default 200)")
    parser.add_argument("--repeats", type=int, default=3, help="timings per thread count (default 3)")
    parser.add_argument("--obs-dim", type=int, default=4)
    parser.add_argument("--act-dim", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="write the figures to this file")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.repeats < 1:
        parser.error("--steps and --repeats must be positive")

    default = torch.get_num_threads()
    counts = [1] if default == 1 else [1, default]
    trajs = _trajectories(16, 200, args.obs_dim, args.act_dim)
    state_dir = Path(tempfile.mkdtemp(prefix="threads_bench_"))
    load_before = os.getloadavg()
    _time_train(1, 5, trajs, state_dir)  # warm-up: first-call costs out of the figures
    runs: dict[int, list[dict[str, float]]] = {c: [] for c in counts}
    for _ in range(args.repeats):
        for count in counts:
            runs[count].append(_time_train(count, args.steps, trajs, state_dir))
    load_after = os.getloadavg()
    rows = []
    for count in counts:
        walls = sorted(r["wall_s"] for r in runs[count])
        cpus = sorted(r["process_cpu_s"] for r in runs[count])
        rows.append(
            {
                "threads": count,
                "median_wall_s": walls[len(walls) // 2],
                "median_process_cpu_s": cpus[len(cpus) // 2],
                "wall_s": walls,
                "process_cpu_s": cpus,
            }
        )
    report = {
        "command": " ".join([Path(sys.argv[0]).name] + (argv if argv is not None else sys.argv[1:])),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "cpu_flags": sorted(f for f in cpu_flags() if f in INTERESTING_FLAGS),
        "torch_default_threads": default,
        "load_average_before_after": [round(load_before[0], 2), round(load_after[0], 2)],
        "workload": f"WorldModel.train({args.steps}) on {args.obs_dim}+{args.act_dim} inputs, hidden 64, batch 256, "
        "fp32",
        "rows": rows,
    }
    print(
        f"{report['workload']}; torch {report['torch']}; CPU flags {' '.join(report['cpu_flags'])}; "
        f"load {report['load_average_before_after'][0]} -> {report['load_average_before_after'][1]}"
    )
    for row in rows:
        print(
            f"threads {row['threads']:>3}: median wall {row['median_wall_s']:.3f} s, process CPU "
            f"{row['median_process_cpu_s']:.3f} s"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

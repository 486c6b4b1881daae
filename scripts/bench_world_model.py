"""Time the world model's ensemble: one training step in each precision, and
one imagination step, for a grid of sizes; the figures behind WorldModel's
default size.

    python scripts/bench_world_model.py --json out.json
    python scripts/bench_world_model.py --ensembles 5 --hiddens 64,200 --layers 2,4 --device cuda
    python scripts/bench_world_model.py --disagreement Pendulum-v1,InvertedPendulum-v5,Swimmer-v5

A training step is `GuardedTraining`'s: the trainer's autocast forward,
`ensemble_loss` (beta-NLL over a batch per member), backward and Adam, through
``registry.create_trainer``. An imagination step is one batched ensemble
forward for P candidates x S starts x K particles (plus the policy, the
sampling and the bookkeeping), in FP32 as imagination runs, timed over a
short horizon and divided by it. On the CPU the clock is the thread's CPU
time (time.thread_time) with one torch thread, so other processes on a
shared machine cost little; the load average before and after is printed
all the same. On CUDA the clock is the wall clock around synchronised work.
The first steps of each timing are a warm-up and are not counted.

``--disagreement TASKS`` measures instead what imagination's truncation
threshold catches: per task, a default WorldModel trained on one real
episode of each of 16 random policies (as the loop's first generation), then
the share of imagined rollouts truncated at each threshold for the data's own
policies from the data's start states (in distribution: the threshold should
rarely fire), for 16 unseen random policies (the candidates the loop ranks),
and from start states 8 standard deviations outside the data (off
distribution: it should fire).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from genesis_fp16 import registry
from genesis_fp16.bench.stamp import INTERESTING_FLAGS
from genesis_fp16.config import FP16TrainingConfig
from genesis_fp16.precision import capability, cpu_flags
from genesis_fp16.settings import PrecisionMode
from infrastructure.ensemble import EnsembleDynamics, ensemble_loss
from infrastructure.imagination import DEFAULT_PARTICLES, imagine_uncertain


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _clock(device: torch.device) -> Callable[[], float]:
    if device.type == "cuda":
        def wall() -> float:
            torch.cuda.synchronize(device)
            return time.perf_counter()
        return wall
    return time.thread_time


def _model(obs_dim: int, act_dim: int, ensemble: int, hidden: int, layers: int, device: torch.device) -> EnsembleDynamics:
    torch.manual_seed(0)
    model = EnsembleDynamics(obs_dim, act_dim, ensemble=ensemble, hidden=hidden, layers=layers).to(device)
    x = torch.randn(4096, obs_dim + act_dim, device=device)
    y = torch.randn(4096, obs_dim + 1, device=device)
    model.fit_normaliser(x, y)
    return model


def time_train_step(model: EnsembleDynamics, precision: str, batch: int, steps: int, warmup: int) -> float:
    """Seconds per optimizer step of ``model`` in ``precision`` (batch per member)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    trainer = registry.create_trainer(precision, model, optimizer, FP16TrainingConfig(precision=precision))
    device = next(model.parameters()).device
    n_in = model.obs_dim + model.act_dim
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(model.members, batch, n_in, generator=gen).to(device), torch.randn(model.members, batch, model.n_gauss, generator=gen).to(device))
               for _ in range(8)]
    clock = _clock(device)
    for k in range(warmup):
        trainer.backward_and_step(trainer.training_step(batches[k % 8], ensemble_loss))
    started = clock()
    for k in range(steps):
        trainer.backward_and_step(trainer.training_step(batches[k % 8], ensemble_loss))
    return (clock() - started) / steps


def time_imagine_step(model: EnsembleDynamics, candidates: int, starts: int, particles: int, horizon: int) -> float:
    """Seconds per imagined time step for ``candidates`` x ``starts`` x ``particles`` rows."""
    device = next(model.parameters()).device
    params = torch.randn(candidates, model.obs_dim * model.act_dim, generator=torch.Generator().manual_seed(1)).numpy()
    start = np.random.default_rng(0).normal(size=(starts, model.obs_dim)).astype(np.float32)

    def policy(p: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.bmm(obs, p.reshape(p.shape[0], model.obs_dim, model.act_dim)))

    clock = _clock(device)
    imagine_uncertain(model, policy, params, start, 2, particles=particles)  # warm-up
    started = clock()
    imagine_uncertain(model, policy, params, start, horizon, particles=particles)
    return (clock() - started) / horizon


def precisions_for(device: torch.device, asked: list[str]) -> list[str]:
    """fp32 and each asked mode the device runs (fp16 only where it is native: CUDA)."""
    out = []
    for name in asked:
        mode = PrecisionMode(name)
        support = capability.device_support(device, mode)
        if mode == PrecisionMode.FP32 or support == capability.Support.NATIVE or (mode == PrecisionMode.BF16 and support != capability.Support.NONE):
            out.append(name)
    return out


def disagreement(task_names: list[str], thresholds: list[float], horizon: int, steps: int) -> list[dict[str, Any]]:
    """The truncated share per task, rollout set and threshold (see the module's docstring)."""
    import asyncio
    import tempfile

    from agents.tasks.episodes import run_episodes
    from agents.tasks.registry import get_task
    from agents.tasks.torch_policy import BatchedPolicy, clamp_projection
    from genesis_fp16.guarded import UNGUARDED
    from genesis_fp16.settings import Settings
    from infrastructure.trajectory import trajectories_from_episodes
    from infrastructure.world_model import WorldModel

    out = []
    for name in task_names:
        task = get_task(name).resolve()
        rng = np.random.default_rng(0)
        params = task.policy.random_params(rng, 16, 1.0)
        starts = task.start_states(0).train
        trajs = []
        for k, p in enumerate(params):
            trajs += trajectories_from_episodes(run_episodes(task.episode_spec, p, [starts[k % len(starts)]])["episodes"], f"c{k}")
        with tempfile.TemporaryDirectory() as state:
            wm = WorldModel(task.policy.obs_dim, task.policy.act_dim, guard=UNGUARDED, done_head=task.learns_termination,
                            settings=Settings(state_dir=Path(state), precision="fp32"), seed=0)
            asyncio.run(wm.train(steps, trajectories=trajs, save=False))
        policy = BatchedPolicy(task.policy)
        project = task.task.project or clamp_projection(task.obs_low, task.obs_high, data=wm.observed_region())
        data_starts = np.stack([t.obs[0] for t in trajs])
        mean, std = wm.model.x_mean[: task.policy.obs_dim].cpu().numpy(), wm.model.x_std[: task.policy.obs_dim].cpu().numpy()
        far = mean + 8.0 * std * np.where(np.arange(len(mean)) % 2 == 0, 1.0, -1.0)
        sets = {"data policies": (params, data_starts), "unseen policies": (task.policy.random_params(rng, 16, 1.0), data_starts),
                "starts 8 std out": (params, far[None].astype(np.float32))}
        h = min(horizon, task.episode_steps)
        for label, (cand, start) in sets.items():
            row: dict[str, Any] = {"task": name, "rollouts": label, "horizon": h, "transitions": sum(len(t.obs) for t in trajs)}
            for limit in thresholds:
                imagined = wm.imagine_uncertain(policy, cand, start, h, project=project, terminated=task.task.termination, max_disagreement=limit)
                row[f"truncated@{limit:g}"] = float(imagined.truncated.mean())
            print("| " + " | ".join(str(v if not isinstance(v, float) else f"{v:.2f}") for v in row.values()) + " |", flush=True)
            out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    parser.add_argument("--ensembles", type=_ints, default=[1, 5, 7], help="members, comma-separated (default 1,5,7)")
    parser.add_argument("--hiddens", type=_ints, default=[64, 128, 200, 256], help="hidden units (default 64,128,200,256)")
    parser.add_argument("--layers", type=_ints, default=[2, 3, 4], help="hidden layers (default 2,3,4)")
    parser.add_argument("--precisions", default="fp32,bf16,fp16", help="asked precisions; fp16 runs only where native (CUDA)")
    parser.add_argument("--batch", type=int, default=256, help="transitions per member per step (default 256)")
    parser.add_argument("--steps", type=int, default=30, help="timed training steps (default 30)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed training steps first (default 5)")
    parser.add_argument("--obs-dim", type=int, default=8, help="observation size (default 8: Swimmer's)")
    parser.add_argument("--act-dim", type=int, default=2, help="action size (default 2: Swimmer's)")
    parser.add_argument("--candidates", type=int, default=16, help="imagination: P candidates (default 16, the loop's popsize)")
    parser.add_argument("--starts", type=int, default=32, help="imagination: S start states (default 32: 16 train + 16 extra)")
    parser.add_argument("--particles", type=int, default=DEFAULT_PARTICLES, help=f"imagination: K particles (default {DEFAULT_PARTICLES})")
    parser.add_argument("--horizon", type=int, default=20, help="imagination: timed steps (default 20)")
    parser.add_argument("--disagreement", default=None, help="measure truncation for these tasks instead (comma-separated)")
    parser.add_argument("--thresholds", default="0.25,0.5,1,2,4", help="--disagreement: max_disagreement values (default 0.25,0.5,1,2,4)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures to this file")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    if args.disagreement:
        thresholds = [float(v) for v in args.thresholds.split(",")]
        print("| task | rollouts | horizon | transitions | " + " | ".join(f"truncated at {v:g}" for v in thresholds) + " |")
        print("|" + "---|" * (4 + len(thresholds)))
        table = disagreement(args.disagreement.split(","), thresholds, horizon=200, steps=800)
        if args.json is not None:
            args.json.write_text(json.dumps({"tool": "scripts/bench_world_model.py", "command": " ".join(sys.argv), "rows": table}, indent=2))
        return 0
    device = torch.device(args.device)
    precisions = precisions_for(device, args.precisions.split(","))
    load_before = os.getloadavg()
    flags = sorted(f for f in cpu_flags() if f in INTERESTING_FLAGS)
    print(f"# device {device}, torch {torch.__version__}, 1 torch thread, CPU flags {' '.join(flags) or '-'}")
    print(f"# load average before: {' '.join(f'{v:.2f}' for v in load_before)}")
    rows_per_step = args.candidates * args.starts * args.particles
    header = ["E", "hidden", "layers", *[f"{p} ms/step" for p in precisions], *[f"{p}/fp32" for p in precisions if p != "fp32"],
              f"imagine ms/step ({rows_per_step} rows)"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    rows: list[dict[str, Any]] = []
    for ensemble, hidden, layers in itertools.product(args.ensembles, args.hiddens, args.layers):
        row: dict[str, Any] = {"ensemble": ensemble, "hidden": hidden, "layers": layers}
        for precision in precisions:
            model = _model(args.obs_dim, args.act_dim, ensemble, hidden, layers, device)
            row[f"{precision}_s"] = time_train_step(model, precision, args.batch, args.steps, args.warmup)
        model = _model(args.obs_dim, args.act_dim, ensemble, hidden, layers, device)
        row["imagine_step_s"] = time_imagine_step(model, args.candidates, args.starts, args.particles, args.horizon)
        ratios = [row["fp32_s"] / row[f"{p}_s"] for p in precisions if p != "fp32"]
        for p, ratio in zip([p for p in precisions if p != "fp32"], ratios):
            row[f"{p}_speedup"] = ratio
        cells = [ensemble, hidden, layers, *[f"{row[f'{p}_s'] * 1e3:.2f}" for p in precisions], *[f"{r:.2f}x" for r in ratios],
                 f"{row['imagine_step_s'] * 1e3:.2f}"]
        print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)
        rows.append(row)
    load_after = os.getloadavg()
    print(f"# load average after: {' '.join(f'{v:.2f}' for v in load_after)}")
    if args.json is not None:
        args.json.write_text(json.dumps({
            "tool": "scripts/bench_world_model.py", "command": " ".join(sys.argv), "device": str(device),
            "torch": torch.__version__, "cpu_flags": flags, "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "load_before": load_before, "load_after": load_after, "batch_per_member": args.batch,
            "imagine_rows": rows_per_step, "rows": rows,
        }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

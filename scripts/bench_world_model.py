"""Time the world model's ensemble: one training step in each precision, and
one step of its rollouts, for a grid of sizes; the figures behind
WorldModel's default size.

    python scripts/bench_world_model.py --json out.json
    python scripts/bench_world_model.py --ensembles 5 --hiddens 64,200 --layers 2,4 --device cuda
    python scripts/bench_world_model.py --disagreement Pendulum-v1,InvertedPendulum-v5,Swimmer-v5

A training step is `GuardedTraining`'s: the trainer's autocast forward,
`ensemble_loss` (beta-NLL over a batch per member), backward and Adam, through
``registry.create_trainer``. A rollout step is `ModelEnv.step` on ``--rows``
rows (one batched forward of the elites, the draws, the sampling and the
disagreement), in FP32 as rollouts run, timed over a short horizon and
divided by it. On the CPU the clock is the thread's CPU
time (time.thread_time) with one torch thread, so other processes on a
shared machine cost little; the load average before and after is printed
all the same. On CUDA the clock is the wall clock around synchronised work.
The first steps of each timing are a warm-up and are not counted.

``--train-calls`` times instead what the learners run: `WorldModel.train`
(a call of ``--steps`` steps in training windows, after one untimed call of
the same size) with its window's steps captured as CUDA graphs and eager
(``FP16TrainingConfig.capture``), per precision, ensemble and hidden size, on
synthetic trajectories of ``--obs-dim`` / ``--act-dim``; per step it is the
call's time over its steps (the validation and elites at the call's end
included), and the graphs captured and replayed are reported beside it:

    python scripts/bench_world_model.py --train-calls --device cuda --ensembles 5 --hiddens 128,512 --layers 4

``--disagreement TASKS`` measures instead what the rollouts' disagreement
threshold catches: per task, a default WorldModel trained on one real
episode of each of 16 random policies, then the share of rows cut within
``--rollout-horizon`` steps (`infrastructure.model_env.branched_rollouts`) at
each threshold, for the data's own policies from real states of the data (in
distribution: the threshold should rarely fire), for 16 unseen random
policies from the same states, and from states 8 standard deviations outside
the data (off distribution: it should fire).
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

from genesis_fp16.training import registry
from genesis_fp16_tools.bench.stamp import INTERESTING_FLAGS
from genesis_fp16.training.config import FP16TrainingConfig
from genesis_fp16.base.seeds import numpy_rng, torch_generator
from genesis_fp16.precision import capability
from genesis_fp16.precision.capability import cpu_flags
from genesis_fp16.base.settings import PrecisionMode
from infrastructure.ensemble import EnsembleDynamics, ensemble_loss
from infrastructure.model_env import ModelEnv


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _clock(device: torch.device) -> Callable[[], float]:
    if device.type == "cuda":

        def wall() -> float:
            torch.cuda.synchronize(device)
            return time.perf_counter()

        return wall
    return time.thread_time


def _model(
    obs_dim: int, act_dim: int, ensemble: int, hidden: int, layers: int, device: torch.device
) -> EnsembleDynamics:
    gen = torch_generator(0, "bench_world_model.model")  # a private generator: torch's global one is left as it was
    model = EnsembleDynamics(obs_dim, act_dim, ensemble=ensemble, hidden=hidden, layers=layers, generator=gen).to(
        device
    )
    x = torch.randn(4096, obs_dim + act_dim, generator=gen).to(device)
    y = torch.randn(4096, obs_dim + 1, generator=gen).to(device)
    model.fit_normaliser(x, y)
    return model


def time_train_step(model: EnsembleDynamics, precision: str, batch: int, steps: int, warmup: int) -> float:
    """Seconds per optimizer step of ``model`` in ``precision`` (batch per member)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    trainer = registry.create_trainer(precision, model, optimizer, FP16TrainingConfig(precision=precision))
    device = next(model.parameters()).device
    n_in = model.obs_dim + model.act_dim
    gen = torch_generator(0, "bench_world_model.train_batches")
    batches = [
        (
            torch.randn(model.members, batch, n_in, generator=gen).to(device),
            torch.randn(model.members, batch, model.n_gauss, generator=gen).to(device),
        )
        for _ in range(8)
    ]
    clock = _clock(device)
    for k in range(warmup):
        trainer.backward_and_step(trainer.training_step(batches[k % 8], ensemble_loss))
    started = clock()
    for k in range(steps):
        trainer.backward_and_step(trainer.training_step(batches[k % 8], ensemble_loss))
    return (clock() - started) / steps


def time_rollout_step(model: EnsembleDynamics, rows: int, horizon: int) -> float:
    """Seconds per `ModelEnv.step` of ``rows`` rows (no cut: every row steps every time)."""
    device = next(model.parameters()).device
    model.member_val_loss.fill_(0.0)  # stands for a trained model's
    start = torch.randn(rows, model.obs_dim, generator=torch_generator(0, "bench_world_model.rollout_starts"))
    env = ModelEnv(model, seed=0, max_disagreement=float("inf"))

    def run(steps: int) -> None:
        obs = env.reset(start)
        for _ in range(steps):
            obs, *_ = env.step(torch.tanh(obs[:, : model.act_dim]))

    clock = _clock(device)
    run(2)  # warm-up
    started = clock()
    run(horizon)
    return (clock() - started) / horizon


def _synthetic_trajectories(obs_dim: int, act_dim: int, n: int = 8, length: int = 250) -> list[Any]:
    """A random linear system's episodes (``n`` of ``length`` steps): data for timing, not for learning."""
    from infrastructure.trajectory import Trajectory

    rng = numpy_rng(0, "bench_world_model.trajectories")
    a_mat = rng.normal(scale=0.1, size=(obs_dim, obs_dim))
    b_mat = rng.normal(scale=0.1, size=(obs_dim, act_dim))
    out = []
    for k in range(n):
        obs = rng.normal(size=(length + 1, obs_dim)).astype(np.float32)
        act = rng.uniform(-1, 1, size=(length, act_dim)).astype(np.float32)
        nxt = np.clip(obs[:-1] + obs[:-1] @ a_mat.T + act @ b_mat.T, -5, 5).astype(np.float32)
        rew = -(obs[:-1] ** 2).sum(1)
        out.append(
            Trajectory(
                obs=obs[:-1],
                action=act,
                reward=rew,
                next_obs=nxt,
                done=np.zeros(length, bool),
                candidate=f"s{k}",
                id=k + 1,
            )
        )
    return out


def time_train_call(
    device: torch.device, precision: str, ensemble: int, hidden: int, layers: int, obs_dim: int, act_dim: int,
    steps: int, capture: bool,
) -> dict[str, Any]:  # fmt: skip
    """Seconds per step of a `WorldModel.train` call of ``steps`` steps (after one untimed call), captured or not."""
    import asyncio
    import tempfile

    from genesis_fp16.base.settings import Settings
    from genesis_fp16.training.guarded import UNGUARDED
    from infrastructure.world_model import WorldModel

    trajs = _synthetic_trajectories(obs_dim, act_dim)
    with tempfile.TemporaryDirectory() as state:
        wm = WorldModel(
            obs_dim, act_dim, guard=UNGUARDED, device=str(device), precision=precision, ensemble=ensemble,
            hidden=hidden, layers=layers, settings=Settings(state_dir=Path(state)), seed=0,
        )  # fmt: skip
        wm.trainer.config.capture = capture
        asyncio.run(wm.train(steps, trajectories=trajs, save=False))  # warm-up: kernels, allocator, the capture
        # the call trains in a worker thread: on the CPU the process's CPU time, not this thread's
        clock = _clock(device) if device.type == "cuda" else time.process_time
        started = clock()
        report = asyncio.run(wm.train(steps, trajectories=trajs, save=False))
        seconds = clock() - started
        graphs = wm.trainer.step_graphs
        return {
            "precision": report.precision,
            "capture": capture,
            "s_per_step": seconds / steps,
            "val_loss": report.val_loss,
            "captures": graphs.captures if graphs is not None else 0,
            "replays": graphs.replays if graphs is not None else 0,
        }


def train_calls(args: argparse.Namespace, device: torch.device, precisions: list[str]) -> list[dict[str, Any]]:
    """`time_train_call` over the grid, captured and eager side by side (captured only on CUDA)."""
    captures = (True, False) if device.type == "cuda" else (False,)
    names = " | ".join(f"{'captured' if c else 'eager'} ms/step" for c in captures)
    tail = " | captured/eager speed-up | graphs captured / replayed |" if len(captures) == 2 else " |"
    print("| E | hidden | layers | precision | " + names + tail)
    print("|" + "---|" * (4 + len(captures) + (2 if len(captures) == 2 else 0)))
    rows = []
    for ensemble, hidden, layers in itertools.product(args.ensembles, args.hiddens, args.layers):
        for precision in precisions:
            timed = [
                time_train_call(
                    device, precision, ensemble, hidden, layers, args.obs_dim, args.act_dim, args.steps, capture
                )
                for capture in captures
            ]
            row: dict[str, Any] = {"ensemble": ensemble, "hidden": hidden, "layers": layers, "precision": precision}
            for t in timed:
                row["captured" if t["capture"] else "eager"] = t
            cells = [f"{t['s_per_step'] * 1e3:.3f}" for t in timed]
            if len(timed) == 2:
                row["captured_speedup"] = timed[1]["s_per_step"] / timed[0]["s_per_step"]
                cells += [f"{row['captured_speedup']:.2f}x", f"{timed[0]['captures']} / {timed[0]['replays']}"]
            print(f"| {ensemble} | {hidden} | {layers} | {precision} | " + " | ".join(cells) + " |", flush=True)
            rows.append(row)
    return rows


def precisions_for(device: torch.device, asked: list[str]) -> list[str]:
    """fp32 and each asked mode the device runs (fp16 only where it is native: CUDA)."""
    out = []
    for name in asked:
        mode = PrecisionMode(name)
        support = capability.device_support(device, mode)
        if (
            mode == PrecisionMode.FP32
            or support == capability.Support.NATIVE
            or (mode == PrecisionMode.BF16 and support != capability.Support.NONE)
        ):
            out.append(name)
    return out


def disagreement(task_names: list[str], thresholds: list[float], horizon: int, steps: int) -> list[dict[str, Any]]:
    """The share of rows cut per task, rollout set and threshold (see the module's docstring)."""
    import asyncio
    import tempfile

    from agents.tasks.episodes import run_episodes
    from agents.tasks.registry import get_task
    from agents.tasks.torch_policy import BatchedPolicy, clamp_projection
    from genesis_fp16.training.guarded import UNGUARDED
    from genesis_fp16.base.settings import Settings
    from infrastructure.model_env import branched_rollouts
    from infrastructure.trajectory import trajectories_from_episodes
    from infrastructure.world_model import WorldModel

    out = []
    for name in task_names:
        task = get_task(name).resolve()
        rng = numpy_rng(0, "bench_world_model.random_params")
        params = task.policy.random_params(rng, 16, 1.0)
        starts = task.start_states(0).train
        trajs = []
        for k, p in enumerate(params):
            trajs += trajectories_from_episodes(
                run_episodes(task.episode_spec, p, [starts[k % len(starts)]])["episodes"], f"c{k}"
            )
        with tempfile.TemporaryDirectory() as state:
            wm = WorldModel(
                task.policy.obs_dim,
                task.policy.act_dim,
                guard=UNGUARDED,
                done_head=task.learns_termination,
                settings=Settings(state_dir=Path(state), precision="fp32"),
                seed=0,
            )
            asyncio.run(wm.train(steps, trajectories=trajs, save=False))
        batched = BatchedPolicy(task.policy)
        project = task.task.project or clamp_projection(task.obs_low, task.obs_high, data=wm.observed_region())
        # 8 real states of each policy's own episode, spread over it; row r runs candidate r // 8
        real = np.concatenate([t.obs[np.linspace(0, len(t.obs) - 1, 8).astype(int)] for t in trajs]).astype(np.float32)
        mean, std = (
            wm.model.x_mean[: task.policy.obs_dim].cpu().numpy(),
            wm.model.x_std[: task.policy.obs_dim].cpu().numpy(),
        )
        far = (real + 8.0 * std * np.where(np.arange(len(mean)) % 2 == 0, 1.0, -1.0)).astype(np.float32)
        sets = {
            "data policies": (params, real),
            "unseen policies": (task.policy.random_params(rng, 16, 1.0), real),
            "states 8 std out": (params, far),
        }
        for label, (cand, start) in sets.items():
            row: dict[str, Any] = {
                "task": name,
                "rollouts": label,
                "horizon": horizon,
                "transitions": sum(len(t.obs) for t in trajs),
            }
            owner = torch.as_tensor(np.repeat(cand, len(start) // len(cand), axis=0), dtype=torch.float32)

            def policy(obs: torch.Tensor, owner: torch.Tensor = owner) -> torch.Tensor:  # row r runs its own candidate
                return batched(owner.to(obs.device), obs[:, None, :]).squeeze(1)

            for limit in thresholds:
                rolled = branched_rollouts(
                    wm,
                    policy,
                    start,
                    horizon,
                    terminated=task.task.termination,
                    project=project,
                    max_disagreement=limit,
                )
                row[f"cut@{limit:g}"] = rolled.stats.cut_share
            print(
                "| " + " | ".join(str(v if not isinstance(v, float) else f"{v:.2f}") for v in row.values()) + " |",
                flush=True,
            )
            out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    parser.add_argument("--ensembles", type=_ints, default=[1, 5, 7], help="members, comma-separated (default 1,5,7)")
    parser.add_argument(
        "--hiddens", type=_ints, default=[64, 128, 200, 256], help="hidden units (default 64,128,200,256)"
    )
    parser.add_argument("--layers", type=_ints, default=[2, 3, 4], help="hidden layers (default 2,3,4)")
    parser.add_argument(
        "--precisions", default="fp32,bf16,fp16", help="asked precisions; fp16 runs only where native (CUDA)"
    )
    parser.add_argument("--batch", type=int, default=256, help="transitions per member per step (default 256)")
    parser.add_argument("--steps", type=int, default=30, help="timed training steps (default 30)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed training steps first (default 5)")
    parser.add_argument("--obs-dim", type=int, default=8, help="observation size (default 8: Swimmer's)")
    parser.add_argument("--act-dim", type=int, default=2, help="action size (default 2: Swimmer's)")
    parser.add_argument("--rows", type=int, default=2560, help="rollouts: rows stepped at once (default 2560)")
    parser.add_argument("--horizon", type=int, default=20, help="rollouts: timed steps (default 20)")
    parser.add_argument(
        "--disagreement", default=None, help="measure truncation for these tasks instead (comma-separated)"
    )
    parser.add_argument(
        "--thresholds",
        default="0.25,0.5,1,2,4",
        help="--disagreement: max_disagreement values (default 0.25,0.5,1,2,4)",
    )
    parser.add_argument(
        "--rollout-horizon", type=int, default=10, help="--disagreement: steps per rollout (default 10)"
    )
    parser.add_argument(
        "--train-calls", action="store_true", help="time WorldModel.train calls, captured and eager, instead"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures to this file")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    if args.disagreement:
        thresholds = [float(v) for v in args.thresholds.split(",")]
        print("| task | rollouts | horizon | transitions | " + " | ".join(f"cut at {v:g}" for v in thresholds) + " |")
        print("|" + "---|" * (4 + len(thresholds)))
        table = disagreement(args.disagreement.split(","), thresholds, horizon=args.rollout_horizon, steps=800)
        if args.json is not None:
            args.json.write_text(
                json.dumps(
                    {"tool": "scripts/bench_world_model.py", "command": " ".join(sys.argv), "rows": table}, indent=2
                )
            )
        return 0
    device = torch.device(args.device)
    precisions = precisions_for(device, args.precisions.split(","))
    load_before = os.getloadavg()
    flags = sorted(f for f in cpu_flags() if f in INTERESTING_FLAGS)
    print(f"# device {device}, torch {torch.__version__}, 1 torch thread, CPU flags {' '.join(flags) or '-'}")
    print(f"# load average before: {' '.join(f'{v:.2f}' for v in load_before)}")
    if args.train_calls:
        from genesis_fp16.base.storage import atomic_write_text

        table = train_calls(args, device, precisions)
        if args.json is not None:
            atomic_write_text(
                args.json,
                json.dumps(
                    {
                        "tool": "scripts/bench_world_model.py --train-calls",
                        "command": " ".join(sys.argv),
                        "device": str(device),
                        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
                        "torch": torch.__version__,
                        "cpu_flags": flags,
                        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                        "steps_per_call": args.steps,
                        "rows": table,
                    },
                    indent=2,
                ),
            )
        return 0
    rows_per_step = args.rows
    header = [
        "E",
        "hidden",
        "layers",
        *[f"{p} ms/step" for p in precisions],
        *[f"{p}/fp32" for p in precisions if p != "fp32"],
        f"rollout ms/step ({rows_per_step} rows)",
    ]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    rows: list[dict[str, Any]] = []
    for ensemble, hidden, layers in itertools.product(args.ensembles, args.hiddens, args.layers):
        row: dict[str, Any] = {"ensemble": ensemble, "hidden": hidden, "layers": layers}
        for precision in precisions:
            model = _model(args.obs_dim, args.act_dim, ensemble, hidden, layers, device)
            row[f"{precision}_s"] = time_train_step(model, precision, args.batch, args.steps, args.warmup)
        model = _model(args.obs_dim, args.act_dim, ensemble, hidden, layers, device)
        row["rollout_step_s"] = time_rollout_step(model, args.rows, args.horizon)
        ratios = [row["fp32_s"] / row[f"{p}_s"] for p in precisions if p != "fp32"]
        for p, ratio in zip([p for p in precisions if p != "fp32"], ratios):
            row[f"{p}_speedup"] = ratio
        cells = [
            ensemble,
            hidden,
            layers,
            *[f"{row[f'{p}_s'] * 1e3:.2f}" for p in precisions],
            *[f"{r:.2f}x" for r in ratios],
            f"{row['rollout_step_s'] * 1e3:.2f}",
        ]
        print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)
        rows.append(row)
    load_after = os.getloadavg()
    print(f"# load average after: {' '.join(f'{v:.2f}' for v in load_after)}")
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "tool": "scripts/bench_world_model.py",
                    "command": " ".join(sys.argv),
                    "device": str(device),
                    "torch": torch.__version__,
                    "cpu_flags": flags,
                    "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "load_before": load_before,
                    "load_after": load_after,
                    "batch_per_member": args.batch,
                    "rollout_rows": rows_per_step,
                    "rows": rows,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

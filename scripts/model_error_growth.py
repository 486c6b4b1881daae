"""How fast the world model's open-loop error grows with the rollout length
on a task: the figure the loop's default rollout horizon is chosen by.

    python scripts/model_error_growth.py --env Pendulum-v1
    python scripts/model_error_growth.py --env InvertedPendulum-v5 --hmax 20 --json out.json

A model's rollouts are worth training a critic on only while they stay near
what the real environment would do; MBPO (Janner et al. 2019) keeps them
short for that reason. This script collects ``--episodes`` real episodes of
a few random policies (``--policies``; the loop's first data), trains a
`WorldModel` on them as the loop would, and then, on held-out episodes of
other random policies from held-out start states, branches a `ModelEnv`
rollout from every real state and replays the real actions for k = 1 ..
``--hmax`` steps. Per k it prints the error of the predicted observation
against the real one, in units of the training observations' standard
deviation (the root mean square over the windows and the dimensions); the
same for "nothing moves" (the start state as the prediction), to read the
model's error against; the number of windows (a window needs k more real
steps, so episodes that terminate early thin the long ones out); and the
share of rows the default disagreement threshold would have cut by step k.
The last line is the largest k whose error, and every shorter one's, stays
under ``--threshold``, and what ended it: a step over the threshold, too
few windows to measure the next step (short episodes: ask for more
``--heldout`` ones), or ``--hmax``.

The rollouts sample (an elite drawn per row and step, its Gaussian sampled),
as the loop's do, with no disagreement cut in the error (every window counts).
Training runs in FP32 with one torch thread.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from agents.tasks.episodes import run_episodes
from agents.tasks.registry import get_task
from agents.tasks.torch_policy import clamp_projection
from genesis_fp16_tools.bench.stamp import INTERESTING_FLAGS
from genesis_fp16.training.guarded import UNGUARDED
from genesis_fp16.precision.capability import cpu_flags
from genesis_fp16.base.seeds import numpy_rng
from genesis_fp16.base.settings import Settings
from infrastructure.model_env import DEFAULT_MAX_DISAGREEMENT, ModelEnv
from infrastructure.trajectory import Trajectory, trajectories_from_episodes
from infrastructure.world_model import WorldModel

MIN_WINDOWS = 20
"""A k with fewer windows than this is reported but not measured (its error is None)."""


def collect(task: Any, params: np.ndarray, states: np.ndarray, per_policy: int) -> list[Trajectory]:
    """``per_policy`` real episodes of each parameter vector, from consecutive rows of ``states``."""
    trajs: list[Trajectory] = []
    for k, p in enumerate(params):
        rows = [states[(k * per_policy + j) % len(states)] for j in range(per_policy)]
        trajs += trajectories_from_episodes(run_episodes(task.episode_spec, p, rows)["episodes"], f"random{k}")
    return trajs


def open_loop(env: ModelEnv, episodes: list[Trajectory], hmax: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """From every state of ``episodes``, the real actions replayed through ``env``:
    ``(predicted, real, valid)``, ``(hmax, R, obs_dim)`` twice and ``(hmax, R)``,
    R the windows' start states; ``valid[k-1]`` where the episode has k more steps."""
    starts = np.concatenate([t.obs for t in episodes])
    owner = np.concatenate([np.full(len(t.obs), i) for i, t in enumerate(episodes)])
    at = np.concatenate([np.arange(len(t.obs)) for t in episodes])
    lengths = np.array([len(t.obs) for t in episodes])[owner]
    act_dim = episodes[0].action.shape[1]
    predicted, real, valid = [], [], []
    obs = env.reset(starts)
    for k in range(1, hmax + 1):
        ok = at + k <= lengths
        index = np.minimum(at + k - 1, lengths - 1)
        action = np.stack(
            [episodes[o].action[i] if v else np.zeros(act_dim, np.float32) for o, i, v in zip(owner, index, ok)]
        )
        obs, _, _, _ = env.step(torch.as_tensor(action))
        predicted.append(obs.cpu().numpy())
        real.append(np.stack([episodes[o].next_obs[i] for o, i in zip(owner, index)]))
        valid.append(ok)
    return np.stack(predicted), np.stack(real), np.stack(valid)


def cut_by_step(env: ModelEnv, episodes: list[Trajectory], hmax: int) -> list[float]:
    """The share of rows the threshold of ``env`` has cut by each step, the real actions replayed."""
    shares = []
    starts = np.concatenate([t.obs for t in episodes])
    owner = np.concatenate([np.full(len(t.obs), i) for i, t in enumerate(episodes)])
    at = np.concatenate([np.arange(len(t.obs)) for t in episodes])
    env.reset(starts)
    for k in range(1, hmax + 1):
        index = np.minimum(at + k - 1, np.array([len(t.obs) for t in episodes])[owner] - 1)
        env.step(torch.as_tensor(np.stack([episodes[o].action[i] for o, i in zip(owner, index)])))
        shares.append(float(env.cut.float().mean()))
    return shares


def rms(diff: np.ndarray, scale: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(diff / scale))))


def measure(args: argparse.Namespace) -> dict[str, Any]:
    task = get_task(args.env).resolve()
    rng = numpy_rng(args.seed, "model_error_growth.random_params")
    split = task.start_states(args.seed)
    per_policy = max(1, args.episodes // args.policies)
    started = time.perf_counter()
    train = collect(task, task.policy.random_params(rng, args.policies, 1.0), split.train, per_policy)
    heldout = collect(task, task.policy.random_params(rng, args.heldout, 1.0), split.heldout, 1)
    collected = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as state:
        wm = WorldModel(
            task.policy.obs_dim,
            task.policy.act_dim,
            guard=UNGUARDED,
            done_head=task.learns_termination,
            settings=Settings(state_dir=Path(state), precision="fp32", torch_threads=1),
            seed=args.seed,
        )
        report = asyncio.run(wm.train(args.steps, trajectories=train, save=False))
    project = task.task.project or clamp_projection(task.obs_low, task.obs_high, data=wm.observed_region())
    scale = np.concatenate([t.obs for t in train]).std(0).clip(min=1e-6)
    env = ModelEnv(wm, project=project, seed=args.seed, max_disagreement=math.inf)
    predicted, real, valid = open_loop(env, heldout, args.hmax)
    starts = np.concatenate([t.obs for t in heldout])
    cut = cut_by_step(
        ModelEnv(wm, project=project, seed=args.seed, max_disagreement=DEFAULT_MAX_DISAGREEMENT), heldout, args.hmax
    )
    rows, horizon = [], 0
    for k in range(1, args.hmax + 1):
        ok = valid[k - 1]
        enough = int(ok.sum()) >= MIN_WINDOWS
        error = rms(predicted[k - 1][ok] - real[k - 1][ok], scale) if enough else None
        still = rms(starts[ok] - real[k - 1][ok], scale) if enough else None
        rows.append({"k": k, "windows": int(ok.sum()), "error": error, "persistence": still, "cut_share": cut[k - 1]})
        if horizon == k - 1 and error is not None and error < args.threshold:
            horizon = k
    # what ended the horizon: a step over the threshold, too few windows to measure the next step, or --hmax
    limited_by = "hmax" if horizon == args.hmax else ("windows" if rows[horizon]["error"] is None else "error")
    return {
        "env": args.env,
        "episodes": len(train),
        "transitions": sum(len(t.obs) for t in train),
        "heldout_episodes": len(heldout),
        "heldout_transitions": int(len(starts)),
        "train_steps": args.steps,
        "val_loss": report.val_loss,
        "threshold": args.threshold,
        "horizon": horizon,
        "limited_by": limited_by,
        "rows": rows,
        "collect_s": collected,
        "train_s": report.wall_s,
    }


def fmt(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3f}"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--env", default="Pendulum-v1", help="the task (a registered task or a gymnasium id; default Pendulum-v1)"
    )
    parser.add_argument("--episodes", type=int, default=16, help="real training episodes (default 16)")
    parser.add_argument(
        "--policies", type=int, default=4, help="random policies the training episodes come from (default 4)"
    )
    parser.add_argument(
        "--heldout", type=int, default=4, help="held-out episodes, each of its own random policy (default 4)"
    )
    parser.add_argument(
        "--steps", type=int, default=800, help="the world model's optimizer steps (default 800, WorldModel.train's)"
    )
    parser.add_argument("--hmax", type=int, default=30, help="the longest rollout measured (default 30)")
    parser.add_argument(
        "--threshold",
        type=float,
        default=0.25,
        help="the error, in observation standard deviations, a useful rollout stays under (default 0.25)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="policies, start states, the model and its draws (default 0)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    for name in ("episodes", "policies", "heldout", "steps", "hmax"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)}: expected at least 1")
    if not args.threshold > 0:
        parser.error(f"--threshold {args.threshold}: expected a number > 0")
    torch.set_num_threads(1)
    result = measure(args)
    flags = sorted(f for f in cpu_flags() if f in INTERESTING_FLAGS)
    print(
        f"# {args.env}: {result['episodes']} episodes ({result['transitions']} transitions) of {args.policies} random "
        "policies, "
        f"{args.steps} steps (val loss {result['val_loss']:.4f}); {result['heldout_episodes']} held-out episodes; "
        f"torch {torch.__version__}, CPU flags {' '.join(flags) or '-'}"
    )
    print("| k | windows | model error (obs std) | nothing moves | cut at the default threshold |")
    print("|---|---|---|---|---|")
    for row in result["rows"]:
        print(
            f"| {row['k']} | {row['windows']} | {fmt(row['error'])} | {fmt(row['persistence'])} | "
            f"{row['cut_share']:.2f} |"
        )
    why = {
        "error": f"step {result['horizon'] + 1} is over it",
        "hmax": "--hmax ends the measurement",
        "windows": f"step {result['horizon'] + 1} has fewer than {MIN_WINDOWS} held-out windows: collect more "
        "(--heldout)",
    }
    print(
        f"largest k with the error under {args.threshold:g} at every step up to it: {result['horizon']} "
        f"({why[result['limited_by']]})"
    )
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "tool": "scripts/model_error_growth.py",
                    "command": " ".join(sys.argv),
                    "torch": torch.__version__,
                    "cpu_flags": flags,
                    **result,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Can a world model trained on one run's replay data rank that run's candidates?

    .venv/bin/python scripts/imagination_ranking.py --report out.json --state-dir STATE \
        --horizons 50 100 200 1000 --ensembles 5 1

Reads an `evolve --json` report and the state dir it ran in (the replay buffer
and the run manifest), trains a fresh world model on every transition the run
collected, then imagines every candidate of the run's pool that has a real
return (its mean over the training start states it ran on) from the first
``--starts`` training start states, for each horizon, with and without
disagreement truncation, and prints the rank correlation (Spearman) of
imagined and real returns and the median imagined return. The model has seen
the candidates' own episodes, so this is an upper bound on how well it can
rank them (a diagnosis of the model and of imagination, not of the loop).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

import numpy as np
import torch

from agents.imagination_stats import spearman
from agents.tasks import get_task
from agents.tasks.torch_policy import BatchedPolicy, clamp_projection
from genesis_fp16.settings import load_settings
from infrastructure.replay_buffer import ReplayBuffer
from infrastructure.world_model import UNGUARDED, WorldModel


def _rho(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f}"  # None: too few candidates, or a constant side


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", required=True, help="an `evolve --json` report")
    parser.add_argument("--state-dir", required=True, help="the state dir the run used (replay buffer, run manifest)")
    parser.add_argument("--horizons", type=int, nargs="+", default=[50, 100, 200, 1000])
    parser.add_argument("--ensembles", type=int, nargs="+", default=[5, 1])
    parser.add_argument("--steps", type=int, default=2000, help="world-model optimizer steps")
    parser.add_argument("--starts", type=int, default=8, help="training start states to imagine from")
    parser.add_argument("--particles", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    report = json.loads(Path(args.report).read_text())
    settings = load_settings(state_dir=args.state_dir)
    task = get_task(report["env"]).resolve(policy=report["config"]["policy"], episode_steps=report["config"]["episode_steps"])
    manifest = json.loads(Path(report["run_manifest"]).read_text())
    pool = [c for c in manifest["pool"] if c.get("real_return") is not None and np.isfinite(c["real_return"])]
    params = np.array([c["params"] for c in pool])
    real = [float(c["real_return"]) for c in pool]
    starts = task.start_states(report["seed"]).train[: args.starts]
    if task.task.exact_states is not None:
        obs = task.task.exact_states.observe(starts).astype(np.float32)
    else:
        obs = task.reset_observations([int(s[0]) for s in starts])
    print(f"{report['env']} seed {report['seed']}: {len(pool)} candidates, real returns {min(real):.1f} .. {max(real):.1f} "
          f"(median {np.median(real):.1f})")
    buffer = ReplayBuffer(settings=settings)
    for ensemble in args.ensembles:
        with tempfile.TemporaryDirectory() as ckpt:
            wm = WorldModel(task.policy.obs_dim, task.policy.act_dim, buffer=buffer, data_agent=manifest["data_agent"], guard=UNGUARDED,
                            settings=settings, seed=report["seed"], ensemble=ensemble, probabilistic=ensemble > 1,
                            done_head=task.learns_termination, checkpoint_dir=ckpt)
            trained = asyncio.run(wm.train(args.steps, save=False))
            print(f"ensemble {ensemble}: validation loss {trained.val_loss:.4f} on {trained.transitions} transitions")
            policy = BatchedPolicy(task.policy)
            project = task.task.project or clamp_projection(task.obs_low, task.obs_high, data=wm.observed_region())
            for horizon in args.horizons:
                for max_disagreement in (None, float("inf")):
                    im = wm.imagine_uncertain(policy, params, obs, min(horizon, task.episode_steps), particles=args.particles, kappa=1.0,
                                              project=project, terminated=task.task.termination, episode_steps=task.episode_steps, seed=0,
                                              max_disagreement=max_disagreement)
                    rho_mean, rho_score = (_rho(spearman(list(v), real)) for v in (im.mean, im.score))
                    label = "default" if max_disagreement is None else "off"
                    print(f"  horizon {horizon:5d}, truncation {label:7s}: Spearman mean {rho_mean}, score (kappa 1) {rho_score}, "
                          f"truncated {im.truncated.mean():.2f}, median imagined {np.median(im.mean):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

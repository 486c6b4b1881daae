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
    parser.add_argument("--incumbent", action="store_true", help="also: the best candidate's one-step and open-loop predictions")
    parser.add_argument("--perturb", type=int, default=0, metavar="K", help="also: rank K policies around the best candidate")
    parser.add_argument("--sigma", type=float, default=0.3, help="distance of --perturb's policies, in the search's coordinates")
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
            if args.incumbent or args.perturb:
                closer_look(args, task, manifest, report["seed"], wm, policy, project, starts, obs)
    return 0


def closer_look(args: argparse.Namespace, task, manifest: dict, seed: int, wm: WorldModel, policy, project, starts, obs: np.ndarray) -> None:
    """``--incumbent`` and ``--perturb``: see the module docstring."""
    from agents.evaluation import Evaluator
    from agents.evolve_config import Candidate
    from agents.operators import best_of
    from agents.search_space import ObsStats

    best = best_of([c for c in (Candidate.from_dict(c) for c in manifest["pool"]) if c.full])
    if best is None:
        print("  no fully evaluated candidate: nothing to look at closer")
        return

    def imagine(params: np.ndarray, start_obs: np.ndarray, horizon: int, kappa: float, episode_steps: int):
        return wm.imagine_uncertain(policy, params, start_obs, horizon, particles=args.particles, kappa=kappa, project=project,
                                    terminated=task.task.termination, episode_steps=episode_steps, seed=0)

    with Evaluator(task, workers=1) as evaluator:
        if args.incumbent:
            run = evaluator.evaluate(best.params, starts)
            print(f"  incumbent {best.id} (pool return {best.real_return:.1f}): returns on {len(starts)} training start states "
                  + " / ".join(f"{r:.1f}" for r in run.returns))
            episode = run.episodes[0]
            next_obs, reward = wm.predict_sync(episode["obs"], episode["action"])
            real_r = np.asarray(episode["reward"], dtype=np.float64)
            pred_r = reward.numpy().astype(np.float64).reshape(-1)
            spread = np.maximum(np.asarray(episode["obs"]).std(0), 1e-8)
            err = np.abs(next_obs.numpy() - np.asarray(episode["next_obs"])).mean(0) / spread
            corr = float(np.corrcoef(real_r, pred_r)[0, 1]) if real_r.std() > 0 and pred_r.std() > 0 else float("nan")
            print(f"    one step, teacher-forced ({len(real_r)} steps): reward mean real {real_r.mean():.4f}, predicted {pred_r.mean():.4f}, "
                  f"mean abs error {np.abs(real_r - pred_r).mean():.4f}, correlation {corr:.3f}; next-observation error / spread per "
                  "dimension " + " ".join(f"{v:.3f}" for v in err))
            for horizon in args.horizons:
                h = min(horizon, len(real_r))
                im = imagine(best.params[None], obs[:1], h, kappa=0.0, episode_steps=h)  # the first h steps, no extrapolation
                print(f"    open loop, first {h} steps of start 0: real {real_r[:h].sum():.2f}, imagined {float(im.mean[0]):.2f} "
                      f"(+- {float(im.std[0]):.2f} over particles)")
        if args.perturb:
            space = ObsStats.from_dict(task.policy.obs_dim, manifest["obs_stats"]).space(task.policy)
            z0 = space.to_z(best.params)
            rng = np.random.default_rng(seed)
            raw = space.to_raw(z0 + args.sigma * rng.standard_normal((args.perturb, z0.size)))
            real = np.array([evaluator.evaluate(p, starts[:2]).mean_return for p in raw])
            horizon = max(args.horizons)
            im = imagine(raw, obs[:2], min(horizon, task.episode_steps), kappa=1.0, episode_steps=task.episode_steps)  # as the loop scores
            top = np.argsort(-np.asarray(im.score))[: max(1, args.perturb // 4)]
            print(f"  {args.perturb} policies at sigma {args.sigma} around the incumbent (2 start states, horizon {horizon}): real "
                  f"{real.min():.1f} .. {real.max():.1f} (mean {real.mean():.1f}); Spearman of the score {_rho(spearman(list(im.score), list(real)))}; "
                  f"real mean of the model's top {len(top)} {real[top].mean():.1f}")


if __name__ == "__main__":
    raise SystemExit(main())

"""ARS V2-t (Mania, Guy, Recht 2018, "Simple random search provides a
competitive approach to reinforcement learning", Algorithm 2).

A linear policy without bias, ``a = clip(M z, low, high)``, on observations
normalised by the running mean and std of every state seen in the training
rollouts (V2; ``normalize=False`` is V1: raw observations). Per iteration:
N directions ``delta ~ N(0, I)``, one episode each for ``M + nu delta`` and
``M - nu delta`` from the same start state (2N episodes), the b directions
with the largest ``max(r+, r-)`` kept (the "-t"), and
``M += alpha / (b sigma_R) * sum (r+ - r-) delta`` with ``sigma_R`` the std of
those 2b returns. The statistics are frozen within an iteration and updated
after it, as the paper's algorithm and code do. M starts at 0.

The paper's policy is unbounded and its actions go to the env as they are;
gymnasium's boxes are bounded, so actions are clipped to the box (not
squashed by tanh like the project's `PolicySpec`). Episodes run in this
process (``benchmarks.baselines.rollout``): ARS's policy is not a `PolicySpec`
the workers run. Direction ``d`` of the run starts from training start state
``d mod n_train``; an iteration is started only when its 2N episodes fit the
episode budget, and one cut short by an env-step budget is charged without
an update.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Optional

import numpy as np

from genesis_fp16.base.extras import require
from genesis_fp16.base.seeds import numpy_rng

from agents.tasks import ResolvedTask, Task
from .common import BaselineConfig, Clock, TargetWatch, baseline_report, target_states
from .normalization import RunningStats
from .rollout import EpisodeRunner, PolicyFn, mean_return

PURPOSE = "the ARS baseline"
ZOO = "RL Baselines3 Zoo hyperparams/ars.yml"


@dataclass(frozen=True)
class ARSHyper:
    """ARS's hyperparameters: step size alpha, exploration noise nu, N
    directions, the top b of them, V2 (normalised observations) or V1, and
    the reward shift (the paper subtracts the alive bonus on Hopper, Walker,
    Ant, Humanoid; 0 here). ``source`` says where the values come from."""

    step_size: float
    noise: float
    directions: int
    top: int
    normalize: bool = True
    shift: float = 0.0
    source: str = ""

    def validate(self) -> None:
        problems = []
        for name in ("step_size", "noise"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                problems.append(f"{name}={value}: expected a finite number > 0")
        if self.directions < 1:
            problems.append(f"directions={self.directions}: expected at least 1")
        if not 1 <= self.top <= self.directions:
            problems.append(f"top={self.top}: expected 1 <= top <= directions ({self.directions})")
        if problems:
            raise ValueError("ARS hyperparameters: " + "; ".join(problems))


# The paper's Table of hyperparameters could not be read from here; the RL Zoo
# lists the Swimmer and HalfCheetah values as its "params closest to original paper".
HYPERPARAMETERS = {
    "Swimmer-v5": ARSHyper(0.02, 0.01, 1, 1, source=f"the paper's Swimmer-v1 values as {ZOO} gives them (Swimmer-v3)"),
    "HalfCheetah-v5": ARSHyper(
        0.02, 0.03, 32, 4, source=f"the paper's HalfCheetah-v1 values as {ZOO} gives them (HalfCheetah-v3)"
    ),
    "Pendulum-v1": ARSHyper(0.018, 0.1, 4, 1, source=f"{ZOO}'s Pendulum values (an MLP policy there, linear here)"),
    "MountainCarContinuous-v0": ARSHyper(
        0.02, 0.05, 16, 16, source=f"N 16 as {ZOO}; alpha 0.02, nu 0.05, b = N: our choice"
    ),
    "InvertedPendulum-v5": ARSHyper(
        0.02,
        0.03,
        8,
        4,
        source="our choice (the paper lists no InvertedPendulum): HalfCheetah's alpha and nu, Hopper's N 8 and b 4",
    ),
}
DEFAULT = ARSHyper(0.02, 0.03, 8, 4, source="our default for a task with no listed values")


def hyperparameters(env_id: str) -> ARSHyper:
    return HYPERPARAMETERS.get(env_id, DEFAULT)


def ars_update(
    theta: np.ndarray, deltas: np.ndarray, r_plus: np.ndarray, r_minus: np.ndarray, top: int, step_size: float
) -> np.ndarray:
    """One ARS step: ``theta + alpha / (b sigma_R) * sum_top (r+ - r-) delta``
    over the ``top`` directions with the largest ``max(r+, r-)``; unchanged
    when those returns do not differ (sigma_R = 0)."""
    r_plus, r_minus = np.asarray(r_plus, dtype=np.float64), np.asarray(r_minus, dtype=np.float64)
    order = np.argsort(-np.maximum(r_plus, r_minus), kind="stable")[:top]
    sigma_r = float(np.std(np.concatenate([r_plus[order], r_minus[order]])))
    if not sigma_r > 0:
        return np.array(theta, dtype=np.float64)
    step = np.tensordot(r_plus[order] - r_minus[order], np.asarray(deltas, dtype=np.float64)[order], axes=1)
    return theta + step_size / (top * sigma_r) * step


class LinearPolicy:
    """``a = clip(M (obs - mean) / std, low, high)`` with frozen statistics."""

    def __init__(self, task: ResolvedTask, stats: Optional[RunningStats]) -> None:
        self.low, self.high = np.asarray(task.policy.action_low), np.asarray(task.policy.action_high)
        self.mean = stats.mean if stats is not None else np.zeros(task.policy.obs_dim)
        self.inv_std = 1.0 / stats.std if stats is not None else np.ones(task.policy.obs_dim)  # 0 for a constant input

    def with_weights(self, theta: np.ndarray) -> PolicyFn:
        return lambda obs: np.clip(((obs - self.mean) * self.inv_std) @ theta.T, self.low, self.high)


def run_ars(
    cfg: Optional[BaselineConfig] = None, *, hyper: Optional[ARSHyper] = None, task: Optional[Task] = None
) -> dict[str, Any]:
    """ARS V2-t under ``cfg``'s budget (module doc); ``hyper`` left None takes
    the task's values from `HYPERPARAMETERS`. The report's method is ``ars``."""
    require("gymnasium", PURPOSE)
    cfg = cfg or BaselineConfig()
    resolved = cfg.resolve(task)
    hp = hyper or hyperparameters(resolved.env_id)
    hp.validate()
    starts = resolved.start_states(cfg.seed)
    check_states, checked_on = target_states(starts)
    obs_dim, act_dim = resolved.policy.obs_dim, resolved.policy.act_dim
    rng = numpy_rng(cfg.seed, "baselines.ars")
    theta = np.zeros((act_dim, obs_dim))
    stats = RunningStats(obs_dim) if hp.normalize else None
    watch = TargetWatch(resolved.target, every=cfg.check_every or 1)
    episodes = steps = iteration = direction = 0
    clock = Clock()
    with EpisodeRunner(resolved.episode_spec) as runner:
        while not cfg.spent(episodes, steps, 2 * hp.directions) and not (watch.reached and cfg.stop_at_target):
            policy = LinearPolicy(resolved, stats)
            deltas = rng.standard_normal((hp.directions, act_dim, obs_dim))
            returns = np.zeros((hp.directions, 2))
            seen = []
            for k in range(hp.directions):
                state = starts.train[(direction + k) % len(starts.train)]
                for j, sign in enumerate((1.0, -1.0)):
                    if cfg.spent(episodes, steps):
                        break
                    ep = runner.episode(policy.with_weights(theta + sign * hp.noise * deltas[k]), state)
                    episodes, steps = episodes + 1, steps + ep.steps
                    returns[k, j] = ep.ret - hp.shift * ep.steps
                    seen.append(ep.observations)
            direction += hp.directions
            if stats is not None and seen:
                stats.update(np.concatenate(seen))
            if len(seen) < 2 * hp.directions:  # an env-step budget ended inside the iteration: charged, no update
                break
            theta = ars_update(theta, deltas, returns[:, 0], returns[:, 1], hp.top, hp.step_size)
            iteration += 1
            if watch.due(episodes):
                checked = LinearPolicy(resolved, stats).with_weights(theta)
                watch.record(iteration, episodes, steps, mean_return(runner.evaluate(checked, check_states)))
        final = LinearPolicy(resolved, stats).with_weights(theta)
        train = mean_return(runner.evaluate(final, starts.train))
        heldout = mean_return(runner.evaluate(final, starts.heldout))
    settings = {
        **asdict(hp),
        "version": "V2-t" if hp.normalize else "V1-t",
        "iterations": iteration,
        "episodes_per_iteration": 2 * hp.directions,
        "policy": "linear, no bias, actions clipped to the box",
        "episodes_run": "in this process",
        "start_states": f"direction d (both signs) starts from training state d mod {len(starts.train)}",
        "theta": theta.reshape(-1).tolist(),
        "obs_mean": None if stats is None else stats.mean.tolist(),
        "obs_std": None if stats is None else [float(s) if math.isfinite(s) else None for s in stats.std],
    }
    return baseline_report(
        "ars",
        cfg,
        resolved,
        starts,
        watch=watch,
        checked_on=checked_on,
        real_episodes=episodes,
        env_steps=steps,
        train_return=train,
        heldout_return=heldout,
        clock=clock,
        settings=settings,
    )

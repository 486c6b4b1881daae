"""The embedded default task: policy search on gymnasium ``Pendulum-v1``.

A candidate is the flat parameter vector of a small tanh policy
(3 -> 8 -> 1, torque = 2 * tanh(...)). A real evaluation runs one episode per
start state; the budget counts these real episodes. Start states are fixed
(angle, angular velocity) pairs set through ``env.unwrapped.state`` after a
reset, so every candidate faces the same states.

This module imports numpy and gymnasium only (no torch): real evaluations run
in spawned worker processes, which then start in well under a second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

if TYPE_CHECKING:
    import gymnasium as gym

ENV_ID = "Pendulum-v1"
OBS_DIM = 3
ACT_DIM = 1
HIDDEN = 8
MAX_TORQUE = 2.0
EPISODE_STEPS = 200
TARGET_RETURN = -300.0
N_TRAIN_STARTS = 16
N_HELDOUT_STARTS = 20
# thdot is in [-8, 8]; the policy sees it scaled to about [-1, 1]
OBS_SCALE = np.array([1.0, 1.0, 1.0 / 8.0])
N_PARAMS = OBS_DIM * HIDDEN + HIDDEN + HIDDEN * ACT_DIM + ACT_DIM


@dataclass(frozen=True)
class StartStates:
    train: np.ndarray  # (N_TRAIN_STARTS, 2): theta, theta_dot
    heldout: np.ndarray  # (N_HELDOUT_STARTS, 2)


def start_states(seed: int = 0, n_train: int = N_TRAIN_STARTS, n_heldout: int = N_HELDOUT_STARTS) -> StartStates:
    """Fixed start states from Pendulum's own reset distribution
    (theta uniform in [-pi, pi], theta_dot uniform in [-1, 1]). Training angles
    are stratified so every region of the circle is covered; held-out ones are
    drawn independently from a different stream and never seen by the search."""
    rng = np.random.default_rng(10_000 + seed)
    edges = np.linspace(-math.pi, math.pi, n_train + 1)
    theta = rng.uniform(edges[:-1], edges[1:])
    train = np.stack([theta, rng.uniform(-1.0, 1.0, n_train)], axis=1)
    rng_h = np.random.default_rng(20_000 + seed)
    heldout = np.stack([rng_h.uniform(-math.pi, math.pi, n_heldout), rng_h.uniform(-1.0, 1.0, n_heldout)], axis=1)
    return StartStates(train=train, heldout=heldout)


def observation(state: np.ndarray) -> np.ndarray:
    """(theta, theta_dot) -> Pendulum's observation (cos, sin, theta_dot)."""
    state = np.asarray(state, dtype=np.float64)
    return np.stack([np.cos(state[..., 0]), np.sin(state[..., 0]), state[..., 1]], axis=-1)


def unpack(params: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    params = np.asarray(params, dtype=np.float64)
    if params.shape[-1] != N_PARAMS:
        raise ValueError(f"policy parameters have {params.shape[-1]} values; expected {N_PARAMS} (3->8->1 tanh policy)")
    i = 0
    w1 = params[..., i : i + OBS_DIM * HIDDEN].reshape(*params.shape[:-1], OBS_DIM, HIDDEN)
    i += OBS_DIM * HIDDEN
    b1 = params[..., i : i + HIDDEN]
    i += HIDDEN
    w2 = params[..., i : i + HIDDEN * ACT_DIM].reshape(*params.shape[:-1], HIDDEN, ACT_DIM)
    i += HIDDEN * ACT_DIM
    b2 = params[..., i : i + ACT_DIM]
    return w1, b1, w2, b2


def policy_action(params: np.ndarray, obs: np.ndarray) -> np.ndarray:
    """Torque for one parameter vector and observations (..., 3)."""
    w1, b1, w2, b2 = unpack(params)
    h = np.tanh((obs * OBS_SCALE) @ w1 + b1)
    return MAX_TORQUE * np.tanh(h @ w2 + b2)


def random_params(rng: np.random.Generator, n: int, scale: float = 1.0) -> np.ndarray:
    return rng.normal(0.0, scale, size=(n, N_PARAMS))


def make_env(env_id: str = ENV_ID) -> gym.Env:
    # a plain import: this runs in torch-free worker processes, and importing
    # genesis_fp16.extras would import torch; Evaluator checks the extra first
    import gymnasium as gym

    if env_id != ENV_ID:
        raise ValueError(f"unknown task env {env_id!r}: the embedded task supports {ENV_ID!r} only")
    return gym.make(env_id)


def run_episodes(
    params: Sequence[float],
    states: Sequence[Sequence[float]],
    env_id: str = ENV_ID,
    steps: int = EPISODE_STEPS,
    hang_seconds: float = 0.0,
    alloc_mb: int = 0,
) -> dict[str, Any]:
    """Run one real episode per start state with the policy ``params``.

    Returns plain lists/arrays (picklable): per-episode returns and, per
    episode, the transitions (obs, action, reward, next_obs, done).
    ``hang_seconds`` and ``alloc_mb`` exist for the timeout and memory-limit
    tests: the worker sleeps, or allocates that many MiB, first.
    """
    if hang_seconds:
        import time

        time.sleep(hang_seconds)
    if alloc_mb:
        ballast = bytearray(int(alloc_mb) * 1024 * 1024)
        del ballast
    params = np.asarray(params, dtype=np.float64)
    env = make_env(env_id)
    returns: list[float] = []
    episodes: list[dict[str, np.ndarray]] = []
    try:
        for k, (theta, theta_dot) in enumerate(states):
            env.reset(seed=k)
            env.unwrapped.state = np.array([theta, theta_dot], dtype=np.float64)
            obs = observation(np.array([theta, theta_dot])).astype(np.float32)
            o, a, r, n, d = [], [], [], [], []
            total = 0.0
            for t in range(steps):
                action = policy_action(params, obs.astype(np.float64)).astype(np.float32)
                next_obs, reward, terminated, truncated, _ = env.step(action)
                done = bool(terminated or truncated or t == steps - 1)
                o.append(obs)
                a.append(action)
                r.append(float(reward))
                n.append(next_obs)
                d.append(done)
                total += float(reward)
                obs = next_obs
                if terminated or truncated:
                    break
            returns.append(total)
            episodes.append(
                {
                    "obs": np.asarray(o, dtype=np.float32),
                    "action": np.asarray(a, dtype=np.float32).reshape(-1, ACT_DIM),
                    "reward": np.asarray(r, dtype=np.float32),
                    "next_obs": np.asarray(n, dtype=np.float32),
                    "done": np.asarray(d, dtype=bool),
                }
            )
    finally:
        env.close()
    return {"returns": returns, "episodes": episodes}

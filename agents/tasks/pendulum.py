"""Pendulum-v1's exact start states and known structure, for the built-in
Pendulum task (``agents.tasks.builtin``).

Start states are fixed (angle, angular velocity) pairs set through
``env.unwrapped.state`` after a reset, so every candidate faces the same
states. Torch-free: ``set_state`` runs in the worker processes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import numpy as np

from genesis_fp16.base.seeds import numpy_rng

from .task import StartStates

if TYPE_CHECKING:
    import gymnasium as gym
    import torch

ENV_ID = "Pendulum-v1"
OBS_DIM = 3
ACT_DIM = 1
HIDDEN = 8
EPISODE_STEPS = 200
TARGET_RETURN = -300.0
N_TRAIN_STARTS = 16
N_HELDOUT_STARTS = 20
N_VALIDATION_STARTS = 8
# thdot is in [-8, 8]; the policy sees it scaled to about [-1, 1]
OBS_SCALE = (1.0, 1.0, 1.0 / 8.0)
N_PARAMS = OBS_DIM * HIDDEN + HIDDEN + HIDDEN * ACT_DIM + ACT_DIM


def start_states(
    seed: int = 0,
    n_train: int = N_TRAIN_STARTS,
    n_heldout: int = N_HELDOUT_STARTS,
    n_validation: int = N_VALIDATION_STARTS,
) -> StartStates:
    """Fixed start states from Pendulum's own reset distribution
    (theta uniform in [-pi, pi], theta_dot uniform in [-1, 1]). Training angles
    are stratified so every region of the circle is covered; held-out ones are
    drawn independently from a different stream and never seen by the search;
    validation ones (which confirm a target met on the training states) from a third
    (the streams ``pendulum.train_starts``, ``pendulum.heldout_starts``, ``pendulum.validation_starts``)."""
    rng = numpy_rng(seed, "pendulum.train_starts")
    edges = np.linspace(-math.pi, math.pi, n_train + 1)
    theta = rng.uniform(edges[:-1], edges[1:])
    train = np.stack([theta, rng.uniform(-1.0, 1.0, n_train)], axis=1)
    rng_h = numpy_rng(seed, "pendulum.heldout_starts")
    heldout = np.stack([rng_h.uniform(-math.pi, math.pi, n_heldout), rng_h.uniform(-1.0, 1.0, n_heldout)], axis=1)
    rng_v = numpy_rng(seed, "pendulum.validation_starts")
    validation = np.stack(
        [rng_v.uniform(-math.pi, math.pi, n_validation), rng_v.uniform(-1.0, 1.0, n_validation)], axis=1
    )
    return StartStates(train=train, heldout=heldout, validation=validation)


def extra_states(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random states from the reset distribution (only the world model sees them)."""
    return np.stack([rng.uniform(-math.pi, math.pi, n), rng.uniform(-1, 1, n)], axis=1)


def observation(state: np.ndarray) -> np.ndarray:
    """(theta, theta_dot) -> Pendulum's observation (cos, sin, theta_dot)."""
    state = np.asarray(state, dtype=np.float64)
    return np.stack([np.cos(state[..., 0]), np.sin(state[..., 0]), state[..., 1]], axis=-1)


def set_state(env: "gym.Env", state: Sequence[float]) -> np.ndarray:
    theta, theta_dot = float(state[0]), float(state[1])
    env.unwrapped.state = np.array([theta, theta_dot], dtype=np.float64)  # type: ignore[attr-defined]
    return observation(np.array([theta, theta_dot])).astype(np.float32)


def project(obs: "torch.Tensor") -> "torch.Tensor":
    """(cos, sin) back onto the unit circle and theta_dot into [-8, 8], as the
    real environment guarantees."""
    import torch

    cs = obs[..., :2]
    cs = cs / cs.norm(dim=-1, keepdim=True).clamp_min(1e-6)
    return torch.cat([cs, obs[..., 2:].clamp(-8.0, 8.0)], dim=-1)


def random_params(rng: np.random.Generator, n: int, scale: float = 1.0) -> np.ndarray:
    return rng.normal(0.0, scale, size=(n, N_PARAMS))

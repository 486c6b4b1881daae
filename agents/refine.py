"""Refinement by gradient: copies of a policy improved by actor-gradient
steps through a learned value (the critic) and, optionally, H steps of the
world model first (MVE / SVG(H): Feinberg et al. 2018, Heess et al. 2015).

The objective of a policy ``pi_z`` (z: the search's normalised coordinates,
`agents.search_space`) on a batch of real replay states ``s_0``::

    J(z) = mean over s_0 of  sum_{t<H} gamma^t r_t  +  gamma^H Q(s_H, pi_z(s_H))

with ``(s_{t+1}, r_t)`` the world model's mean prediction of the elites for
``(s_t, pi_z(s_t))`` (H = 0: the critic alone, as CEM-RL's and TD3's actor
update; no critic: the model's H-step return alone). Adam ascends J from the
start point; the copies handed back are snapshots of that one ascent at
``snapshots`` steps (a line search along the improvement path: CMA-ES, told
their real returns, decides how far to go). Everything here is FP32 and on
the CPU generator, so the same seed refines alike.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import numpy as np
import torch

from genesis_fp16.base.seeds import torch_generator

from .search_space import SearchSpace
from .tasks.torch_policy import BatchedPolicy

if TYPE_CHECKING:
    from infrastructure.world_model import WorldModel

ValueFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``value(obs (N, obs_dim), act (N, act_dim)) -> (N,)``: differentiable in ``act``."""
ModelStep = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""``step(obs, act) -> (next_obs, reward)``: differentiable in both."""


class ZPolicy:
    """The task's policy family in z-coordinates, in torch: ``act(z (P, D), obs (P, N, obs_dim))``,
    the raw observations normalised by ``space`` (mu, sigma of obs * obs_scale) first."""

    def __init__(self, space: SearchSpace) -> None:
        spec = space.spec
        self.batched = BatchedPolicy(replace(spec, obs_scale=(1.0,) * spec.obs_dim))
        self.scale = torch.tensor(spec.obs_scale, dtype=torch.float32)
        self.mu = torch.tensor(space.mu, dtype=torch.float32)
        self.sigma = torch.tensor(space.sigma, dtype=torch.float32)

    def __call__(self, z: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        return self.batched(z, (obs * self.scale - self.mu) / self.sigma)


def objective(
    z: torch.Tensor,
    states: torch.Tensor,
    policy: ZPolicy,
    *,
    value: Optional[ValueFn],
    model: Optional[ModelStep],
    horizon: int,
    gamma: float,
) -> torch.Tensor:
    """J(z) per parameter row: (P,) for ``z`` (P, D) and ``states`` (N, obs_dim)."""
    if value is None and (model is None or horizon < 1):
        raise ValueError("refinement needs a critic, or a world model and a horizon >= 1")
    n_p, n = z.shape[0], states.shape[0]
    obs = states.unsqueeze(0).expand(n_p, n, states.shape[-1])
    total = torch.zeros(n_p, n)
    if model is not None:
        for t in range(horizon):
            act = policy(z, obs)
            next_obs, reward = model(obs.reshape(n_p * n, -1), act.reshape(n_p * n, -1))
            total = total + gamma**t * reward.reshape(n_p, n)
            obs = next_obs.reshape(n_p, n, -1)
    if value is not None:
        act = policy(z, obs)
        q = value(obs.reshape(n_p * n, -1), act.reshape(n_p * n, -1)).reshape(n_p, n)
        total = total + gamma ** (horizon if model is not None else 0) * q
    return total.mean(dim=1)


def refine(
    z0: np.ndarray,
    states: torch.Tensor,
    space: SearchSpace,
    *,
    value: Optional[ValueFn],
    model: Optional[ModelStep] = None,
    horizon: int = 0,
    gamma: float = 0.99,
    snapshots: Sequence[int] = (50, 200),
    lr: float = 0.01,
    batch: int = 256,
    seed: int = 0,
    on_step: Optional[Callable[[int], None]] = None,
) -> list[np.ndarray]:
    """Snapshots (z-coordinates) of one Adam ascent of J from ``z0``, at each
    step count in ``snapshots`` (ascending); minibatches of ``batch`` rows of
    ``states`` drawn from the stream ``refine.rows`` of ``seed`` (`genesis_fp16.base.seeds`).
    ``on_step(done)``: told the steps done after each one (a caller's progress)."""
    steps = sorted({int(s) for s in snapshots})
    if not steps or steps[0] < 1:
        raise ValueError(f"snapshots={list(snapshots)}: expected step counts >= 1")
    if len(states) == 0:
        raise ValueError("refinement needs at least one real state")
    policy = ZPolicy(space)
    z = torch.tensor(np.asarray(z0, dtype=np.float32)[None], requires_grad=True)
    opt = torch.optim.Adam([z], lr=lr)
    gen = torch_generator(seed, "refine.rows")
    out: list[np.ndarray] = []
    for step in range(1, steps[-1] + 1):
        rows = torch.randint(len(states), (min(batch, len(states)),), generator=gen)
        loss = -objective(z, states[rows], policy, value=value, model=model, horizon=horizon, gamma=gamma).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step in steps:
            out.append(z.detach()[0].double().numpy().copy())
        if on_step is not None:
            on_step(step)
    return out


def model_step(world_model: "WorldModel") -> ModelStep:
    """The world model's elites' mean prediction, differentiable in the
    observation and the action (``EnsembleDynamics.predict_next`` is its
    no-grad twin), computed on the model's device and returned on the inputs' (the refinement runs on the host)."""
    model = world_model.model

    def step(obs: torch.Tensor, act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        device = model.y_mean.device
        next_obs, reward = model.mean_next(obs.to(device), act.to(device))
        return next_obs.to(obs.device), reward.to(obs.device)

    return step

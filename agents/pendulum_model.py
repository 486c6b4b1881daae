"""Torch side of the Pendulum task: the batched policy and the projection
that keeps imagined observations on the state manifold."""

from __future__ import annotations

import torch

from .pendulum_task import HIDDEN, MAX_TORQUE, OBS_DIM, OBS_SCALE

_SCALE = torch.tensor(OBS_SCALE, dtype=torch.float32)


def batched_policy(params: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
    """Torques for P parameter vectors at once: params (P, D), obs (P, S, 3)
    -> (P, S, 1). The same network as ``pendulum_task.policy_action``."""
    n_p = params.shape[0]
    i = OBS_DIM * HIDDEN
    w1 = params[:, :i].reshape(n_p, OBS_DIM, HIDDEN)
    b1 = params[:, i : i + HIDDEN]
    w2 = params[:, i + HIDDEN : i + 2 * HIDDEN].reshape(n_p, HIDDEN, 1)
    b2 = params[:, i + 2 * HIDDEN :]
    h = torch.tanh(torch.baddbmm(b1.unsqueeze(1), obs * _SCALE, w1))
    return MAX_TORQUE * torch.tanh(torch.baddbmm(b2.unsqueeze(1), h, w2))


def project(obs: torch.Tensor) -> torch.Tensor:
    """(cos, sin) back onto the unit circle and theta_dot into [-8, 8], as the
    real environment guarantees."""
    cs = obs[..., :2]
    cs = cs / cs.norm(dim=-1, keepdim=True).clamp_min(1e-6)
    return torch.cat([cs, obs[..., 2:].clamp(-8.0, 8.0)], dim=-1)

"""The batched torch twin of `agents.tasks.policies.PolicySpec` for
imagination: P parameter vectors on (P, S, obs_dim) observations at once."""

from __future__ import annotations

from typing import Callable, Optional

import torch

from .policies import PolicySpec


class BatchedPolicy:
    """``policy(params (P, D), obs (P, S, obs_dim)) -> actions (P, S, act_dim)``,
    the same network and layout as ``PolicySpec.act``."""

    def __init__(self, spec: PolicySpec) -> None:
        self.spec = spec
        self.scale = torch.tensor(spec.obs_scale, dtype=torch.float32)
        self.center = torch.tensor(spec.center, dtype=torch.float32)
        self.half = torch.tensor(spec.half_range, dtype=torch.float32)

    def __call__(self, params: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        n_p, i = params.shape[0], 0
        x = obs * self.scale
        layers = self.spec.layers()
        for k, (fan_in, fan_out) in enumerate(layers):
            w = params[:, i : i + fan_in * fan_out].reshape(n_p, fan_in, fan_out)
            i += fan_in * fan_out
            b = params[:, i : i + fan_out]
            i += fan_out
            x = torch.tanh(torch.baddbmm(b.unsqueeze(1), x, w))
        return self.center + self.half * x


def clamp_projection(
    low: tuple[float, ...], high: tuple[float, ...], *, data: Optional[tuple[torch.Tensor, torch.Tensor]] = None
) -> Optional[Callable[[torch.Tensor], torch.Tensor]]:
    """Imagined observations clamped into the observation box where it is
    finite (the real env never leaves it), and, where it is not, into
    ``data`` = (low, high): the region the world model was trained on. Without
    that bound a model extrapolating over a long horizon diverges and the
    search chases the divergence (Swimmer-v5: imagined returns of 1e30 for
    policies that score about 0). None when nothing bounds any dimension."""
    lo, hi = torch.tensor(low, dtype=torch.float32), torch.tensor(high, dtype=torch.float32)
    far = torch.finfo(torch.float32).max
    lo_free = data[0].float() if data is not None else torch.full_like(lo, -far)
    hi_free = data[1].float() if data is not None else torch.full_like(hi, far)
    if data is None and not (torch.isfinite(lo).any() or torch.isfinite(hi).any()):
        return None
    lo = torch.where(torch.isfinite(lo), lo, lo_free)
    hi = torch.where(torch.isfinite(hi), hi, hi_free)

    def project(obs: torch.Tensor) -> torch.Tensor:
        return torch.maximum(torch.minimum(obs, hi), lo)

    return project

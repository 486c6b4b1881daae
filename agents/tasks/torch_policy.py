"""The torch twins of `agents.tasks.policies.PolicySpec`: the batched one for
imagination (P parameter vectors on (P, S, obs_dim) observations at once,
on whatever device the observations are: the world model's), and one policy
as a `torch.nn.Module` (`PolicyNetwork`, an evolved policy inside a host
project: `agents.policies.EvolvedPolicy.module`)."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np
import torch

from .policies import PolicySpec


class OnDevice:
    """Constant tensors, made on the CPU and copied once to each device asked for."""

    def __init__(self, *tensors: torch.Tensor) -> None:
        self._copies: dict[torch.device, tuple[torch.Tensor, ...]] = {torch.device("cpu"): tensors}

    def on(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        if device not in self._copies:
            self._copies[device] = tuple(t.to(device) for t in self._copies[torch.device("cpu")])
        return self._copies[device]


class BatchedPolicy:
    """``policy(params (P, D), obs (P, S, obs_dim)) -> actions (P, S, act_dim)``,
    the same network and layout as ``PolicySpec.act``, on the device of ``obs``."""

    def __init__(self, spec: PolicySpec) -> None:
        self.spec = spec
        self.scale = torch.tensor(spec.obs_scale, dtype=torch.float32)
        self.center = torch.tensor(spec.center, dtype=torch.float32)
        self.half = torch.tensor(spec.half_range, dtype=torch.float32)
        self._constants = OnDevice(self.scale, self.center, self.half)

    def __call__(self, params: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        n_p, i = params.shape[0], 0
        scale, center, half = self._constants.on(obs.device)
        params = params.to(obs.device)
        x = obs * scale
        layers = self.spec.layers()
        for k, (fan_in, fan_out) in enumerate(layers):
            w = params[:, i : i + fan_in * fan_out].reshape(n_p, fan_in, fan_out)
            i += fan_in * fan_out
            b = params[:, i : i + fan_out]
            i += fan_out
            x = torch.tanh(torch.baddbmm(b.unsqueeze(1), x, w))
        return center + half * x


class PolicyNetwork(torch.nn.Module):
    """One policy of ``spec`` with the parameters ``params`` as a module:
    ``forward(obs (..., obs_dim)) -> actions (..., act_dim)``, the network of
    ``PolicySpec.act`` (observations times ``obs_scale``, tanh layers, actions
    scaled into the action box) in ``dtype``. Its weights are parameters (a host
    may fine-tune them); ``obs_scale``, ``center`` and ``half_range`` are buffers."""

    def __init__(self, spec: PolicySpec, params: Sequence[float], dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.spec = spec
        self.layers = torch.nn.ModuleList()
        for w, b in spec.unpack(np.asarray(params, dtype=np.float64)):
            # skip_init: the weights are set below, so no initialiser draws from torch's global generator
            layer = torch.nn.utils.skip_init(torch.nn.Linear, w.shape[0], w.shape[1], dtype=dtype)
            with torch.no_grad():
                layer.weight.copy_(torch.tensor(w.T))
                layer.bias.copy_(torch.tensor(b))
            self.layers.append(layer)
        self.register_buffer("obs_scale", torch.tensor(spec.obs_scale, dtype=dtype))
        self.register_buffer("center", torch.from_numpy(spec.center).to(dtype))
        self.register_buffer("half_range", torch.from_numpy(spec.half_range).to(dtype))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.to(self.obs_scale.dtype) * self.obs_scale
        for layer in self.layers[:-1]:
            x = torch.tanh(layer(x))
        return self.center + self.half_range * torch.tanh(self.layers[-1](x))


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
    lo = torch.where(torch.isfinite(lo), lo, lo_free.cpu())
    hi = torch.where(torch.isfinite(hi), hi, hi_free.cpu())
    bounds = OnDevice(lo, hi)

    def project(obs: torch.Tensor) -> torch.Tensor:
        low, high = bounds.on(obs.device)
        return torch.maximum(torch.minimum(obs, high), low)

    return project

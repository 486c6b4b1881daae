"""The coordinates the search works in: policies that see normalised
observations (as ARS V2 does, Mania et al. 2018), so one step size fits every
observation dimension.

The torch-free workers run the raw parameters of `agents.tasks.PolicySpec`,
whose first layer computes ``x @ W + b`` on ``x = obs * obs_scale``. The
operators search z-coordinates in which the same policy sees
``(x - mu) / sigma``, with ``mu`` and ``sigma`` the running mean and standard
deviation of ``x`` over every real episode so far (`ObsStats`). Only the
first layer changes between the two; for ``z = (W_z, b_z, rest)``::

    W_raw = W_z / sigma[:, None]          (each input row divided by its sigma)
    b_raw = b_z - (mu / sigma) @ W_z
    so x @ W_raw + b_raw == ((x - mu) / sigma) @ W_z + b_z

and back: ``W_z = W_raw * sigma[:, None]``, ``b_z = b_raw + mu @ W_raw``. Both
maps are linear in the parameters, so a blend of two candidates is the same
blend in either coordinates. ``sigma`` is floored at `SIGMA_FLOOR`: a
dimension that barely varies would otherwise turn a small z-step into a huge
raw weight. Before any data the statistics are the identity (mu 0, sigma 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from .tasks import PolicySpec

SIGMA_FLOOR = 1e-2  # in units of obs * obs_scale (a bounded dimension spans about [-1, 1])


@dataclass(frozen=True)
class SearchSpace:
    """The maps between raw parameters (what the workers run) and
    z-coordinates (what the operators search) for one policy family and one
    set of statistics. Both take (..., n_params) arrays."""

    spec: PolicySpec
    mu: np.ndarray  # (obs_dim,) mean of obs * obs_scale
    sigma: np.ndarray  # (obs_dim,) its standard deviation, floored

    @classmethod
    def identity(cls, spec: PolicySpec) -> "SearchSpace":
        return cls(spec, np.zeros(spec.obs_dim), np.ones(spec.obs_dim))

    def _first_layer(self, params: np.ndarray) -> tuple[np.ndarray, int, int]:
        params = np.array(params, dtype=np.float64)  # a copy: the caller's array is left alone
        if params.shape[-1] != self.spec.n_params:
            raise ValueError(
                f"policy parameters have {params.shape[-1]} values; expected {self.spec.n_params} ({self.spec.name} "
                "policy)"
            )
        fan_in, fan_out = self.spec.layers()[0]
        return params, fan_in, fan_out

    def to_raw(self, z: np.ndarray) -> np.ndarray:
        """Raw parameters of the policy whose z-coordinates are ``z``."""
        params, fan_in, fan_out = self._first_layer(z)
        w_z = params[..., : fan_in * fan_out].reshape(*params.shape[:-1], fan_in, fan_out)
        b_z = params[..., fan_in * fan_out : fan_in * fan_out + fan_out]
        w_raw = w_z / self.sigma[:, None]
        b_raw = b_z - np.einsum("i,...io->...o", self.mu / self.sigma, w_z)
        params[..., : fan_in * fan_out] = w_raw.reshape(*params.shape[:-1], fan_in * fan_out)
        params[..., fan_in * fan_out : fan_in * fan_out + fan_out] = b_raw
        return params

    def to_z(self, raw: np.ndarray) -> np.ndarray:
        """z-coordinates of the policy whose raw parameters are ``raw``."""
        params, fan_in, fan_out = self._first_layer(raw)
        w_raw = params[..., : fan_in * fan_out].reshape(*params.shape[:-1], fan_in, fan_out)
        b_raw = params[..., fan_in * fan_out : fan_in * fan_out + fan_out]
        b_z = b_raw + np.einsum("i,...io->...o", self.mu, w_raw)
        params[..., : fan_in * fan_out] = (w_raw * self.sigma[:, None]).reshape(*params.shape[:-1], fan_in * fan_out)
        params[..., fan_in * fan_out : fan_in * fan_out + fan_out] = b_z
        return params


class ObsStats:
    """Running mean and variance of ``obs * obs_scale`` over every real
    observation seen (Chan et al.'s parallel update, in float64), kept in the
    run manifest so a resumed run continues with the same numbers."""

    def __init__(self, obs_dim: int, count: int = 0, mean: Sequence[float] = (), m2: Sequence[float] = ()) -> None:
        self.obs_dim = obs_dim
        self.count = int(count)
        self.mean = np.asarray(mean, dtype=np.float64) if count else np.zeros(obs_dim)
        self.m2 = np.asarray(m2, dtype=np.float64) if count else np.zeros(obs_dim)
        if self.mean.shape != (obs_dim,) or self.m2.shape != (obs_dim,):
            raise ValueError(
                f"observation statistics for {self.mean.shape} / {self.m2.shape} values; expected ({obs_dim},) each"
            )

    def update(self, x: np.ndarray) -> None:
        """Add observations ``x`` (N, obs_dim), already multiplied by obs_scale."""
        x = np.asarray(x, dtype=np.float64).reshape(-1, self.obs_dim)
        n = len(x)
        if n == 0:
            return
        mean_b = x.mean(axis=0)
        m2_b = ((x - mean_b) ** 2).sum(axis=0)
        total = self.count + n
        delta = mean_b - self.mean
        self.mean = self.mean + delta * (n / total)
        self.m2 = self.m2 + m2_b + delta**2 * (self.count * n / total)
        self.count = total

    @property
    def std(self) -> np.ndarray:
        """The population standard deviation, floored at `SIGMA_FLOOR`; 1 before any observation."""
        if self.count == 0:
            return np.ones(self.obs_dim)
        return np.maximum(np.sqrt(self.m2 / self.count), SIGMA_FLOOR)

    def space(self, spec: PolicySpec) -> SearchSpace:
        """The search space these statistics define for ``spec``; the identity before any data."""
        if self.count == 0:
            return SearchSpace.identity(spec)
        return SearchSpace(spec, self.mean.copy(), self.std)

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.count, "mean": [float(v) for v in self.mean], "m2": [float(v) for v in self.m2]}

    @classmethod
    def from_dict(cls, obs_dim: int, data: dict[str, Any]) -> "ObsStats":
        """The statistics `as_dict` wrote; `agents.runs.ManifestFieldError` (a `RunError`) names a field that is not
        what it writes (a count below 0, a mean of another length than ``obs_dim``, ...)."""
        check_obs_stats(data, obs_dim=obs_dim)
        return cls(obs_dim, count=data["count"], mean=data["mean"], m2=data["m2"])


def check_obs_stats(data: Any, *, obs_dim: Optional[int] = None) -> None:
    """Raise `agents.runs.ManifestFieldError` for the first field of an `ObsStats.as_dict` record that is missing or not
    what it writes: ``count`` a whole number >= 0, ``mean`` and ``m2`` (>= 0) lists of finite numbers of one length
    (``obs_dim``, where given and anything was counted)."""
    from .manifest_fields import ManifestFieldError, check_fields, is_int, is_numbers

    check_fields(
        data,
        {
            "count": (lambda v: is_int(v, 0), "a whole number >= 0 (observations counted)"),
            "mean": (lambda v: is_numbers(v), "a list of finite numbers, one per observation dimension"),
            "m2": (
                lambda v: is_numbers(v) and all(x >= 0 for x in v),
                "a list of finite numbers >= 0, one per observation dimension",
            ),
        },
        required=("count", "mean", "m2"),
        what="an object with count, mean and m2",
    )
    if len(data["m2"]) != len(data["mean"]):
        raise ManifestFieldError("m2", data["m2"], f"as many values as mean ({len(data['mean'])})")
    if obs_dim is not None and data["count"] and len(data["mean"]) != obs_dim:
        raise ManifestFieldError("mean", data["mean"], f"{obs_dim} values, one per observation dimension of the task")

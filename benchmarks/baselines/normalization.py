"""Observation normalisation as ARS V2 does it (Mania, Guy, Recht 2018):
running mean and standard deviation of every observation seen, so one step
size fits every dimension. Numpy only.

The project's workers run a `PolicySpec` on raw observations
(``x = obs * obs_scale``), so a policy searched on normalised inputs
``z = (x - mu) / sigma`` is handed to them with the normalisation folded
into its first layer: ``z @ W_z + b_z = x @ (W_z / sigma) + (b_z - (mu / sigma) @ W_z)``.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from agents.tasks import PolicySpec

# ARS's filter gives a dimension whose spread is below this an infinite sigma:
# a (near) constant input carries no information, and dividing by its tiny
# spread would blow up the policy's weights
MIN_STD = 1e-8


class RunningStats:
    """Count, mean and sum of squared deviations of the rows seen (Chan et al.'s
    parallel update, exact for any batch split). Before two rows are seen it
    is the identity: mean 0, std 1."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.count = 0
        self._mean = np.zeros(dim)
        self._m2 = np.zeros(dim)

    def update(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, dtype=np.float64).reshape(-1, self.dim)
        n = len(rows)
        if n == 0:
            return
        mean, m2 = rows.mean(axis=0), ((rows - rows.mean(axis=0)) ** 2).sum(axis=0)
        total = self.count + n
        delta = mean - self._mean
        self._m2 = self._m2 + m2 + delta**2 * self.count * n / total
        self._mean = self._mean + delta * n / total
        self.count = total

    @property
    def mean(self) -> np.ndarray:
        return self._mean.copy() if self.count >= 2 else np.zeros(self.dim)

    @property
    def std(self) -> np.ndarray:
        """Sample standard deviation; ``inf`` where below `MIN_STD` (ARS's rule)."""
        if self.count < 2:
            return np.ones(self.dim)
        std = np.sqrt(self._m2 / (self.count - 1))
        return np.where(std < MIN_STD, np.inf, std)

    def normalize(self, x: np.ndarray) -> np.ndarray:
        return (np.asarray(x, dtype=np.float64) - self.mean) / self.std


def fold(spec: PolicySpec, params_z: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """Parameters that give on raw observations what ``params_z`` gives on
    ``(obs * obs_scale - mean) / std``: only the first layer changes."""
    params_z = np.asarray(params_z, dtype=np.float64)
    mean, std = np.asarray(mean, dtype=np.float64), np.asarray(std, dtype=np.float64)
    if mean.shape != (spec.obs_dim,) or std.shape != (spec.obs_dim,):
        raise ValueError(
            f"mean and std have shapes {mean.shape}, {std.shape}; expected ({spec.obs_dim},) each (one per observation)"
        )
    (w_z, b_z), *_ = spec.unpack(params_z)
    inv = 1.0 / std  # 0 where std is inf
    w_raw = w_z * inv[:, None]
    b_raw = b_z - (mean * inv) @ w_z
    fan_in, fan_out = spec.layers()[0]
    out = params_z.copy()
    out[: fan_in * fan_out] = w_raw.reshape(-1)
    out[fan_in * fan_out : fan_in * fan_out + fan_out] = b_raw
    return out


def unit_scale(spec: PolicySpec) -> PolicySpec:
    """The same policy family reading its inputs as they come (obs_scale 1): the policy on normalised observations."""
    return replace(spec, obs_scale=(1.0,) * spec.obs_dim)

"""Policy families: a flat parameter vector <-> a tanh-bounded policy whose
actions are scaled to the action box. This module is numpy only: real
episodes run in torch-free worker processes. The batched torch twin for
imagination is ``agents.tasks.torch_policy``; both read the parameters in
the same layout."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

POLICY_KINDS = "linear, mlp:H (H hidden tanh units, e.g. mlp:8)"


def parse_policy(text: str) -> int:
    """``linear`` -> 0 hidden units, ``mlp:H`` -> H. Raises ValueError with the choices."""
    if text == "linear":
        return 0
    kind, _, hidden = text.partition(":")
    if kind == "mlp" and hidden.isdigit() and int(hidden) >= 1:
        return int(hidden)
    raise ValueError(f"policy {text!r}: expected one of {POLICY_KINDS}")


@dataclass(frozen=True)
class PolicySpec:
    """One policy family for one task's spaces. ``hidden`` 0 is linear:
    ``a = center + half * tanh((obs * obs_scale) @ W + b)``; otherwise one tanh
    hidden layer before that output. Parameters are laid out as W1, b1 (, W2, b2)."""

    obs_dim: int
    act_dim: int
    hidden: int
    obs_scale: tuple[float, ...]
    action_low: tuple[float, ...]
    action_high: tuple[float, ...]

    @property
    def name(self) -> str:
        return f"mlp:{self.hidden}" if self.hidden else "linear"

    @property
    def n_params(self) -> int:
        if self.hidden == 0:
            return self.obs_dim * self.act_dim + self.act_dim
        return self.obs_dim * self.hidden + self.hidden + self.hidden * self.act_dim + self.act_dim

    @property
    def center(self) -> np.ndarray:
        return (np.asarray(self.action_high, dtype=np.float64) + np.asarray(self.action_low, dtype=np.float64)) / 2.0

    @property
    def half_range(self) -> np.ndarray:
        return (np.asarray(self.action_high, dtype=np.float64) - np.asarray(self.action_low, dtype=np.float64)) / 2.0

    def layers(self) -> list[tuple[int, int]]:
        """(fan_in, fan_out) of each layer, in parameter order."""
        if self.hidden == 0:
            return [(self.obs_dim, self.act_dim)]
        return [(self.obs_dim, self.hidden), (self.hidden, self.act_dim)]

    def unpack(self, params: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        params = np.asarray(params, dtype=np.float64)
        if params.shape[-1] != self.n_params:
            raise ValueError(
                f"policy parameters have {params.shape[-1]} values; expected {self.n_params} "
                f"({self.name} policy, {self.obs_dim} observations -> {self.act_dim} actions)"
            )
        out, i = [], 0
        for fan_in, fan_out in self.layers():
            w = params[..., i : i + fan_in * fan_out].reshape(*params.shape[:-1], fan_in, fan_out)
            i += fan_in * fan_out
            out.append((w, params[..., i : i + fan_out]))
            i += fan_out
        return out

    def act(self, params: np.ndarray, obs: np.ndarray) -> np.ndarray:
        """Actions for one parameter vector and observations (..., obs_dim)."""
        x = np.asarray(obs, dtype=np.float64) * np.asarray(self.obs_scale, dtype=np.float64)
        layers = self.unpack(params)
        for w, b in layers[:-1]:
            x = np.tanh(x @ w + b)
        w, b = layers[-1]
        return self.center + self.half_range * np.tanh(x @ w + b)

    def random_params(self, rng: np.random.Generator, n: int, scale: float = 1.0) -> np.ndarray:
        return rng.normal(0.0, scale, size=(n, self.n_params))

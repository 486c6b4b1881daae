"""Transitions as the critic learns from them: real ones from the replay
buffer and imagined ones from short model rollouts (`infrastructure.model_env`)
share this one batch type, float32 tensors on one device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from .trajectory import Trajectory


@dataclass(frozen=True)
class Transitions:
    """N transitions: ``obs`` (N, obs_dim), ``act`` (N, act_dim), ``rew`` (N,),
    ``next_obs`` (N, obs_dim), ``terminal`` (N,) 1.0 where the episode ended by
    the task's own rule (no value beyond it), 0.0 where it goes on or was only
    cut by a time limit (its value is bootstrapped)."""

    obs: torch.Tensor
    act: torch.Tensor
    rew: torch.Tensor
    next_obs: torch.Tensor
    terminal: torch.Tensor

    def __post_init__(self) -> None:
        n = len(self.obs)
        shapes = {
            "act": len(self.act),
            "rew": len(self.rew),
            "next_obs": len(self.next_obs),
            "terminal": len(self.terminal),
        }
        bad = [f"{k} has {v}" for k, v in shapes.items() if v != n]
        if bad:
            raise ValueError(f"Transitions: obs has {n} rows but " + ", ".join(bad))

    def __len__(self) -> int:
        return len(self.obs)

    def to(self, device: torch.device) -> "Transitions":
        return Transitions(*(t.to(device) for t in (self.obs, self.act, self.rew, self.next_obs, self.terminal)))

    def rows(self, index: torch.Tensor) -> "Transitions":
        return Transitions(*(t[index] for t in (self.obs, self.act, self.rew, self.next_obs, self.terminal)))

    @staticmethod
    def cat(parts: Sequence["Transitions"]) -> "Transitions":
        """The parts' rows in order, on the first part's device (model rollouts come from the world model's)."""
        parts = [p for p in parts if len(p)]
        if not parts:
            raise ValueError("Transitions.cat: nothing to join")
        device = parts[0].obs.device
        return Transitions(
            *(
                torch.cat([getattr(p, k).to(device) for p in parts])
                for k in ("obs", "act", "rew", "next_obs", "terminal")
            )
        )

    @classmethod
    def from_trajectories(cls, trajectories: Sequence[Trajectory]) -> "Transitions":
        """Every step of ``trajectories``; ``terminal`` is the trajectory's ``done``
        (a termination by the environment, never a time limit)."""
        if not trajectories:
            raise ValueError("Transitions.from_trajectories: no trajectories")

        def stack(name: str) -> torch.Tensor:
            return torch.as_tensor(
                np.concatenate([np.asarray(getattr(t, name), dtype=np.float32) for t in trajectories])
            )

        return cls(stack("obs"), stack("action"), stack("reward"), stack("next_obs"), stack("done"))

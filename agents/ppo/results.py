"""What a PPO run returns: `TrainResult` and its JSON form."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np


@dataclass
class TrainResult:
    env_id: str
    seed: int
    env_steps: int
    wall_s: float
    env_steps_per_s: float
    time_split_s: dict[str, float]
    episode_returns: list[float]
    eval_return: Optional[float]
    eval_returns: list[float]
    optimizations: dict[str, Any]
    trainer_stats: dict[str, Any]
    iterations: int
    history: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        recent = self.episode_returns[-20:]
        return {
            "env_id": self.env_id,
            "seed": self.seed,
            "env_steps": self.env_steps,
            "wall_s": self.wall_s,
            "env_steps_per_s": self.env_steps_per_s,
            "time_split_s": self.time_split_s,
            "train_return_last20": float(np.mean(recent)) if recent else None,
            "episodes": len(self.episode_returns),
            "eval_return": self.eval_return,
            "eval_returns": self.eval_returns,
            "optimizations": self.optimizations,
            "trainer": self.trainer_stats,
            "iterations": self.iterations,
            "history": self.history,
        }

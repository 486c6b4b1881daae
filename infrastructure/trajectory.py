"""One episode's transitions, as the replay buffer stores them and the world
model trains on them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

import numpy as np

ARRAY_FIELDS = ("obs", "action", "reward", "next_obs", "done")


@dataclass
class Trajectory:
    """One episode. Arrays: obs (T, obs_dim), action (T, act_dim), reward (T,),
    next_obs (T, obs_dim), done (T,)."""

    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    next_obs: np.ndarray
    done: np.ndarray
    candidate: str = ""
    return_: Optional[float] = None
    outcome: str = ""
    agent: str = ""
    generation: int = 0
    id: Optional[int] = None
    created: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.obs = np.asarray(self.obs, dtype=np.float32)
        self.next_obs = np.asarray(self.next_obs, dtype=np.float32)
        self.action = np.asarray(self.action, dtype=np.float32)
        if self.action.ndim == 1:
            self.action = self.action.reshape(-1, 1)
        self.reward = np.asarray(self.reward, dtype=np.float32).reshape(-1)
        self.done = np.asarray(self.done, dtype=bool).reshape(-1)
        n = self.obs.shape[0]
        shapes = {k: getattr(self, k).shape for k in ARRAY_FIELDS}
        if self.obs.ndim != 2 or self.next_obs.shape != self.obs.shape or any(getattr(self, k).shape[0] != n for k in ARRAY_FIELDS):
            raise ValueError(
                f"trajectory {self.candidate or self.id!r}: inconsistent transition shapes {shapes}; "
                "expected obs and next_obs (T, obs_dim), action (T, act_dim), reward and done (T,)"
            )
        if n == 0:
            raise ValueError(
                f"trajectory {self.candidate or self.id!r}: no transitions; expected at least one "
                "(obs, action, reward, next_obs, done) step: leave an empty episode out instead of storing it"
            )
        if self.return_ is None:
            self.return_ = float(self.reward.sum())

    @property
    def label(self) -> str:
        """How errors name this trajectory."""
        parts = [f"id={self.id}" if self.id is not None else None, f"candidate={self.candidate!r}" if self.candidate else None]
        return "trajectory " + " ".join(p for p in parts if p) + f" (agent {self.agent!r}, generation {self.generation})"


def trajectories_from_episodes(episodes: Iterable[dict[str, np.ndarray]], candidate: str, outcome: str = "") -> list[Trajectory]:
    """Episodes as returned by ``agents.tasks.episodes.run_episodes`` -> trajectories."""
    return [
        Trajectory(
            obs=ep["obs"], action=ep["action"], reward=ep["reward"], next_obs=ep["next_obs"], done=ep["done"],
            candidate=candidate, outcome=outcome,
        )
        for ep in episodes
    ]

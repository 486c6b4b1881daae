"""One episode's transitions, as the replay buffer stores them and the world
model trains on them."""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field
from typing import Iterable, Mapping, Optional

import numpy as np
from numpy.typing import ArrayLike

ARRAY_FIELDS = ("obs", "action", "reward", "next_obs", "done")
FLOAT_FIELDS = ("obs", "action", "reward", "next_obs")  # stored as float32: NaN and inf are refused


F32_INF_FROM = 2.0**128 * (1 - 2.0**-25)  # the smallest magnitude that float32 rounds to inf
MAX_MAGNITUDE = 1e15
"""The largest magnitude a stored value may have. Finite float32 values near
its limit (a reward of 1e38) still overflow the learners' float32 statistics
(a sum of squares over a replay buffer of millions of transitions, a TD target
r / (1 - gamma)); beyond 1e15 a value is refused like NaN: it costs its
candidate, not the run."""


def first_non_finite(values: ArrayLike) -> Optional[int]:
    """Where ``values`` stop being finite once stored as float32 (how the
    replay buffer keeps them): the index along the first axis of the first
    entry holding NaN or inf, or a magnitude beyond `MAX_MAGNITUDE`, or None
    when all are finite and in range. A float64 beyond float32's range (1e39)
    counts as inf, since that is what would be stored. A scalar is one entry
    (0 or None). Torch-free: the episode workers use it."""
    if isinstance(values, float):  # a reward, once per env step: the cheapest test
        return None if abs(values) <= MAX_MAGNITUDE else 0
    with np.errstate(over="ignore"):  # the overflow to inf is what this looks for, not a warning
        stored = np.asarray(values, dtype=np.float32)
    finite = np.abs(stored) <= MAX_MAGNITUDE  # False for NaN and inf too
    if finite.all():
        return None
    return int(np.argwhere(~finite.reshape(stored.shape[0] if stored.ndim else 1, -1))[0][0])


def non_finite_field(arrays: Mapping[str, ArrayLike]) -> Optional[tuple[str, int]]:
    """The first field of ``arrays`` (in its order) that `first_non_finite`
    finds NaN or inf in, and the index of its first bad entry; None when all are finite."""
    for name, values in arrays.items():
        bad = first_non_finite(values)
        if bad is not None:
            return name, bad
    return None


@dataclass
class Trajectory:
    """One episode. Arrays: obs (T, obs_dim), action (T, act_dim), reward (T,),
    next_obs (T, obs_dim), done (T,); stored as float32 (done as bool).

    Raises `ValueError` when made with inconsistent shapes, no transitions, or
    NaN or inf in obs, action, reward or next_obs as float32 (a reward of
    1e39 is inf there): the message names the field and the transition.
    """

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
    # False only for rows read back from a replay buffer: a database written before this
    # check may hold NaN, and reading it must stay possible so that training can name the
    # row (NonFiniteDataError) and delete_trajectories can remove it
    refuse_non_finite: InitVar[bool] = True

    def __post_init__(self, refuse_non_finite: bool = True) -> None:
        with np.errstate(over="ignore"):  # a value beyond float32 becomes inf: check_finite names it, not a warning
            self.obs = np.asarray(self.obs, dtype=np.float32)
            self.next_obs = np.asarray(self.next_obs, dtype=np.float32)
            self.action = np.asarray(self.action, dtype=np.float32)
            self.reward = np.asarray(self.reward, dtype=np.float32).reshape(-1)
        if self.action.ndim == 1:
            self.action = self.action.reshape(-1, 1)
        self.done = np.asarray(self.done, dtype=bool).reshape(-1)
        n = self.obs.shape[0]
        shapes = {k: getattr(self, k).shape for k in ARRAY_FIELDS}
        if (
            self.obs.ndim != 2
            or self.next_obs.shape != self.obs.shape
            or any(getattr(self, k).shape[0] != n for k in ARRAY_FIELDS)
        ):
            raise ValueError(
                f"trajectory {self.candidate or self.id!r}: inconsistent transition shapes {shapes}; "
                "expected obs and next_obs (T, obs_dim), action (T, act_dim), reward and done (T,)"
            )
        if n == 0:
            raise ValueError(
                f"trajectory {self.candidate or self.id!r}: no transitions; expected at least one "
                "(obs, action, reward, next_obs, done) step: leave an empty episode out instead of storing it"
            )
        if refuse_non_finite:
            self.check_finite()
        if self.return_ is None:
            self.return_ = float(self.reward.sum())

    def check_finite(self) -> None:
        """Raise `ValueError` naming the field and transition of the first
        NaN or inf in obs, action, reward or next_obs (as stored, float32)."""
        bad = non_finite_field({name: getattr(self, name) for name in FLOAT_FIELDS})
        if bad is not None:
            name, t = bad
            raise ValueError(
                f"trajectory {self.candidate or self.id!r}: non-finite {name} at transition {t} (NaN or inf as "
                "float32, or beyond "
                f"+-{MAX_MAGNITUDE:g}); expected finite values: leave this episode out (its env returned bad data) "
                "instead of storing it"
            )

    @property
    def label(self) -> str:
        """How errors name this trajectory."""
        parts = [
            f"id={self.id}" if self.id is not None else None,
            f"candidate={self.candidate!r}" if self.candidate else None,
        ]
        return (
            "trajectory " + " ".join(p for p in parts if p) + f" (agent {self.agent!r}, generation {self.generation})"
        )


def trajectories_from_episodes(
    episodes: Iterable[dict[str, np.ndarray]], candidate: str, outcome: str = ""
) -> list[Trajectory]:
    """Episodes as returned by ``agents.tasks.episodes.run_episodes`` -> trajectories."""
    return [
        Trajectory(
            obs=ep["obs"],
            action=ep["action"],
            reward=ep["reward"],
            next_obs=ep["next_obs"],
            done=ep["done"],
            candidate=candidate,
            outcome=outcome,
        )
        for ep in episodes
    ]

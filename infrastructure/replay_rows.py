"""The replay database's row format: one row per trajectory, its arrays as
raw little-endian bytes with their shapes (nothing pickled, so a foreign
database can never run code), and the check that keeps non-finite data out."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .trajectory import FLOAT_FIELDS, Trajectory, non_finite_field

SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS trajectories (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    agent TEXT NOT NULL,
    generation INTEGER NOT NULL,
    candidate TEXT NOT NULL,
    return REAL,
    outcome TEXT NOT NULL DEFAULT '',
    length INTEGER NOT NULL,
    obs_dim INTEGER NOT NULL,
    act_dim INTEGER NOT NULL,
    obs BLOB NOT NULL,
    action BLOB NOT NULL,
    reward BLOB NOT NULL,
    next_obs BLOB NOT NULL,
    done BLOB NOT NULL,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS trajectories_agent_id ON trajectories (agent, id);
CREATE INDEX IF NOT EXISTS trajectories_agent_generation ON trajectories (agent, generation);
"""

COLUMNS = (
    "id, agent, generation, candidate, return, outcome, length, obs_dim, act_dim, obs, action, reward, next_obs, "
    "done, created"
)


def trajectory_row(agent: str, generation: int, traj: Trajectory, created: float) -> tuple:
    """The INSERT values of ``traj`` (every column of `COLUMNS` but ``id``)."""
    return (
        agent,
        int(generation),
        traj.candidate,
        None if traj.return_ is None else float(traj.return_),
        traj.outcome,
        int(traj.obs.shape[0]),
        int(traj.obs.shape[1]),
        int(traj.action.shape[1]),
        traj.obs.astype("<f4").tobytes(),
        traj.action.astype("<f4").tobytes(),
        traj.reward.astype("<f4").tobytes(),
        traj.next_obs.astype("<f4").tobytes(),
        traj.done.astype("u1").tobytes(),
        created,
    )


def row_to_trajectory(row: tuple) -> Trajectory:
    """A row selected as `COLUMNS` -> its trajectory."""
    (
        tid,
        agent,
        generation,
        candidate,
        ret,
        outcome,
        length,
        obs_dim,
        act_dim,
        obs,
        action,
        reward,
        next_obs,
        done,
        created,
    ) = row
    return Trajectory(
        obs=np.frombuffer(obs, dtype="<f4").reshape(length, obs_dim),
        action=np.frombuffer(action, dtype="<f4").reshape(length, act_dim),
        reward=np.frombuffer(reward, dtype="<f4").reshape(length),
        next_obs=np.frombuffer(next_obs, dtype="<f4").reshape(length, obs_dim),
        done=np.frombuffer(done, dtype="u1").reshape(length).astype(bool),
        candidate=candidate,
        return_=ret,
        outcome=outcome,
        agent=agent,
        generation=generation,
        id=tid,
        created=created,
        # a row from before the check is readable, so training can name it and it can be deleted
        refuse_non_finite=False,
    )


def refuse_non_finite(agent: str, generation: int, trajectories: Sequence[Trajectory]) -> None:
    """ValueError naming the first trajectory with NaN or inf (as float32).
    `Trajectory` checks when it is made, but its arrays may change after; one
    NaN row would stop every later training on this agent's data."""
    for k, traj in enumerate(trajectories):
        bad = non_finite_field({name: getattr(traj, name) for name in FLOAT_FIELDS})
        if bad is not None:
            name, t = bad
            raise ValueError(
                f"trajectory {k} of the generation (candidate {traj.candidate!r}): non-finite {name} at transition "
                f"{t} (NaN or inf as float32); "
                f"refusing to store generation {generation} of agent {agent!r}, nothing of it was written: "
                "leave this trajectory out (its env returned bad data) and append the others"
            )

"""The built-in Pendulum task's constants and helpers, and its real
episodes in this process (tests and scripts use them)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from .tasks.builtin import pendulum
from .tasks.episodes import run_episodes as _run
from .tasks.pendulum import (
    ACT_DIM,
    EPISODE_STEPS,
    ENV_ID,
    HIDDEN,
    N_HELDOUT_STARTS,
    N_PARAMS,
    N_TRAIN_STARTS,
    OBS_DIM,
    OBS_SCALE,
    TARGET_RETURN,
    extra_states,
    observation,
    project,
    random_params,
    set_state,
    start_states,
)

__all__ = [
    "ACT_DIM",
    "EPISODE_STEPS",
    "ENV_ID",
    "HIDDEN",
    "N_HELDOUT_STARTS",
    "N_PARAMS",
    "N_TRAIN_STARTS",
    "OBS_DIM",
    "OBS_SCALE",
    "TARGET_RETURN",
    "extra_states",
    "observation",
    "project",
    "random_params",
    "run_episodes",
    "set_state",
    "start_states",
]


def run_episodes(
    params: Sequence[float], states: Sequence[Sequence[float]], steps: int = EPISODE_STEPS
) -> dict[str, Any]:
    """Real episodes of the built-in Pendulum task, in this process."""
    return _run(replace(pendulum().resolve().episode_spec, steps=steps), params, states)

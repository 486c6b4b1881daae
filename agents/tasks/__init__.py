"""Tasks for the evolution loop: what to evolve and how to judge it."""

from .episodes import EnvFailure, EpisodeSpec, run_episodes
from .policies import POLICY_KINDS, PolicySpec, parse_policy
from .registry import GROUP, get_task, task_names
from .task import ExactStates, ImaginedStarts, ResolvedTask, StartStates, Task, TaskError

__all__ = [
    "GROUP", "POLICY_KINDS", "EnvFailure", "EpisodeSpec", "ExactStates", "ImaginedStarts", "PolicySpec", "ResolvedTask",
    "StartStates", "Task", "TaskError", "get_task", "parse_policy", "run_episodes", "task_names",
]

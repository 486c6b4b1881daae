"""Tasks for the evolution loop: what to evolve and how to judge it."""

from genesis_fp16.base.lazy import lazy_exports

# imported on first use: `genesis-fp16 --help` imports `agents.cli`, which needs only `.pendulum`
_LAZY = {
    "EnvFailure": ".episodes", "EpisodeSpec": ".episodes", "run_episodes": ".episodes",
    "POLICY_KINDS": ".policies", "PolicySpec": ".policies", "parse_policy": ".policies",
    "GROUP": ".registry", "get_task": ".registry", "task_names": ".registry",
    "ExactStates": ".task", "ResolvedTask": ".task", "StartStates": ".task", "Task": ".task",
    "TaskError": ".task",
}  # fmt: skip

__all__ = [
    "GROUP",
    "POLICY_KINDS",
    "EnvFailure",
    "EpisodeSpec",
    "ExactStates",
    "PolicySpec",
    "ResolvedTask",
    "StartStates",
    "Task",
    "TaskError",
    "get_task",
    "parse_policy",
    "run_episodes",
    "task_names",
]
__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)

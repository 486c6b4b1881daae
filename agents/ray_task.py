"""The Ray task of ``agents.ray_evaluation``: several real episodes of one
candidate under the worker memory limit.

Kept apart (standard library and ``agents.tasks`` only, no torch, no Ray) so
a Ray worker that imports it starts as quickly as a process-pool worker.
A Ray worker is reused across tasks, so the address-space cap is set for this
task and the previous one restored after it.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from .tasks.episodes import EpisodeSpec, run_episodes
from .worker_limits import limit_worker_memory


def run_chunk(
    spec: EpisodeSpec,
    params: Sequence[float],
    states: Sequence[Sequence[float]],
    memory_limit_mb: Optional[int],
) -> dict[str, Any]:
    """`run_episodes` with this process's address space capped at what
    it holds now plus ``memory_limit_mb`` while it runs (None: no cap)."""
    try:
        import resource
    except ImportError:  # not POSIX: the timeout still applies
        return run_episodes(spec, params, states)
    previous = resource.getrlimit(resource.RLIMIT_AS)
    limit_worker_memory(memory_limit_mb)
    try:
        return run_episodes(spec, params, states)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, previous)

"""Where a run's wall time goes: start-up (each session's time from the
command's start, or the agent's construction, to the loop: imports, settings,
the task, the replay buffer, a resume's snapshots), training the world model,
its short rollouts, training the critic (each learner's building and precision
decision included), the refinement's actor-gradient steps and real episodes;
``other`` is the rest of the wall time (CMA-ES, replay writes, manifests, the
answer's and the held-out evaluation). ``model_share`` is the learned parts'
share: everything but start-up, real episodes and other."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Optional

BUCKETS = ("start_up", "model_train", "model_rollouts", "critic", "refine", "real_episodes")
MODEL_BUCKETS = ("model_train", "model_rollouts", "critic", "refine")


class TimeShare:
    """Wall seconds per bucket, summed over the run (every session: the
    totals are kept in the run manifest)."""

    def __init__(self, seconds: Optional[Mapping[str, float]] = None) -> None:
        self.seconds = {b: 0.0 for b in BUCKETS}
        for name, value in (seconds or {}).items():
            if name not in self.seconds:
                raise ValueError(f"time bucket {name!r}: expected one of {', '.join(BUCKETS)}")
            self.seconds[name] = float(value)

    @contextmanager
    def measure(self, bucket: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[bucket] += time.perf_counter() - started

    def add(self, bucket: str, seconds: float) -> None:
        self.seconds[bucket] += seconds

    def snapshot(self) -> dict[str, float]:
        return dict(self.seconds)

    def since(self, snapshot: Mapping[str, float]) -> dict[str, float]:
        """Seconds per bucket since ``snapshot`` (a generation's share)."""
        return {b: self.seconds[b] - snapshot[b] for b in BUCKETS}

    def report(self, wall_s: float) -> dict[str, Any]:
        """The buckets, ``other`` (wall time outside them) and ``model_share`` (None without wall time)."""
        inside = sum(self.seconds.values())
        model = sum(self.seconds[b] for b in MODEL_BUCKETS)
        return {
            **self.seconds,
            "other": max(0.0, wall_s - inside),
            "model_share": model / wall_s if wall_s > 0 else None,
        }

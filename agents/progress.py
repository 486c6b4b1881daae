"""What an evolution run says while it runs: a `ProgressEvent` as each real
episode finishes and as each phase (a generation's episodes, the world model,
the model rollouts, the critic, the refinement, the verification, the answer
and the held-out evaluation) begins, advances step by step and ends. The
command turns them into its progress bar and phase line (`agents.cli`); an
embedding program passes ``on_progress`` to the agent.

Step events are thinned to at most one per `STEP_EVERY_S` of the run's clock
per phase (a phase's first and last steps always pass), so a learner's
thousands of steps cost the callback a few calls a second; a phase's begin
and end always pass. Everything that runs for long reports its steps: real
episodes as their chunks finish, the learners' optimizer steps, the
refinement's ascent steps. With a known cost per episode and per step, the
longest silence of a run is the longest of one such unit and `STEP_EVERY_S`
(tests/test_se_darwin_agent.py checks it with a fake clock).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

__all__ = [
    "ANSWER",
    "CRITIC",
    "EPISODES",
    "HELDOUT",
    "MODEL_ROLLOUTS",
    "PHASES",
    "REFINEMENT",
    "STEP_EVERY_S",
    "VERIFICATION",
    "WORLD_MODEL",
    "ProgressEvent",
    "ProgressFn",
    "RunProgress",
]

EPISODES = "episodes"
WORLD_MODEL = "world model"
MODEL_ROLLOUTS = "model rollouts"
CRITIC = "critic"
REFINEMENT = "refinement"
VERIFICATION = "verification"
ANSWER = "answer"
HELDOUT = "held-out"
PHASES = (EPISODES, WORLD_MODEL, MODEL_ROLLOUTS, CRITIC, REFINEMENT, VERIFICATION, ANSWER, HELDOUT)
"""The phases, in the order a generation (then the end of the run) runs them."""

STEP_EVERY_S = 0.1
"""The least time between two step events of one phase (the run's clock)."""


@dataclass(frozen=True)
class ProgressEvent:
    """One thing the run did. ``phase``: one of `PHASES`; ``state``: ``begin``,
    ``step`` or ``end``; ``done`` of ``total`` ``unit`` (``episodes``, ``steps``,
    ``rollouts``; ``total`` None: not known ahead, as a verification's episodes);
    ``generation``: the generation it belongs to (the answer's and the held-out
    evaluation's: the last one run); ``real_episodes``: real episodes charged so
    far, those of this phase that finished included; ``detail``: what the phase
    is doing when its steps do not say it (``deciding precision``); ``at``: the
    run's clock when it happened."""

    phase: str
    state: str
    done: int
    total: Optional[int]
    unit: str
    generation: int
    real_episodes: int
    detail: str = ""
    at: float = 0.0


ProgressFn = Callable[[ProgressEvent], None]


class Phase:
    """A running phase: `advance` reports its steps done so far (`RunProgress.phase`)."""

    def __init__(self, progress: "RunProgress", name: str, total: Optional[int], unit: str, episodes: bool) -> None:
        self.progress, self.name, self.total, self.unit, self.episodes = progress, name, total, unit, episodes
        self.done, self.detail = 0, ""
        self._last: Optional[float] = None
        self._lock = threading.Lock()  # steps may come from a worker thread while the loop's thread reads

    def advance(self, done: int) -> None:
        """``done`` steps of the phase so far (absolute, not an increment)."""
        with self._lock:
            self.done = done
            now = self.progress.clock()
            final = self.total is not None and done >= self.total
            if not final and self._last is not None and now - self._last < STEP_EVERY_S:
                return
            self._last = now
        self.progress.emit(self, "step")

    def add(self, n: int) -> None:
        """``n`` more steps done (episodes as a chunk of them finishes)."""
        self.advance(self.done + n)

    def note(self, detail: str) -> None:
        """Say what the phase is doing now (a step event with ``detail``)."""
        self.detail = detail
        self.progress.emit(self, "step")


class RunProgress:
    """The run's progress reporter: sends `ProgressEvent`s to ``fn`` (None:
    nothing is made or sent). ``episodes``: real episodes charged so far (the
    run state's counter); ``clock``: the run's clock (a test passes a fake one)."""

    def __init__(
        self,
        fn: Optional[ProgressFn] = None,
        *,
        episodes: Callable[[], int] = lambda: 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fn, self.episodes, self.clock = fn, episodes, clock
        self.generation = 0

    @property
    def enabled(self) -> bool:
        return self.fn is not None

    def emit(self, phase: Phase, state: str) -> None:
        fn = self.fn
        if fn is None:
            return
        fn(
            ProgressEvent(
                phase=phase.name,
                state=state,
                done=phase.done,
                total=phase.total,
                unit=phase.unit,
                generation=self.generation,
                real_episodes=self.episodes() + (phase.done if phase.episodes else 0),
                detail=phase.detail,
                at=self.clock(),
            )
        )

    @contextmanager
    def phase(
        self,
        name: str,
        total: Optional[int],
        unit: str = "steps",
        *,
        episodes: bool = False,
        detail: str = "",
        done: int = 0,
    ) -> Iterator[Phase]:
        """A phase of ``total`` ``unit``, ``done`` of them already (a round of a phase
        counted over several): its begin event now, its end event when the block
        leaves (by an error too: the display moves on). ``episodes``: its steps are
        real episodes not yet charged to the run's counter."""
        phase = Phase(self, name, total, unit, episodes)
        phase.detail, phase.done = detail, done
        self.emit(phase, "begin")
        try:
            yield phase
        finally:
            self.emit(phase, "end")

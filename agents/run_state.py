"""The evolution loop's own state, typed: what a resumed run reads back from
its manifest beside the CMA-ES record, the observation statistics and the
candidates (`agents.run_record`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from enum import Enum
from typing import Any, Optional


class StopReason(str, Enum):
    """Why a run stopped: the target met and confirmed, a budget, or every real evaluation failed."""

    TARGET = "target"
    BUDGET = "budget"
    FAILED = "failed"


@dataclass
class RunState:
    """``generation``: the last committed one (-1: none); ``candidates_run``:
    candidates given their one episode so far (candidate c runs on training
    start state ``order[c mod n]``); ``reached_at``: real episodes spent when
    the target was met and confirmed, ``answer`` that candidate's id;
    ``budget_exhausted``: ``episodes`` or ``env_steps``, the budget that
    stops the run; ``unconfirmed``: a candidate that met the target with no
    budget left to confirm it."""

    generation: int = -1
    candidates_run: int = 0
    reached_at: Optional[int] = None
    answer: Optional[str] = None
    budget_exhausted: Optional[str] = None
    unconfirmed: Optional[str] = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunState":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"run state with unknown fields {unknown}")
        return cls(**data)

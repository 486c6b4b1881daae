"""What `genesis_fp16.guarded.GuardedTraining` trains against and reports.

The rollback guard's contract (`Guard`, `QualityLedger`;
`genesis_fp16.guard.RollbackGuard` is the real one), how ``guard=`` is said
(`GuardChoice`: the agent's own guard, or `UNGUARDED` said out loud), the FP32
reference trained beside a reduced-precision run (`Reference`) and what one
training call reports (`CallReport`, with the precision decision it ran under
and the guard's verdicts, `genesis_fp16.judge.Verdict`, as they are).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, Union

import torch

from .guard import RollbackGuard
from .judge import Verdict
from .settings import Settings
from .trainer import FP16Trainer

if TYPE_CHECKING:
    from .decision import PrecisionDecision

LossFn = Callable[[torch.nn.Module, Any], torch.Tensor]
ValFn = Callable[[torch.nn.Module, FP16Trainer], float]
"""``val_fn(model, trainer) -> validation loss``, under ``trainer.autocast()`` (the reference's is FP32)."""
SaveFn = Callable[[Path], Path]
LoadFn = Callable[[FP16Trainer, Path], Any]


class GuardChoice(enum.Enum):
    """``guard=`` without a guard object: the agent's own `RollbackGuard`
    (``DEFAULT_GUARD``, the default) or none, said explicitly (``UNGUARDED``)."""

    DEFAULT = "default"
    UNGUARDED = "unguarded"


DEFAULT_GUARD = GuardChoice.DEFAULT
"""The default ``guard=``: ``RollbackGuard(agent)`` with the agent's thresholds."""
UNGUARDED = GuardChoice.UNGUARDED
"""Pass as ``guard=`` to train without a rollback guard (no rollback, no canary, no good checkpoints)."""


class QualityLedger(Protocol):
    """Where reference measurements go (`genesis_fp16.rollout.RolloutLedger`)."""

    def record_shadow_gap(self, agent: str, val_loss: float, fp32_val_loss: float, precision: str) -> object: ...

    def record_quality_check(
        self, agent: str, kind: str, metrics: dict[str, Any], precision: Optional[str] = None, alarm: Optional[bool] = None
    ) -> object: ...


class Guard(Protocol):
    """What `GuardedTraining` needs of a rollback guard (`RollbackGuard` is the real one)."""

    tripped: Optional[Verdict]
    ledger: QualityLedger

    @property
    def canary_every(self) -> int: ...

    def canary_due(self) -> bool: ...

    @property
    def last_good_checkpoint(self) -> Union[str, Path, None]: ...

    def attach(self, trainer: FP16Trainer) -> None: ...

    def check(
        self, trainer: FP16Trainer, *, val_loss: Optional[float] = None, fp32_val_loss: Optional[float] = None, reference: str = "shadow"
    ) -> Verdict: ...

    def check_policy_canary(
        self, trainer: Optional[FP16Trainer] = None, *, kl: float, max_logp_delta: float, max_value_delta: float
    ) -> Verdict: ...

    def recover(self, build: Callable[[], FP16Trainer], load: Optional[LoadFn] = None) -> tuple[FP16Trainer, Optional[Path]]: ...

    def record_good_checkpoint(self, path: Union[str, Path]) -> None: ...

    def reset(self) -> None: ...


@dataclass
class Reference:
    """An FP32 copy trained beside the reduced-precision model on the same batches."""

    kind: str
    """``shadow`` (kept for the rollout stage) or ``canary`` (fresh from the current weights, for one call)."""
    model: torch.nn.Module
    trainer: FP16Trainer


class RollbackSummary:
    """``rolled_back`` and ``rollback_reason`` of a report with a ``rollback`` verdict (None without one)."""

    rollback: Optional[Verdict]

    @property
    def rolled_back(self) -> bool:
        """Whether the call rolled back."""
        return self.rollback is not None

    @property
    def rollback_reason(self) -> Optional[str]:
        """``"<severity>: <reason>"`` of the first rollback in the call (`Verdict.summary`)."""
        return None if self.rollback is None else self.rollback.summary


@dataclass
class CallReport(RollbackSummary):
    """What one training call (``begin_call`` ... ``finish_call``) did."""

    precision: str
    """The precision that runs after the call (``fp32`` after a rollback)."""
    val_loss: Optional[float] = None
    """The validation loss of the weights in use after the call (the restored ones after a rollback); None without ``val_fn``."""
    fp32_val_loss: Optional[float] = None
    """The FP32 reference's validation loss; None when no reference trained this call."""
    gap: Optional[float] = None
    """``(val_loss - fp32_val_loss) / fp32_val_loss``; None when undefined."""
    reference: Optional[str] = None
    """Where ``fp32_val_loss`` comes from: ``shadow``, ``canary`` or None."""
    canary_due: bool = False
    """Whether this call was a canary call (every ``guard.canary_every``-th reduced-precision call)."""
    rollback: Optional[Verdict] = None
    """The guard's verdict of the first rollback in the call (None: no rollback)."""
    restored: Optional[str] = None
    """The checkpoint the rollback restored."""
    decision: Optional[Verdict] = None
    """The guard's judgement at the end of the call (None unguarded)."""
    skipped_steps: int = 0
    """Steps skipped during the call, over every trainer it used."""
    events: list[str] = field(default_factory=list)
    """What happened, in words (``restored <path>``, ``rolled back to fp32: ...``)."""
    precision_decision: Optional["PrecisionDecision"] = None
    """The precision decision of the trainer in use after the call (mode, source, reason; `genesis_fp16.decision`)."""



def resolve_guard(owner: str, agent: str, guard: Union[Guard, GuardChoice], settings: Settings) -> Optional[Guard]:
    """The guard a ``guard=`` argument means: left out (`DEFAULT_GUARD`), the
    agent's own `RollbackGuard`; `UNGUARDED`, none; a guard, itself. ``None``
    is refused, so that "no guard" is always said out loud."""
    if guard is UNGUARDED:
        return None
    if guard is DEFAULT_GUARD:
        return RollbackGuard(agent, settings=settings)
    if guard is None:
        raise TypeError(
            f"{owner}: guard=None; expected a RollbackGuard, nothing (the agent's own "
            "RollbackGuard) or guard=UNGUARDED to train without one"
        )
    return guard


@dataclass
class _Call:
    """One training call's bookkeeping in `GuardedTraining` (begin_call ... finish_call)."""

    skipped_from: int
    report: CallReport
    reference: Optional[Reference] = None
    skipped_before: int = 0
    prepare: Optional[Callable[[torch.nn.Module], None]] = None


def record_training(ledger: QualityLedger, agent: str, report: CallReport, log: Any) -> None:
    """A training call's outcome in the ledger (kind ``training``): `rollout status` shows every agent that trained,
    with its precision, where that came from and how its last training went. A ledger that cannot be written
    (read-only, full disk) costs the record, not the training."""
    from .rollout import LedgerError
    from .telemetry import log_once

    decision = report.precision_decision
    metrics = {"skipped_steps": report.skipped_steps, "val_loss": report.val_loss,
               "source": decision.source.value if decision is not None else None,
               "outcome": f"rolled back: {report.rollback_reason}" if report.rolled_back else "healthy"}
    try:
        ledger.record_quality_check(agent, "training", metrics, precision=report.precision, alarm=report.rolled_back)
    except LedgerError as exc:
        log_once(log, f"training_unrecorded:{agent}", "warning", "guarded.training_unrecorded", error=str(exc))

"""What the world model reports after training, and what it needs of the
rollback guard and the rollout ledger (typed, so any object with these
methods will do; ``genesis_fp16.guard.RollbackGuard`` is the real one)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Protocol, Union

from genesis_fp16.trainer import FP16Trainer


class GuardVerdict(Protocol):
    """A guard's decision (``genesis_fp16.guard.GuardDecision``)."""

    severity: Optional[str]
    action: str  # "none", "warn" or "rollback"
    reason: str

    def as_dict(self) -> dict[str, Any]: ...


class ShadowGapLedger(Protocol):
    """Where shadow-stage measurements go (``genesis_fp16.rollout.RolloutLedger``)."""

    def record_shadow_gap(self, agent: str, val_loss: float, fp32_val_loss: float, precision: str) -> object: ...

    def record_quality_check(
        self, agent: str, kind: str, metrics: dict[str, Any], precision: Optional[str] = None, alarm: Optional[bool] = None
    ) -> object: ...


class Guard(Protocol):
    """A rollback guard (``genesis_fp16.guard.RollbackGuard``): it watches the
    trainer it is attached to, sets :attr:`tripped` on a live P0 trigger and
    judges a finished run in :meth:`check`."""

    tripped: Optional[GuardVerdict]
    ledger: ShadowGapLedger

    @property
    def canary_every(self) -> int: ...

    @property
    def last_good_checkpoint(self) -> Union[str, Path, None]: ...

    def attach(self, trainer: FP16Trainer) -> None: ...

    def check(
        self, trainer: FP16Trainer, *, val_loss: Optional[float] = None, fp32_val_loss: Optional[float] = None, reference: str = "shadow"
    ) -> GuardVerdict: ...

    def record_good_checkpoint(self, path: Union[str, Path]) -> None: ...

    def reset(self) -> None: ...


@dataclass
class TrainReport:
    train_loss: float
    val_loss: float
    precision: str
    steps: int
    skipped_steps: int
    wall_s: float
    transitions: int
    trajectories: int
    fp32_val_loss: Optional[float] = None
    shadow_gap: Optional[float] = None  # (val_loss - fp32_val_loss) / fp32_val_loss, from the shadow or the canary
    reference: Optional[str] = None  # where fp32_val_loss comes from: "shadow", "canary" or None (no FP32 reference)
    inference_val_loss_fp32: Optional[float] = None  # val loss of the same weights without autocast
    inference_gap: Optional[float] = None  # (val_loss - inference_val_loss_fp32) / inference_val_loss_fp32
    rolled_back: bool = False
    rollback_reason: Optional[str] = None
    checkpoint: Optional[str] = None
    guard_decision: Optional[dict[str, Any]] = None
    events: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

"""What the world model reports after training, what it needs of the
rollback guard and the rollout ledger (typed, so any object with these
methods will do; ``genesis_fp16.guard.RollbackGuard`` is the real one), one
run's bookkeeping and its validation measurements."""

from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Protocol, Union

import torch

from genesis_fp16.trainer import FP16Trainer

from .dynamics import DynamicsMLP, mse_loss


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
    trainer it is attached to, sets `tripped` on a live P0 trigger and
    judges a finished run in `check`."""

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
    """What one ``WorldModel.train()`` call did.

    ``train_loss`` / ``val_loss``: the last training loss and the validation
    loss (under the trainer's autocast); ``precision``: what ran; ``steps`` /
    ``skipped_steps``: optimizer steps and how many were skipped;
    ``transitions`` / ``trajectories``: the data used. ``fp32_val_loss``,
    ``shadow_gap`` and ``reference`` (``shadow`` or ``canary``) are set when an
    FP32 reference was measured; ``inference_val_loss_fp32`` and
    ``inference_gap`` compare the same weights without autocast.
    ``rolled_back``, ``rollback_reason``, ``checkpoint`` (restored or saved) and
    ``guard_decision`` say what the guard did; ``events`` lists the events the
    call logged.
    """

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

    def log_fields(self) -> dict[str, Any]:
        """The fields of the ``world_model.trained`` event."""
        names = ("train_loss", "val_loss", "precision", "steps", "skipped_steps", "wall_s", "transitions",
                 "fp32_val_loss", "reference", "inference_val_loss_fp32", "inference_gap", "rolled_back")
        fields = {name: getattr(self, name) for name in names}
        fields["wall_s"] = round(self.wall_s, 3)
        return fields


@dataclass
class TrainRun:
    """One training run's FP32 reference and rollback bookkeeping. A rollback
    replaces the trainer, whose skipped-step counter then starts from the
    restored checkpoint's: the steps skipped before are kept in ``skipped_before``."""

    skipped_from: int
    skipped_before: int = 0
    rollback_reason: Optional[str] = None
    events: list[str] = field(default_factory=list)
    reference: Optional[tuple[DynamicsMLP, FP16Trainer]] = None  # the FP32 copy trained beside the model
    reference_kind: Optional[str] = None  # "shadow" (stage shadow) or "canary" (stage on)

    @property
    def rolled_back(self) -> bool:
        return self.rollback_reason is not None


def val_loss_of(model: DynamicsMLP, trainer: FP16Trainer, x: torch.Tensor, y: torch.Tensor, *, autocast: bool = True) -> float:
    """Validation loss of ``model`` on raw ``(x, y)``, under ``trainer``'s autocast unless ``autocast`` is False."""
    model.eval()
    with torch.no_grad(), (trainer.autocast() if autocast else contextlib.nullcontext()):
        return float(mse_loss(model, (model.normalise_x(x), model.normalise_y(y))))


def inference_gap_of(
    model: DynamicsMLP, trainer: FP16Trainer, val_loss: float, x: torch.Tensor, y: torch.Tensor
) -> tuple[float, Optional[float]]:
    """The inference-side precision gap of the current weights: their
    validation loss without autocast, and ``(val_loss - that) / that`` (None
    when undefined; 0 for FP32, which has no autocast). One forward over the
    validation set: cheap enough for every call."""
    if trainer.precision.name == "fp32":
        return val_loss, 0.0
    fp32_eval = val_loss_of(model, trainer, x, y, autocast=False)
    gap = (val_loss - fp32_eval) / fp32_eval if fp32_eval > 0 and math.isfinite(val_loss) else None
    return fp32_eval, gap

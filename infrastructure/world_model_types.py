"""What the world model reports after training and its validation measurements, and the guarded call the
world model and the critic train through (`GuardedLearner._guarded_call`); what it needs of the rollback guard
and the ledger is typed in ``genesis_fp16.guarded`` (`Guard`, `QualityLedger`); the guard's verdict, carried as
it is, is `genesis_fp16.judge.Verdict`."""

from __future__ import annotations

import contextlib
import copy
import math
import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Iterable, Iterator, Optional, Union

import numpy as np
import torch

from genesis_fp16.decision import PrecisionDecision
from genesis_fp16.device import DeviceArg, resolve_device
from genesis_fp16.guarded_contract import LossFn, RollbackSummary, ValFn
from genesis_fp16.guarded import CallReport, Guard, GuardChoice, GuardedTraining, QualityLedger, Verdict, resolve_guard
from genesis_fp16.names import check_agent_name
from genesis_fp16.settings import Settings, load_settings
from genesis_fp16.telemetry import get_logger
from genesis_fp16.trainer import FP16Trainer

from .ensemble import EnsembleDynamics, member_losses

__all__ = ["Guard", "GuardedCallReport", "GuardedLearner", "ShadowGapLedger", "TrainReport", "inference_gap_of", "val_loss_of", "Verdict"]


ShadowGapLedger = QualityLedger
"""Where shadow-stage measurements go (``genesis_fp16.rollout.RolloutLedger``)."""


def _handing_over(batches: Iterable[Any]) -> Iterator[Any]:
    for batch in batches:  # the GIL handed to the event loop after each batch, not at the interpreter's 5 ms forced switch
        yield batch
        time.sleep(0)


class GuardedLearner:
    """What the world model and the critic share as guarded agents: the
    trainer in use, its precision and the decision behind it, read from the
    learner's `GuardedTraining` (``training``, built on first use)."""

    _training: Optional[GuardedTraining]
    training: GuardedTraining

    def _set_up_agent(self, kind: str, agent: str, *, settings: Optional[Settings], device: DeviceArg,
                      guard: Union[Guard, GuardChoice], precision: Optional[str]) -> None:
        """What every guarded learner sets first: its settings, checked agent
        name, logger (``infrastructure.<kind>``), device (one that is not there
        follows ``on_unsupported``; a fallback is logged as ``<kind>.device_fallback``),
        guard and the precision asked for."""
        owner = f"{type(self).__name__}({agent!r})"
        self.settings = settings or load_settings()
        self.agent = check_agent_name(agent)  # it names the checkpoint files (<agent>.pt)
        self._log = get_logger(f"infrastructure.{kind}", agent=agent)
        choice = resolve_device(self.settings.device if device is None else device, self.settings.on_unsupported, owner=owner)
        if choice.fallback_reason is not None:
            self._log.warning(f"{kind}.device_fallback", requested=choice.requested, device=str(choice.device), reason=choice.fallback_reason)
        self.device = choice.device
        self.guard: Optional[Guard] = resolve_guard(owner, self.agent, guard, self.settings)
        self.requested_precision = precision
        self._reused_decision: Optional[PrecisionDecision] = None

    def reuse_decision(self, decision: PrecisionDecision) -> bool:
        """Train on ``decision`` (an earlier one of this agent: a resumed run's,
        from its manifest) instead of deciding again, while the request it
        answered stands. Ignored (returns False) when it was made for another
        device. Call it before the trainer is built, or the trainer is rebuilt."""
        if decision.device != str(self.device):
            self._log.info("precision.decision_not_reused", agent=self.agent, decided_on=decision.device, device=str(self.device))
            return False
        self._reused_decision = decision
        if self._training is not None and self._training.decision != decision:
            self._training.decision = decision
            self._training._rebuild()
        return True

    def _guarded_call(self, started: float, report: type[GuardedCallReport], loss_fn: LossFn, *, prepare: Callable[[torch.nn.Module], None],
                      batches: Callable[[], Iterable[Any]], validation: Callable[[], ValFn], save: bool,
                      after_step: Optional[Callable[[torch.Tensor], None]] = None, after_rollback: Optional[Callable[[], None]] = None,
                      after_call: Callable[[CallReport], dict[str, Any]] = lambda call: {}, **fields: Any) -> Any:
        """A `train()` call: `begin_call` with ``prepare``; ``batches()`` (made then) in windows of ``loss_fn``, ``after_step``
        after each step taken, ``after_rollback`` after a rollback (there or in `finish_call`, with ``validation()`` made after
        the steps); ``after_call(call)``'s fields; a checkpoint if ``save`` (marked good if healthy); ``report.from_call``."""
        training = self.training
        training.begin_call(prepare=prepare)
        result = training.train_windows(_handing_over(batches()), loss_fn, after_step=after_step, after_rollback=after_rollback)
        rollbacks = len(training.rollbacks)
        call = training.finish_call(validation())
        if after_rollback is not None and len(training.rollbacks) != rollbacks:
            after_rollback()
        fields.update(after_call(call))
        self.trained = True
        checkpoint = str(self.save()) if save else None
        healthy = call.decision is None or call.decision.action != "rollback"
        if checkpoint is not None and self.guard is not None and healthy and call.val_loss is not None and math.isfinite(call.val_loss):
            training.mark_good(checkpoint)
        finite = [v for v in result.losses[-50:] if math.isfinite(v)]
        return report.from_call(call, train_loss=float(np.mean(finite)) if finite else float("nan"),
                                wall_s=time.perf_counter() - started, checkpoint=checkpoint, device=str(self.device), **fields)

    @property
    def trainer(self) -> Optional[FP16Trainer]:
        """The trainer in use (None before the first `train()`, `save()`, `load()` or `precision`)."""
        return self._training.trainer if self._training is not None else None

    @property
    def precision(self) -> str:
        """The precision training runs in now (`fp32`, `bf16`, ...), as settings, profile and ledger resolve it."""
        return self.training.trainer.precision.name

    @property
    def decision(self) -> Any:
        """The trainer's `PrecisionDecision` (mode, source, reason)."""
        return self.training.decision

    @property
    def decision_so_far(self) -> Optional[PrecisionDecision]:
        """The decision training runs on, without building the trainer (which
        may measure to decide): the trainer's once built, else the one handed to
        `reuse_decision`, else None (nothing decided yet)."""
        return self._training.decision if self._training is not None else self._reused_decision


class GuardedCallReport(RollbackSummary):
    """What a learner's report takes from its `GuardedTraining` call, shared by
    the world model's `TrainReport` and the critic's report: made by
    `from_call`, read by `rolled_back` / `rollback_reason`, flattened by `as_dict`."""

    rollback: Optional[Verdict]

    @classmethod
    def from_call(cls, call: CallReport, *, val_loss: Optional[float] = None, **fields: Any) -> Any:
        """The report of a `GuardedTraining` call (precision, validation and
        reference losses, rollback, guard decision, events) and the learner's
        own ``fields`` (losses, sizes, timing, checkpoint)."""
        val = call.val_loss if val_loss is None else val_loss
        return cls(
            val_loss=float(val) if val is not None else float("nan"), precision=call.precision, skipped_steps=call.skipped_steps,
            fp32_val_loss=call.fp32_val_loss, shadow_gap=call.gap, reference=call.reference if call.fp32_val_loss is not None else None,
            rollback=call.rollback, guard_decision=call.decision, events=list(call.events),
            precision_decision=call.precision_decision.as_dict() if call.precision_decision is not None else None, **fields,
        )

    def as_dict(self) -> dict[str, Any]:
        """The report as plain data: ``rollback`` as ``rolled_back`` and
        ``rollback_reason``, verdicts as their `Verdict.as_dict`."""
        out: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.name == "rollback":
                out.update(rolled_back=self.rolled_back, rollback_reason=self.rollback_reason)
            elif isinstance(value, Verdict):
                out[f.name] = value.as_dict()
            else:
                out[f.name] = copy.deepcopy(value)
        return out


@dataclass
class TrainReport(GuardedCallReport):
    """What one ``WorldModel.train()`` call did.

    ``train_loss`` / ``val_loss``: the last training loss and the validation
    loss (under the trainer's autocast); ``precision``: what ran; ``steps`` /
    ``skipped_steps``: optimizer steps and how many were skipped;
    ``transitions`` / ``trajectories``: the data used. ``fp32_val_loss``,
    ``shadow_gap`` and ``reference`` (``shadow`` or ``canary``) are set when an
    FP32 reference was measured; ``inference_val_loss_fp32`` and
    ``inference_gap`` compare the same weights without autocast.
    ``rollback`` (the verdict of the first rollback; ``rolled_back`` and
    ``rollback_reason`` read it), ``checkpoint`` (restored or saved) and
    ``guard_decision`` (the guard's verdict at the end) say what the guard did; ``events`` lists the events the
    call logged. ``device`` is where it trained; ``member_val_loss`` each
    member's FP32 validation loss and ``elites`` the members chosen by it,
    best first.
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
    rollback: Optional[Verdict] = None
    checkpoint: Optional[str] = None
    guard_decision: Optional[Verdict] = None
    events: list[str] = field(default_factory=list)
    device: Optional[str] = None  # where the model trained (cpu, cuda:0, ...)
    member_val_loss: Optional[list[float]] = None  # each member's FP32 validation loss, in member order
    elites: Optional[list[int]] = None  # the members rollouts and prediction use, best first
    precision_decision: Optional[dict[str, Any]] = None  # precision, source, reason (genesis_fp16.decision)

    def log_fields(self) -> dict[str, Any]:
        """The fields of the ``world_model.trained`` event."""
        names = ("train_loss", "val_loss", "precision", "steps", "skipped_steps", "wall_s", "transitions",
                 "fp32_val_loss", "reference", "inference_val_loss_fp32", "inference_gap", "rolled_back", "device", "elites")
        fields = {name: getattr(self, name) for name in names}
        fields["wall_s"] = round(self.wall_s, 3)
        if self.precision_decision is not None:
            fields["precision_source"] = self.precision_decision["source"]
            fields["precision_reason"] = self.precision_decision["reason"]
        return fields


def val_loss_of(model: EnsembleDynamics, trainer: FP16Trainer, x: torch.Tensor, y: torch.Tensor, *, autocast: bool = True) -> float:
    """Validation loss of ``model`` on raw ``(x, y)`` (on the model's device),
    under ``trainer``'s autocast unless ``autocast`` is False: the mean over
    all members (not only the elites, so that a model and its FP32 reference
    are compared on the same thing) of each member's squared error of its
    normalised mean, plus the done head's cross-entropy (`member_losses`)."""
    model.eval()
    with torch.no_grad(), (trainer.autocast() if autocast else contextlib.nullcontext()):
        return float(member_losses(model, model.normalise_x(x), model.normalise_y(y)).mean())


def inference_gap_of(
    model: EnsembleDynamics, trainer: FP16Trainer, val_loss: float, x: torch.Tensor, y: torch.Tensor
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

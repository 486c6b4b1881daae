"""The trainer: one loop path for every precision.

The loop calls the precision plugin's hooks and never branches on the mode
(Lightning Fabric's precision plugins; nanoGPT's one loop for every dtype).
The order of operations is PyTorch's AMP recipe ("Automatic Mixed Precision
examples", gradient clipping and accumulation sections): ``backward(loss/N)``
per micro-step (FP16: ``scaler.scale(loss/N).backward()``), then once per
optimizer step ``unscale_`` -> ``clip_grad_norm_`` -> ``optimizer_step``
(FP16: ``scaler.step`` -> ``scaler.update``).

The precision is decided before the trainer exists (`genesis_fp16.decision`):
the trainer takes a `PrecisionDecision` and runs its mode's plugin; it never
reads the ledger and never swaps its plugin (except `cast_model_to_fp16`,
asked for by name). Without a decision, the config decides
(`decision.decide`), with one exception, the seed API's ``auto``
(``FP16Trainer(model, optimizer, FP16TrainingConfig(precision="auto"))``)
under ``GENESIS_FP16_AUTO_PRECISION=measure`` (the default): the trainer
defers the choice to its first batch (`training_step` or `train_window`),
measures there on copies of the model and optimizer
(`autotune.measured_auto`, the host cache first, as ``GuardedTraining``'s
``sample`` does) and runs the decided precision's plugin from then on. Until
that batch it runs the flag rule's choice, said to be provisional
(`decision.pending_auto`; ``get_stats()["auto_pending"]``). With
``GENESIS_FP16_AUTO_PRECISION=rule``, ``auto`` is the device's flag rule.
Checkpoint save and restore live in `genesis_fp16.restore`.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, ClassVar, ContextManager, Iterable, Iterator, Optional, Union

import torch

from . import checkpoint as ckpt
from . import restore
from .config import FP16TrainingConfig
from .decision import PrecisionDecision, decide, pending_auto
from .precision import MODES, Precision
from .restore import CHECKPOINT_WARNING_EVENT, ExtraCheck
from .settings import AutoPrecision, PrecisionMode, Settings, load_settings
from .telemetry import EventListener, get_logger
from .window import WindowResult, run_window

__all__ = ["CHECKPOINT_WARNING_EVENT", "ExtraCheck", "FP16Trainer", "FP16TrainingConfig"]


def _infer_device(model: torch.nn.Module) -> torch.device:
    for tensor in list(model.parameters()) + list(model.buffers()):
        return tensor.device
    return torch.device("cpu")


class FP16Trainer:
    """Mixed-precision trainer around a model, an optimizer and an optional
    LR scheduler. See `FP16TrainingConfig` for the options.

    ``precision_plugins`` maps each mode to its plugin class; a subclass
    swaps variants there (the FSDP trainer's FP16 uses a sharded scaler)."""

    precision_plugins: ClassVar[Mapping[PrecisionMode, type[Precision]]] = MODES
    supports_window: ClassVar[bool] = True
    """Whether `train_window` may run its steps on the device (`genesis_fp16.window`); the distributed
    trainers keep the per-step path, where the ranks agree on a loss's finiteness."""
    measures_auto: ClassVar[bool] = True
    """Whether ``precision="auto"`` built without a decision may be decided by a measurement at
    the first batch (`genesis_fp16.autotune`) for this class: the DDP trainer measures on rank 0
    and sends every rank its decision; False for FSDP2, whose sharded model cannot be copied and
    stepped on one rank alone: it keeps the flag rule. (The registry measures before the trainer
    exists only for its single-process ``auto`` entry, `registry.resolve_trainer`.)"""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        config: Optional[FP16TrainingConfig] = None,
        scheduler: Optional[Any] = None,
        *,
        name: str = "trainer",
        listeners: Optional[list[EventListener]] = None,
        decision: Optional[PrecisionDecision] = None,
    ) -> None:
        # the caller's config is never mutated
        self.config = dataclasses.replace(config) if config is not None else FP16TrainingConfig()
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.name = name
        self.device = torch.device(self.config.device) if self.config.device else _infer_device(model)
        self.listeners: list[EventListener] = list(listeners or [])
        self._log = get_logger("genesis_fp16.trainer", trainer=name)
        self._auto_at_first_batch: Optional[Settings] = None if decision is not None else self._defers_auto()
        """The settings a seed-API ``auto`` measures under at its first batch; None once decided (or never deferred)."""
        if decision is None:
            decision = decide(self.config, self.device) if self._auto_at_first_batch is None else pending_auto(self.config, self.device)
        self.decision: PrecisionDecision = decision
        """What this trainer trains in, where that came from and why (`genesis_fp16.decision`); before a
        deferred ``auto``'s first batch, the flag rule's provisional choice (`auto_pending`)."""
        self.precision: Precision = self.precision_plugins[self.decision.mode](self.device, self.config.precision_config)
        self.model = self.precision.convert_module(model)  # fp16-true casts the weights; others return it as is
        self.training_steps = 0  # optimizer steps attempted (skipped ones included)
        self.overflow_steps = 0
        self.nonfinite_losses = 0
        self.nonfinite_streak = 0
        self.micro_steps = 0
        self.samples_seen = 0
        self._micro_in_window = 0
        self._started = time.perf_counter()
        self._last_scale = self.precision.scale

    # -- a seed-API auto, decided at the first batch ---------------------------
    def _defers_auto(self) -> Optional[Settings]:
        """The settings to measure under when this trainer's ``auto`` waits for its first batch, else None."""
        if not type(self).measures_auto or self.config.requested_precision != PrecisionMode.AUTO:
            return None
        settings = load_settings(check_names=False)
        return settings if settings.auto_precision == AutoPrecision.MEASURE else None

    @property
    def auto_pending(self) -> bool:
        """True while a seed-API ``auto`` waits for its first batch to measure on (it runs the rule's choice until then)."""
        return self._auto_at_first_batch is not None

    def _first_batch_decision(self, batch: Any, compute_loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
                              settings: Settings) -> PrecisionDecision:
        """The decision a deferred ``auto`` takes on its first batch: `autotune.measured_auto` on copies (the host
        cache's verdict for this workload, else a measurement written there), then `decision.decide`; the flag
        rule, saying why, where the workload cannot be measured. The distributed trainer sends rank 0's to every rank."""
        return self._measured_decision(self.model, batch, compute_loss_fn, settings, "decided at the first batch")

    def _measured_decision(self, model: torch.nn.Module, batch: Any, compute_loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
                           settings: Settings, when: str) -> PrecisionDecision:
        from .autotune import measured_auto

        found = measured_auto(model, self.optimizer, batch, compute_loss_fn, trainer_cls=FP16Trainer, device=self.device, settings=settings,
                              config=self.config, name=self.name)
        return decide(self.config, self.device, measured=found.calibration, cached=found.cached, unmeasured=found.why, when=when)

    def _decide_at_first_batch(self, batch: Any, compute_loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor]) -> None:
        """Take the deferred decision on ``batch`` and run its precision's plugin (kept when the provisional one is
        the same mode: a scaler state loaded from a checkpoint stays)."""
        settings = self._auto_at_first_batch
        assert settings is not None
        decision = self._first_batch_decision(batch, compute_loss_fn, settings)
        if decision.mode != self.decision.mode:
            self.precision = self.precision_plugins[decision.mode](self.device, self.config.precision_config)
            self.model = self.precision.convert_module(self.model)
            self._last_scale = self.precision.scale
        self.decision = decision
        self._auto_at_first_batch = None

    def _decide_at_first_of(self, batches: Iterable[Any],
                            compute_loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor]) -> Iterable[Any]:
        """`_decide_at_first_batch` on the first of ``batches``; returns them all, that one included."""
        rest = iter(batches)
        for first in rest:
            self._decide_at_first_batch(first, compute_loss_fn)
            return itertools.chain((first,), rest)
        return ()

    @property
    def calibration(self) -> Any:
        """The measurement the decision rests on (`decision.calibration`); None when none does."""
        return self.decision.calibration

    @property
    def auto_reason(self) -> Optional[str]:
        """Why ``auto`` runs what it runs; None when a precision was asked for by name."""
        return self.decision.reason if self.decision.requested == PrecisionMode.AUTO else None

    # -- events ------------------------------------------------------------
    def add_listener(self, listener: EventListener) -> None:
        self.listeners.append(listener)

    def _emit(self, event: str, level: str = "info", **fields: Any) -> None:
        fields.setdefault("precision", self.precision.name)
        getattr(self._log, level)(event, **fields)
        for listener in list(self.listeners):
            listener(event, dict(fields, trainer=self.name))

    # -- hooks the distributed trainer overrides -----------------------------
    def _set_gradient_sync(self, sync: bool) -> None:
        """Called before each micro-step's forward; ``sync`` is True only on the
        last micro-step of an optimizer step (DDP/FSDP skip the all-reduce
        otherwise)."""

    def _all_finite(self, loss: torch.Tensor) -> bool:
        """Whether the loss is finite (the distributed trainer agrees across ranks)."""
        return bool(torch.isfinite(loss.detach()).all())

    def _clip_gradients(self, max_norm: float) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)

    # -- the loop ------------------------------------------------------------
    @property
    def is_last_micro_step(self) -> bool:
        return self._micro_in_window + 1 >= self.config.grad_accumulation_steps

    @property
    def scaler(self) -> torch.amp.GradScaler:
        """The precision plugin's gradient scaler (a disabled one for modes
        without a scaler). Read-only: a variant scaler comes from the plugin's
        ``make_scaler``."""
        return self.precision.scaler

    def autocast(self) -> ContextManager[Any]:
        """The forward context of this trainer's precision (null for FP32)."""
        return self.precision.forward_context()

    def training_step(self, batch: Any, compute_loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor]) -> torch.Tensor:
        """Run ``compute_loss_fn(model, batch)`` under autocast and return the
        loss. A seed-API ``auto`` first decides its precision on this batch (the first one)."""
        if self._auto_at_first_batch is not None:
            self._decide_at_first_batch(batch, compute_loss_fn)
        if not self.model.training:
            # Only after someone switched the model to eval (validation, inference):
            # model.train() walks every submodule, about 2 us each, which is 1-2% of a
            # small world model's step (measured by `genesis-fp16 bench`, docs/PERFORMANCE.md).
            self.model.train()
        self._set_gradient_sync(self.is_last_micro_step)
        with self.autocast():
            loss = compute_loss_fn(self.model, batch)
        first = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
        if isinstance(first, torch.Tensor) and first.dim() > 0:  # a batch, or a tuple led by one
            self.samples_seen += int(first.shape[0])
        return loss

    def backward_and_step(self, loss: torch.Tensor) -> bool:
        """Backward pass, and on the last micro-step the optimizer step.

        Returns False when the step was skipped (non-finite loss, or gradient
        overflow detected by the scaler). A skipped step zeroes the gradients,
        is counted and does not advance the scheduler.
        """
        self.micro_steps += 1
        finite = (not self.config.check_finite_loss) or self._all_finite(loss)
        if not finite:
            return self._skip_nonfinite(loss)
        self.nonfinite_streak = 0
        accum = self.config.grad_accumulation_steps
        self.precision.backward(loss / accum if accum > 1 else loss)
        self._micro_in_window += 1
        if self._micro_in_window < self.config.grad_accumulation_steps:
            return True
        return self._optimizer_step()

    def _optimizer_step(self) -> bool:
        self._micro_in_window = 0
        self.training_steps += 1
        if self.config.max_grad_norm is not None:
            self.precision.unscale_(self.optimizer)  # clip the true gradients, not the scaled ones
            self._clip_gradients(self.config.max_grad_norm)
        stepped = self.precision.optimizer_step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        new_scale = self.precision.scale
        if new_scale != self._last_scale:
            self._emit(
                "trainer.scale_changed",
                "info" if stepped else "warning",
                old_scale=self._last_scale,
                new_scale=new_scale,
                step=self.training_steps,
            )
            self._last_scale = new_scale
        if not stepped:
            self.overflow_steps += 1
            self._emit(
                "trainer.step_skipped",
                "warning",
                reason="overflow",
                step=self.training_steps,
                overflow_steps=self.overflow_steps,
                overflow_rate=self.overflow_rate,
            )
            return False
        if self.scheduler is not None:
            self.scheduler.step()
        return True

    def _skip_nonfinite(self, loss: torch.Tensor) -> bool:
        # Drop the whole accumulation window: gradients of earlier micro-steps
        # would otherwise be stepped with a missing share of the batch.
        self.nonfinite_losses += 1
        self.nonfinite_streak += 1
        self.optimizer.zero_grad(set_to_none=True)
        self._micro_in_window = 0
        self.training_steps += 1
        value = float(loss.detach().float().reshape(-1)[0]) if loss.numel() else float("nan")
        self._emit(
            "trainer.step_skipped",
            "warning",
            reason="nonfinite_loss",
            step=self.training_steps,
            loss=value,
            nonfinite_losses=self.nonfinite_losses,
            streak=self.nonfinite_streak,
        )
        if self.nonfinite_streak == self.config.nonfinite_streak_threshold:
            self._emit("trainer.nonfinite_streak", "error", streak=self.nonfinite_streak, step=self.training_steps)
        return False

    def train_window(
        self, batches: Iterable[Any], compute_loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
        after_step: Optional[Callable[[torch.Tensor], None]] = None,
    ) -> WindowResult:
        """One micro-step and optimizer step per batch with nothing read back
        to the host until the window ends (`genesis_fp16.window`): a
        non-finite loss or an overflow skips its step on the device; then the
        counters and events of every step, as `backward_and_step` would have
        left them. ``after_step(taken)`` runs after each step with a device
        flag (1.0 taken, 0.0 skipped). Runs the per-step path, saying why
        once, where a window cannot run on the device (not a fused optimizer,
        a scheduler, accumulation). A seed-API ``auto`` decides on the first batch before the window starts."""
        if self._auto_at_first_batch is not None:
            batches = self._decide_at_first_of(batches, compute_loss_fn)
        return run_window(self, batches, compute_loss_fn, after_step)

    def train_batches(
        self, batches: Iterator[Any], compute_loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor]
    ) -> list[float]:
        """Convenience loop: one micro-step per batch; returns the losses."""
        losses = []
        for batch in batches:
            loss = self.training_step(batch, compute_loss_fn)
            self.backward_and_step(loss)
            losses.append(float(loss.detach()))
        return losses

    # -- stats -----------------------------------------------------------------
    @property
    def skipped_steps(self) -> int:
        return self.overflow_steps + self.nonfinite_losses

    @property
    def overflow_rate(self) -> float:
        return self.overflow_steps / self.training_steps if self.training_steps else 0.0

    @property
    def current_scale(self) -> float:
        return self.precision.scale

    def get_stats(self) -> dict[str, Any]:
        """Counters since construction (or the loaded checkpoint's): `precision`
        (what runs) and `requested_precision`, `device`, `training_steps`,
        `micro_steps`, `overflow_steps` and `overflow_rate`, `skipped_steps`
        and `failed_step_rate`, `current_scale` and `scaler_enabled`,
        `nonfinite_losses` and `nonfinite_streak`, `samples_seen`,
        `samples_per_s`, `grad_accumulation_steps`, `auto_reason` (why
        ``auto`` runs what it runs; None when a precision was asked for by name),
        `decision` (`PrecisionDecision.as_dict`: precision, source, reason) and
        `auto_pending` (True while a seed-API ``auto`` waits for its first batch:
        `precision` and `decision` are then the flag rule's provisional choice)."""
        elapsed = time.perf_counter() - self._started
        return {
            "precision": self.precision.name,
            "requested_precision": self.config.requested_precision.value,
            "device": str(self.device),
            "training_steps": self.training_steps,
            "micro_steps": self.micro_steps,
            "overflow_steps": self.overflow_steps,
            "overflow_rate": self.overflow_rate,
            "skipped_steps": self.skipped_steps,
            "failed_step_rate": self.skipped_steps / self.training_steps if self.training_steps else 0.0,
            "current_scale": self.current_scale,
            "scaler_enabled": self.scaler.is_enabled(),
            "nonfinite_losses": self.nonfinite_losses,
            "nonfinite_streak": self.nonfinite_streak,
            "samples_seen": self.samples_seen,
            "samples_per_s": self.samples_seen / elapsed if elapsed > 0 else 0.0,
            "grad_accumulation_steps": self.config.grad_accumulation_steps,
            "auto_reason": self.auto_reason,
            "decision": self.decision.as_dict(),
            "auto_pending": self.auto_pending,
        }

    # -- precision casts ---------------------------------------------------------
    def cast_model_to_fp16(self) -> torch.nn.Module:
        """Cast the weights themselves to FP16 (inference / deployment). Training
        afterwards runs without master weights and without a scaler."""
        self.precision = self.precision_plugins[PrecisionMode.FP16_TRUE](self.device, self.config.precision_config)
        self.model = self.precision.convert_module(self.model)
        self._last_scale = self.precision.scale
        self._emit("trainer.cast_to_fp16", "warning", reason="weights now FP16; no FP32 master copy, no scaler")
        return self.model

    # -- checkpoints (genesis_fp16.restore) -------------------------------------------
    def _counters(self) -> dict[str, int]:
        return {
            "training_steps": self.training_steps,
            "overflow_steps": self.overflow_steps,
            "nonfinite_losses": self.nonfinite_losses,
            "micro_steps": self.micro_steps,
            "samples_seen": self.samples_seen,
        }

    def _model_state(self) -> dict[str, Any]:
        return self.model.state_dict()

    def _load_model_state(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state)

    def _check_model_state(self, state: Any, source: str) -> None:
        ckpt.check_model_state(state, self._model_state(), source)

    def state_payload(self, extra: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        """Everything a checkpoint holds, as a payload (`restore.state_payload`)."""
        return restore.state_payload(self, extra)

    def save_checkpoint(self, path: Union[str, Path], extra: Optional[dict[str, Any]] = None) -> Path:
        """Write model, optimizer, scaler, scheduler, counters and precision atomically."""
        return restore.save_checkpoint(self, path, extra)

    def load_checkpoint(
        self, path: Union[str, Path], *, restore_rng: bool = True, check_extra: Optional[ExtraCheck] = None
    ) -> dict[str, Any]:
        """Restore from ``path``; returns the checkpoint's ``extra`` dict. All or
        nothing (`restore.apply_payload`): a checkpoint that fails raises one
        `CheckpointError` naming the file and the field, the trainer left as it was."""
        return restore.load_checkpoint(self, path, restore_rng=restore_rng, check_extra=check_extra)

    def check_payload(self, payload: dict[str, Any], *, source: str = "<memory>", check_extra: Optional[ExtraCheck] = None) -> None:
        """Raise `CheckpointError` unless all of ``payload`` fits this trainer; changes nothing."""
        restore.check_payload(self, payload, source=source, check_extra=check_extra)

    def apply_payload(
        self, payload: dict[str, Any], *, source: str = "<memory>", restore_rng: bool = True, check_extra: Optional[ExtraCheck] = None,
    ) -> None:
        """Check ``payload`` whole, then restore from it (`restore.apply_payload`)."""
        restore.apply_payload(self, payload, source=source, restore_rng=restore_rng, check_extra=check_extra)

"""The trainer: one loop path for every precision.

The loop calls the precision plugin's hooks and never branches on the mode
(Lightning Fabric's precision plugins; nanoGPT's one loop for every dtype).
The order of operations is PyTorch's AMP recipe ("Automatic Mixed Precision
examples", gradient clipping and accumulation sections): ``backward(loss/N)``
per micro-step (FP16: ``scaler.scale(loss/N).backward()``), then once per
optimizer step ``unscale_`` -> ``clip_grad_norm_`` -> ``optimizer_step``
(FP16: ``scaler.step`` -> ``scaler.update``).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, ClassVar, ContextManager, Iterator, Optional, Union

import torch

from . import calibration as cal
from . import checkpoint as ckpt
from .config import FP16TrainingConfig
from .precision import MODES, Precision, capability, resolve_precision
from .rollout import LedgerError, RolloutLedger
from .settings import AutoPrecision, PrecisionMode, Settings, load_settings
from .telemetry import EventListener, get_logger

CHECKPOINT_WARNING_EVENT = "checkpoint.fresh_scaler"


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
    measures_auto: ClassVar[bool] = True
    """Whether ``precision="auto"`` may be decided by measuring the first batch
    (`genesis_fp16.calibration`); the distributed trainers keep the flag rule,
    so that every rank decides alike without a collective."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        config: Optional[FP16TrainingConfig] = None,
        scheduler: Optional[Any] = None,
        *,
        name: str = "trainer",
        listeners: Optional[list[EventListener]] = None,
        settings: Optional[Settings] = None,
    ) -> None:
        # the caller's config is never mutated
        self.config = dataclasses.replace(config) if config is not None else FP16TrainingConfig()
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.name = name
        self.settings = settings
        """Where ``auto`` reads how to decide and keeps its calibrations (None: ``load_settings()`` when needed)."""
        self.device = torch.device(self.config.device) if self.config.device else _infer_device(model)
        self.listeners: list[EventListener] = list(listeners or [])
        self._log = get_logger("genesis_fp16.trainer", trainer=name)
        self.calibration: Optional[cal.Calibration] = None
        """The measurement ``auto`` decided by (measured now or cached); None before, or when the rule decided."""
        self.auto_reason: Optional[str] = None
        """Why ``auto`` runs what it runs, once decided; None when a precision was asked for by name."""
        self._pending_scaler: Optional[dict[str, Any]] = None
        self._auto_pending = self.config.requested_precision == PrecisionMode.AUTO and self._auto_measures()
        if self._auto_pending:
            # nothing runs in it: the first training_step measures and replaces it (`calibrate`)
            self.precision: Precision = self.precision_plugins[PrecisionMode.FP32](self.device, self.config.scaler_options())
        else:
            self.precision = resolve_precision(
                self.config.requested_precision,
                self.device,
                self.config.on_unsupported,
                self.config.scaler_options(),
                plugins=self.precision_plugins,
            )
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
        if self._auto_pending:
            self._decide_by_rule("autocast() was entered before any training_step, so there was no batch to measure on")
        return self.precision.forward_context()

    # -- precision=auto by measurement --------------------------------------------
    def _auto_measures(self) -> bool:
        if not self.measures_auto:
            return False
        settings = self.settings or load_settings(check_names=False)
        return settings.auto_precision == AutoPrecision.MEASURE

    @property
    def calibration_pending(self) -> bool:
        """Whether ``precision="auto"`` waits for the first batch to be measured on."""
        return self._auto_pending

    def calibrate(self, batch: Any, compute_loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor]) -> Optional[cal.Calibration]:
        """Decide ``precision="auto"`` on ``batch``, once (`training_step` calls it
        on its first batch): the ledger's decision for this workload if there is
        one, else a calibration on copies of the model and optimizer (this
        model, its optimizer and the RNGs are left as they were), recorded in
        the ledger. Returns the calibration used; None when the flag rule
        decided because the workload cannot be measured (logged with the reason)."""
        if not self._auto_pending:
            return self.calibration
        settings = self.settings or load_settings(check_names=False)
        key = cal.workload_key(cal.workload(self.model, self.optimizer, batch, self.device))
        ledger = RolloutLedger.from_settings(settings)
        result, source = self._cached(ledger, key), "cached"
        if result is None:
            try:
                result, source = self.measure_auto(batch, compute_loss_fn), "measured"
            except cal.CalibrationUnavailable as exc:
                self._decide_by_rule(str(exc))
                return None
            try:
                ledger.record_calibration(result.as_record())
            except LedgerError as exc:  # the decision stands for this trainer; the next one measures again
                self._emit("precision.calibration_not_saved", "warning", key=key, reason=str(exc))
        self.calibration = result
        self._adopt(PrecisionMode(result.precision), result.reason, source, key=key, speed=result.speed, cost_s=result.cost_s)
        return result

    def _cached(self, ledger: RolloutLedger, key: str) -> Optional[cal.Calibration]:
        try:
            record = ledger.calibration(key)
        except LedgerError as exc:
            self._emit("precision.calibration_unreadable", "warning", key=key, reason=str(exc))
            return None
        found = cal.Calibration.from_record(record) if record is not None else None
        if found is None or PrecisionMode(found.precision) not in cal.candidates(self.device):
            return None
        return found

    def _decide_by_rule(self, why: str) -> None:
        mode, reason = capability.auto_precision(self.device)
        self._adopt(mode, f"auto could not measure: {why}; {reason}", "rule", level="warning")

    def _adopt(self, mode: PrecisionMode, reason: str, source: str, *, level: str = "info", **figures: Any) -> None:
        self._auto_pending = False
        self.precision = self.precision_plugins[mode](self.device, self.config.scaler_options())
        if self._pending_scaler and self.precision.uses_scaler:
            self.precision.load_state_dict(self._pending_scaler)  # a checkpoint loaded before the decision
        self._pending_scaler = None
        self._last_scale = self.precision.scale
        self.auto_reason = reason
        self._emit("precision.auto_selected", level, device=str(self.device), precision=mode.value, source=source, reason=reason, **figures)

    def _calibration_copy(self, mode: PrecisionMode) -> "FP16Trainer":
        try:
            model, optimizer = copy.deepcopy((self.model, self.optimizer))  # one memo: the copy's optimizer holds the copy's parameters
        except Exception as exc:
            raise cal.CalibrationUnavailable(f"the model or its optimizer cannot be copied ({type(exc).__name__}: {exc})") from None
        optimizer.zero_grad(set_to_none=True)
        config = dataclasses.replace(self.config, precision=PrecisionMode.FP32.value, enabled=True, device=str(self.device))
        trainer = FP16Trainer(model, optimizer, config, name=f"{self.name}.calibration.{mode.value}")
        trainer.precision = self.precision_plugins[mode](self.device, self.config.scaler_options())
        trainer._last_scale = trainer.precision.scale
        return trainer

    def measure_auto(self, batch: Any, loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor]) -> cal.Calibration:
        """Measure now what ``auto`` picks for this workload (`genesis_fp16.calibration`),
        on copies: this trainer, its model, optimizer and the RNGs are left as
        they were, and the ledger is neither read nor written (`calibrate` is
        the cached path; `genesis-fp16 bench` compares this pick with its own
        timings). Raises `CalibrationUnavailable` where the workload cannot be measured."""
        described = cal.workload(self.model, self.optimizer, batch, self.device)
        key = cal.workload_key(described)
        real = list(self.model.parameters())
        grads = [None if p.grad is None else p.grad.detach().clone() for p in real]
        clock = cal.clock(self.device)
        started = clock()

        def runner(trainer: FP16Trainer) -> Callable[[int], None]:
            def run(n: int) -> None:
                for _ in range(n):
                    trainer.backward_and_step(trainer.training_step(batch, loss_fn))
            return run

        failure: Optional[BaseException] = None
        try:
            with cal.preserved_rng(self.device):
                copies = {mode: self._calibration_copy(mode) for mode in cal.candidates(self.device)}
                seconds, losses, failed = cal.measure(
                    {mode: runner(t) for mode, t in copies.items()},
                    {mode: (lambda t=t: cal.final_loss(t.model, batch, loss_fn)) for mode, t in copies.items()},
                    self.device,
                )
        except cal.CalibrationUnavailable:
            raise
        except Exception as exc:  # a real fault of the loss shows again in the real step that follows, unmeasured
            failure = exc
        finally:
            touched = any((p.grad is not None) != (g is not None) or (g is not None and not torch.equal(p.grad, g)) for p, g in zip(real, grads))
            for p, g in zip(real, grads):
                p.grad = g
        if touched:
            raise cal.CalibrationUnavailable("the loss function trains another model than the one it is given")
        if failure is not None:
            raise cal.CalibrationUnavailable(f"a calibration step failed ({type(failure).__name__}: {failure})")
        return cal.measured(key, described, seconds, losses, clock() - started, max(t.training_steps for t in copies.values()), failed)

    def training_step(self, batch: Any, compute_loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor]) -> torch.Tensor:
        """Run ``compute_loss_fn(model, batch)`` under autocast and return the
        loss. With ``precision="auto"`` measured, the first call decides the
        precision first (`calibrate`)."""
        if self._auto_pending:
            self.calibrate(batch, compute_loss_fn)
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
        if self._auto_pending:
            self._decide_by_rule("backward_and_step came before any training_step, so there was no batch to measure on")
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
        `samples_per_s`, `grad_accumulation_steps`, and `auto_reason` (why
        ``auto`` runs what it runs; None when a precision was asked for by name)."""
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
        }

    # -- precision casts ---------------------------------------------------------
    def cast_model_to_fp16(self) -> torch.nn.Module:
        """Cast the weights themselves to FP16 (inference / deployment). Training
        afterwards runs without master weights and without a scaler."""
        self._auto_pending = False
        self.precision = self.precision_plugins[PrecisionMode.FP16_TRUE](self.device, self.config.scaler_options())
        self.model = self.precision.convert_module(self.model)
        self._last_scale = self.precision.scale
        self._emit("trainer.cast_to_fp16", "warning", reason="weights now FP16; no FP32 master copy, no scaler")
        return self.model

    # -- checkpoints -------------------------------------------------------------
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

    def state_payload(self, extra: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        if self._micro_in_window:
            raise RuntimeError(
                f"cannot checkpoint in the middle of an accumulation window "
                f"({self._micro_in_window}/{self.config.grad_accumulation_steps} micro-steps); save after an optimizer step"
            )
        return ckpt.build_payload(
            model=self._model_state(),
            optimizer=self.optimizer.state_dict(),
            optimizer_type=ckpt.optimizer_type_name(self.optimizer),
            scaler=self.precision.state_dict(),
            scheduler=self.scheduler.state_dict() if self.scheduler is not None else None,
            counters=self._counters(),
            precision=self.precision.name,
            extra=extra,
            rng={"torch_cpu": torch.get_rng_state()},
        )

    def save_checkpoint(self, path: Union[str, Path], extra: Optional[dict[str, Any]] = None) -> Path:
        """Write model, optimizer, scaler, scheduler, counters and precision atomically."""
        written = ckpt.save_payload(path, self.state_payload(extra))
        self._emit("checkpoint.saved", path=str(written), step=self.training_steps)
        return written

    def load_checkpoint(
        self, path: Union[str, Path], *, restore_rng: bool = True, check_extra: Optional[ExtraCheck] = None
    ) -> dict[str, Any]:
        """Restore from ``path``; returns the checkpoint's ``extra`` dict.

        All or nothing: the whole checkpoint (digest, model shapes and dtypes,
        optimizer type and groups, scaler, scheduler, counters, RNG, and
        ``extra`` through ``check_extra``) is checked before anything changes;
        a checkpoint that fails raises one `CheckpointError` naming the file
        and the field, and the trainer is left as it was."""
        payload = ckpt.load_payload(path, map_location=self.device)
        self.apply_payload(payload, source=str(path), restore_rng=restore_rng, check_extra=check_extra)
        return payload.get("extra") or {}

    def _check_model_state(self, state: Any, source: str) -> None:
        ckpt.check_model_state(state, self._model_state(), source)

    def check_payload(self, payload: dict[str, Any], *, source: str = "<memory>", check_extra: Optional[ExtraCheck] = None) -> None:
        """Raise `CheckpointError` unless all of ``payload`` fits this trainer; changes nothing."""
        self._check_model_state(payload.get("model"), source)
        ckpt.check_optimizer_state(payload.get("optimizer"), self.optimizer, payload.get("optimizer_type"), source)
        ckpt.check_scaler_state(payload.get("scaler"), source)
        if self.scheduler is not None:
            ckpt.check_scheduler_state(payload.get("scheduler"), self.scheduler.state_dict(), source)
        ckpt.check_counters(payload.get("counters"), source)
        ckpt.check_rng_state(payload.get("rng"), source)
        extra = payload.get("extra")
        if extra is not None and not isinstance(extra, dict):
            raise ckpt.CheckpointError(f"{source}: field extra: a {type(extra).__name__}, expected a dict")
        if check_extra is not None:
            try:
                check_extra(extra or {})
            except (ValueError, TypeError, ckpt.CheckpointError) as exc:
                raise ckpt.CheckpointError(f"{source}: {exc}") from None

    def apply_payload(
        self,
        payload: dict[str, Any],
        *,
        source: str = "<memory>",
        restore_rng: bool = True,
        check_extra: Optional[ExtraCheck] = None,
    ) -> None:
        """Check ``payload`` whole (`check_payload`), then restore from it. Should
        restoring fail all the same, what was changed is put back before the
        `CheckpointError`."""
        self.check_payload(payload, source=source, check_extra=check_extra)
        counters = ckpt.check_counters(payload.get("counters"), source)
        snapshot = _Snapshot.take(self)
        scaler_state = payload.get("scaler") or {}
        try:
            # the model last: its weights are copied in place, the others' state objects swapped
            if payload.get("optimizer") is not None:
                self.optimizer.load_state_dict(payload["optimizer"])
            if self.scheduler is not None and payload.get("scheduler") is not None:
                self.scheduler.load_state_dict(payload["scheduler"])
            self.precision.load_state_dict(scaler_state)
            self._load_model_state(payload["model"])
        except Exception as exc:
            snapshot.restore(self)
            raise ckpt.CheckpointError(f"{source}: checkpoint does not fit this model/optimizer: {exc}") from None
        if self.precision.uses_scaler and not scaler_state:
            self._emit(
                CHECKPOINT_WARNING_EVENT,
                "warning",
                path=source,
                saved_precision=payload.get("precision"),
                reason="checkpoint has no scaler state (saved without a scaler); starting a fresh scaler",
            )
        if self._auto_pending and scaler_state:
            self._pending_scaler = dict(scaler_state)  # for the precision `calibrate` picks, if it has a scaler
        for name, value in counters.items():
            setattr(self, name, value)
        self.nonfinite_streak = 0
        self._micro_in_window = 0
        self._last_scale = self.precision.scale
        rng = payload.get("rng") or {}
        if restore_rng and isinstance(rng.get("torch_cpu"), torch.Tensor):
            torch.set_rng_state(rng["torch_cpu"].cpu())
        self._emit("checkpoint.loaded", path=source, step=self.training_steps, saved_precision=payload.get("precision"))


ExtraCheck = Callable[[dict[str, Any]], None]
"""Checks a checkpoint's ``extra`` dict before a load changes anything; raises
``ValueError`` or ``TypeError`` naming the field (the trainer adds the file)."""


@dataclasses.dataclass
class _Snapshot:
    """What a load changes before the model, to put back if a later part fails.
    Optimizer and scheduler ``load_state_dict`` replace their state objects
    rather than mutate them, so references are enough. The model comes last
    and is checked key by key and shape by shape beforehand (weights are
    copied in place, and a copy of them all would double the memory)."""

    optimizer: dict[str, Any]
    scaler: dict[str, Any]
    scheduler: Optional[dict[str, Any]]

    @classmethod
    def take(cls, trainer: FP16Trainer) -> _Snapshot:
        optimizer = {"state": trainer.optimizer.state, "param_groups": trainer.optimizer.param_groups}
        scheduler = dict(vars(trainer.scheduler)) if trainer.scheduler is not None else None
        return cls(optimizer, trainer.precision.state_dict(), scheduler)

    def restore(self, trainer: FP16Trainer) -> None:
        vars(trainer.optimizer).update(self.optimizer)
        trainer.precision.load_state_dict(self.scaler)
        if self.scheduler is not None:
            vars(trainer.scheduler).clear()
            vars(trainer.scheduler).update(self.scheduler)

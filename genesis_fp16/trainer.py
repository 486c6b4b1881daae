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

import dataclasses
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, ClassVar, ContextManager, Iterator, Optional, Union

import torch

from . import checkpoint as ckpt
from .config import FP16TrainingConfig
from .precision import MODES, Precision, resolve_precision
from .settings import PrecisionMode
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

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        config: Optional[FP16TrainingConfig] = None,
        scheduler: Optional[Any] = None,
        *,
        name: str = "trainer",
        listeners: Optional[list[EventListener]] = None,
    ) -> None:
        # the caller's config is never mutated
        self.config = dataclasses.replace(config) if config is not None else FP16TrainingConfig()
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.name = name
        self.device = torch.device(self.config.device) if self.config.device else _infer_device(model)
        self.precision: Precision = resolve_precision(
            self.config.requested_precision,
            self.device,
            self.config.on_unsupported,
            self.config.scaler_options(),
            plugins=self.precision_plugins,
        )
        self.model = self.precision.convert_module(model)  # fp16-true casts the weights; others return it as is
        self.listeners: list[EventListener] = list(listeners or [])
        self._log = get_logger("genesis_fp16.trainer", trainer=name)
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
        return self.precision.forward_context()

    def training_step(self, batch: Any, compute_loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor]) -> torch.Tensor:
        """Run ``compute_loss_fn(model, batch)`` under autocast and return the loss."""
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
        `samples_per_s`, `grad_accumulation_steps`."""
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
        }

    # -- precision casts ---------------------------------------------------------
    def cast_model_to_fp16(self) -> torch.nn.Module:
        """Cast the weights themselves to FP16 (inference / deployment). Training
        afterwards runs without master weights and without a scaler."""
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

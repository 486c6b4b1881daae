"""A trainer's checkpoints: the payload it saves, and the all-or-nothing restore.

The whole checkpoint (digest, model shapes and dtypes, optimizer type and
groups, scaler, scheduler, counters, RNG, and ``extra`` through
``check_extra``) is checked before anything changes (`check_payload`); should
applying it fail all the same, what was changed is put back (`_Snapshot`)
before one `CheckpointError` naming the file and the field. The trainer's
``save_checkpoint``, ``load_checkpoint``, ``check_payload`` and
``apply_payload`` call these.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Optional, Union

import torch

from . import checkpoint as ckpt

FP16Trainer = Any
"""A `genesis_fp16.trainer.FP16Trainer` (not imported: the trainer imports this module)."""

CHECKPOINT_WARNING_EVENT = "checkpoint.fresh_scaler"

ExtraCheck = Callable[[dict[str, Any]], None]
"""Checks a checkpoint's ``extra`` dict before a load changes anything; raises
``ValueError`` or ``TypeError`` naming the field (the trainer adds the file)."""


def state_payload(trainer: FP16Trainer, extra: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Model, optimizer, scaler, scheduler, counters, precision, RNG and ``extra``; refused mid accumulation window."""
    if trainer._micro_in_window:
        raise RuntimeError(
            f"cannot checkpoint in the middle of an accumulation window "
            f"({trainer._micro_in_window}/{trainer.config.grad_accumulation_steps} micro-steps); save after an optimizer step"
        )
    return ckpt.build_payload(
        model=trainer._model_state(),
        optimizer=trainer.optimizer.state_dict(),
        optimizer_type=ckpt.optimizer_type_name(trainer.optimizer),
        scaler=trainer.precision.state_dict(),
        scheduler=trainer.scheduler.state_dict() if trainer.scheduler is not None else None,
        counters=trainer._counters(),
        precision=trainer.precision.name,
        extra=extra,
        rng={"torch_cpu": torch.get_rng_state()},
    )


def save_checkpoint(trainer: FP16Trainer, path: Union[str, Path], extra: Optional[dict[str, Any]] = None) -> Path:
    """Write the trainer's payload atomically."""
    written = ckpt.save_payload(path, trainer.state_payload(extra))
    trainer._emit("checkpoint.saved", path=str(written), step=trainer.training_steps)
    return written


def load_checkpoint(
    trainer: FP16Trainer, path: Union[str, Path], *, restore_rng: bool = True, check_extra: Optional[ExtraCheck] = None
) -> dict[str, Any]:
    """Restore ``trainer`` from ``path`` (`apply_payload`); returns the checkpoint's ``extra`` dict."""
    payload = ckpt.load_payload(path, map_location=trainer.device)
    trainer.apply_payload(payload, source=str(path), restore_rng=restore_rng, check_extra=check_extra)
    return payload.get("extra") or {}


def check_payload(
    trainer: FP16Trainer, payload: dict[str, Any], *, source: str = "<memory>", check_extra: Optional[ExtraCheck] = None
) -> None:
    """Raise `CheckpointError` unless all of ``payload`` fits ``trainer``; changes nothing."""
    trainer._check_model_state(payload.get("model"), source)
    ckpt.check_optimizer_state(payload.get("optimizer"), trainer.optimizer, payload.get("optimizer_type"), source)
    ckpt.check_scaler_state(payload.get("scaler"), source)
    if trainer.scheduler is not None:
        ckpt.check_scheduler_state(payload.get("scheduler"), trainer.scheduler.state_dict(), source)
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
    trainer: FP16Trainer,
    payload: dict[str, Any],
    *,
    source: str = "<memory>",
    restore_rng: bool = True,
    check_extra: Optional[ExtraCheck] = None,
) -> None:
    """Check ``payload`` whole (`check_payload`), then restore ``trainer`` from
    it. Should restoring fail all the same, what was changed is put back
    before the `CheckpointError`."""
    trainer.check_payload(payload, source=source, check_extra=check_extra)
    counters = ckpt.check_counters(payload.get("counters"), source)
    snapshot = _Snapshot.take(trainer)
    scaler_state = payload.get("scaler") or {}
    try:
        # the model last: its weights are copied in place, the others' state objects swapped
        if payload.get("optimizer") is not None:
            # how the optimizer computes (fused, foreach, capturable) is this trainer's, not the checkpoint's: a
            # checkpoint of a plain Adam loads into a fused one (a training window needs it) and stays fused
            kernels = [{k: g[k] for k in ckpt.KERNEL_OPTIONS if k in g} for g in trainer.optimizer.param_groups]
            trainer.optimizer.load_state_dict(payload["optimizer"])
            for group, kept in zip(trainer.optimizer.param_groups, kernels):
                group.update(kept)
        if trainer.scheduler is not None and payload.get("scheduler") is not None:
            trainer.scheduler.load_state_dict(payload["scheduler"])
        trainer.precision.load_state_dict(scaler_state)
        trainer._load_model_state(payload["model"])
    except Exception as exc:
        snapshot.restore(trainer)
        raise ckpt.CheckpointError(f"{source}: checkpoint does not fit this model/optimizer: {exc}") from None
    if trainer.precision.uses_scaler and not scaler_state:
        trainer._emit(
            CHECKPOINT_WARNING_EVENT,
            "warning",
            path=source,
            saved_precision=payload.get("precision"),
            reason="checkpoint has no scaler state (saved without a scaler); starting a fresh scaler",
        )
    for name, value in counters.items():
        setattr(trainer, name, value)
    trainer.nonfinite_streak = 0
    trainer._micro_in_window = 0
    trainer._last_scale = trainer.precision.scale
    rng = payload.get("rng") or {}
    if restore_rng and isinstance(rng.get("torch_cpu"), torch.Tensor):
        torch.set_rng_state(rng["torch_cpu"].cpu())
    trainer._emit("checkpoint.loaded", path=source, step=trainer.training_steps, saved_precision=payload.get("precision"))


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
    def take(cls, trainer: FP16Trainer) -> "_Snapshot":
        optimizer = {"state": trainer.optimizer.state, "param_groups": trainer.optimizer.param_groups}
        scheduler = dict(vars(trainer.scheduler)) if trainer.scheduler is not None else None
        return cls(optimizer, trainer.precision.state_dict(), scheduler)

    def restore(self, trainer: FP16Trainer) -> None:
        vars(trainer.optimizer).update(self.optimizer)
        trainer.precision.load_state_dict(self.scaler)
        if self.scheduler is not None:
            vars(trainer.scheduler).clear()
            vars(trainer.scheduler).update(self.scheduler)

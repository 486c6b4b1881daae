"""The two loops the benchmark times side by side: our trainer, configured
here, and `RawLoop`, a hand-written torch loop doing the same work."""

from __future__ import annotations

from typing import Any, Callable

import torch

from genesis_fp16.precision.plugins import Precision
from genesis_fp16.training.trainer import FP16TrainingConfig

RAW_LOOP_WORK = (
    "the precision's forward context (autocast for bf16/fp16, TF32 switches for tf32, none for fp32) -> loss.float() "
    "-> "
    "finite-loss check (bool(isfinite(loss).all()), skip if not) -> GradScaler(enabled=fp16).scale(loss).backward() "
    "(under TF32 switches for tf32) -> unscale_ -> clip_grad_norm_(max_grad_norm) -> scaler.step -> scaler.update -> "
    "zero_grad(set_to_none=True)"
)


def trainer_config(precision: str, device: torch.device) -> FP16TrainingConfig:
    return FP16TrainingConfig(
        enabled=True,
        precision=precision,
        on_unsupported="error",  # the bench measures what was asked or says why not
        device=str(device),
    )


class RawLoop:
    """What a careful hand-written mixed-precision loop does per step: PyTorch's
    AMP recipe (autocast, GradScaler, unscale before clipping) plus the
    finite-loss guard any serious training script has. This is "the same work"
    our trainer does; what ours adds on top (counters, events, ``model.train()``
    per step, scale bookkeeping, the plugin calls) is the overhead measured.
    The contexts and a fresh scaler come from the precision plugin, so both
    loops run the same numerics."""

    def __init__(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, config: FP16TrainingConfig, precision: Precision
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.max_grad_norm = config.max_grad_norm
        self.precision = precision
        self.scaler = precision.make_scaler()
        model.train()

    def step(self, batch: Any, loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor]) -> bool:
        with self.precision.forward_context():
            loss = loss_fn(self.model, batch)
        if not bool(torch.isfinite(loss.detach()).all()):
            self.optimizer.zero_grad(set_to_none=True)
            return False
        with self.precision.math_context():
            self.scaler.scale(loss).backward()
        if self.max_grad_norm is not None:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return True

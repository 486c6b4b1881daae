"""Train one agent's bare trainer under a `RollbackGuard`,
with the rollback done for you.

`GuardedTraining` builds the trainer through ``registry.trainer_for``,
attaches a guard and records good checkpoints (one before the first step, then
every ``checkpoint_every`` healthy optimizer steps). When the guard rolls the
agent back (a P0 trip during `GuardedTraining.step`, or a P1 from
`GuardedTraining.check`) it rebuilds the trainer through the registry
(FP32 now: the ledger says ``rolled_back``), restores the last good checkpoint
once, clears the trip (``guard.reset()``) and goes on: every later step
trains and counts. ``infrastructure.WorldModel`` does the same for its own
trainer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Union

import torch

from .guard import GuardDecision, RollbackGuard
from .registry import trainer_for
from .settings import Settings, load_settings
from .telemetry import get_logger
from .trainer import FP16Trainer


class GuardedTraining:
    """One agent's trainer, its guard and its good checkpoints.

    Args:
        agent: the agent's name (its profile, its stage in the rollout ledger).
        model: the model the trainer trains.
        optimizer: its optimizer.
        scheduler: an optional LR scheduler.
        checkpoint_dir: where good checkpoints go (default
            ``<state_dir>/checkpoints/<agent>``); the newest one is
            ``<checkpoint_dir>/good.pt``, overwritten atomically.
        checkpoint_every: record a good checkpoint after every Nth healthy
            optimizer step (0: only the one before the first step and those
            from `save_good_checkpoint`).
        settings: the settings (default: ``load_settings()``).
        precision: an explicit precision for ``registry.trainer_for`` (the
            ledger and the kill switch still win; a rebuild after a rollback is FP32).
        overrides: explicit trainer options for ``registry.trainer_for``.
        guard: a guard to use (default: ``RollbackGuard(agent)`` with the
            profile's thresholds).

    Attributes:
        trainer: the trainer in use now (a new one after a rollback).
        rollbacks: the `GuardDecision` of each
            rollback handled, oldest first.
    """

    def __init__(
        self,
        agent: str,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        scheduler: Any = None,
        checkpoint_dir: Optional[Union[str, Path]] = None,
        checkpoint_every: int = 100,
        settings: Optional[Settings] = None,
        precision: Optional[str] = None,
        overrides: Optional[dict[str, Any]] = None,
        guard: Optional[RollbackGuard] = None,
    ) -> None:
        if checkpoint_every < 0:
            raise ValueError(f"GuardedTraining({agent!r}): checkpoint_every={checkpoint_every}; expected 0 (off) or a positive step count")
        self.agent = agent
        self.settings = settings or load_settings()
        self.checkpoint_every = int(checkpoint_every)
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else self.settings.state_dir / "checkpoints" / agent
        self.guard = guard or RollbackGuard(agent, settings=self.settings)
        self.rollbacks: list[GuardDecision] = []
        """Every rollback decision this helper handled, oldest first."""
        self._build = dict(model=model, optimizer=optimizer, scheduler=scheduler, precision=precision, overrides=overrides)
        self._log = get_logger("genesis_fp16.guarded", agent=agent)
        self.trainer = self._new_trainer()
        """The trainer in use; replaced by an FP32 one on a rollback."""
        self.save_good_checkpoint()

    def _new_trainer(self) -> FP16Trainer:
        b = self._build
        trainer = trainer_for(
            self.agent, b["model"], b["optimizer"], scheduler=b["scheduler"], settings=self.settings,
            precision=b["precision"], overrides=b["overrides"],
        )
        self.guard.attach(trainer)
        return trainer

    def save_good_checkpoint(self) -> Path:
        """Checkpoint the trainer now and record it as the last good one.
        Refused while the guard is tripped (that state is not good)."""
        if self.guard.tripped is not None:
            raise RuntimeError(
                f"GuardedTraining({self.agent!r}): the guard is tripped ({self.guard.tripped.reason}); "
                "a good checkpoint cannot be recorded until the rollback is handled (step() or check() do it)"
            )
        path = self.trainer.save_checkpoint(self.checkpoint_dir / "good.pt")
        self.guard.record_good_checkpoint(path)
        return path

    def step(self, batch: Any, loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor]) -> bool:
        """One micro-step: ``loss_fn(model, batch)`` under autocast, backward,
        and the optimizer step on the last micro-step. Returns False when the
        step was skipped. A P0 trip is handled before this returns."""
        before = self.trainer.training_steps
        stepped = self.trainer.backward_and_step(self.trainer.training_step(batch, loss_fn))
        optimizer_stepped = stepped and self.trainer.training_steps > before
        if self.guard.tripped is not None:
            self._roll_back(self.guard.tripped)
        elif optimizer_stepped and self.checkpoint_every and self.trainer.training_steps % self.checkpoint_every == 0:
            self.save_good_checkpoint()
        return stepped

    def train(self, batches: Iterable[Any], loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor]) -> int:
        """`step` over ``batches``; returns how many steps were not skipped."""
        return sum(bool(self.step(batch, loss_fn)) for batch in batches)

    def check(self, **kwargs: Any) -> GuardDecision:
        """``guard.check(trainer, **kwargs)`` (P1/P2: ``val_loss``,
        ``fp32_val_loss``, ``throughput_ratio``, ``reference``); a rollback is
        handled as in `step` before this returns."""
        decision = self.guard.check(self.trainer, **kwargs)
        if decision.action == "rollback":
            self._roll_back(decision)
        return decision

    def _roll_back(self, decision: GuardDecision) -> None:
        checkpoint = self.guard.last_good_checkpoint
        if checkpoint is None:
            raise RuntimeError(
                f"GuardedTraining({self.agent!r}): rolled back ({decision.reason}) but no good checkpoint is recorded; "
                "call save_good_checkpoint() after a healthy run"
            )
        self.trainer, _ = self.guard.recover(self._new_trainer)  # the ledger says rolled_back: FP32
        self.rollbacks.append(decision)
        self._log.warning(
            "guarded.restored", severity=decision.severity, reason=decision.reason, checkpoint=str(checkpoint),
            precision=self.trainer.precision.name, step=self.trainer.training_steps,
        )

"""A training window: K optimizer steps with no value read back to the host.

On a GPU every read of a device value (``.item()``, ``float(t)``, ``bool(t)``)
is a synchronisation: the host waits for the device instead of queueing the
next step, and nothing with a synchronisation in it can be captured as a CUDA
graph. The per-step path (`FP16Trainer.backward_and_step`) reads the loss's
finiteness every step, and with FP16 the scale after it. Inside a window:

* a non-finite loss, or with FP16's scaler a gradient overflow, skips its
  step on the device: the gradients are unscaled and checked by the op
  ``GradScaler.unscale_`` uses, and the optimizer gets the result as
  ``found_inf``, which a fused optimizer (``Adam(fused=True)``, ``AdamW``,
  ``SGD``) honours without reading it (PyTorch's ``torch/amp/grad_scaler.py``
  hands it ``grad_scale`` and ``found_inf`` the same way);
* the FP16 scale updates on the device (`FP16Mixed.window_update`), left as
  it was after a non-finite loss, as the per-step path leaves it;
* each step's loss and overflow flag go into two device buffers, read once
  at the window's end. The trainer's counters and events are then replayed
  step by step from them, so the guard sees what the per-step path would
  have shown it (the same skipped steps, the same streak at the same step).

A window needs a fused optimizer, no LR scheduler (it steps per step on the
host), one micro-step per optimizer step and the finite-loss check on; where
one of these is missing the trainer runs its per-step path for the window's
batches and says why once (``trainer.window_eager``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional

import torch

LossFn = Callable[[torch.nn.Module, Any], torch.Tensor]
WINDOW_STEPS = 16
"""Steps per training window (`GuardedTraining.train_windows`): one read back to the host per 16 steps, and a storm
judged (and rolled back) at most 15 steps after the per-step path would have."""
StepHook = Callable[[torch.Tensor], None]
"""Called after each step with a device flag, 1.0 when the step was taken and 0.0 when skipped (e.g. a target network's
Polyak update, masked by it)."""


@dataclass
class WindowResult:
    """What a window did, read once at its end."""

    steps: int = 0
    """Optimizer steps attempted (skipped ones included)."""
    skipped: int = 0
    losses: list[float] = field(default_factory=list)
    """Each step's loss (NaN or inf where it was not finite)."""
    stepped: list[bool] = field(default_factory=list)
    eager: Optional[str] = None
    """Why the window ran the per-step path (None: it ran on the device, read back once)."""


def window_blocker(trainer: Any) -> Optional[str]:
    """Why ``trainer`` (an `FP16Trainer`: not imported here, it imports this module) cannot run a window on the
    device (None: it can)."""
    opt = trainer.optimizer
    if not getattr(opt, "_step_supports_amp_scaling", False) or not all(g.get("fused") for g in opt.param_groups):
        return (f"{type(opt).__name__} is not a fused optimizer: a skipped step would need its found_inf read on the host "
                "(use e.g. torch.optim.Adam(params, fused=True))")
    if trainer.scheduler is not None:
        return "an LR scheduler steps per optimizer step on the host"
    if trainer.config.grad_accumulation_steps != 1:
        return "gradient accumulation (grad_accumulation_steps > 1)"
    if not trainer.config.check_finite_loss:
        return "check_finite_loss=False (the per-step path steps on a non-finite loss)"
    if not type(trainer).supports_window:
        return f"{type(trainer).__name__} keeps the per-step path (ranks agree on finiteness there)"
    return None


def run_window(trainer: Any, batches: Iterable[Any], loss_fn: LossFn, after_step: Optional[StepHook] = None) -> WindowResult:
    """The steps of ``batches`` on ``trainer`` with no host read; see the module docstring. Whatever raises inside
    the window (the loss, the data, a ``KeyboardInterrupt``), the steps already taken are read back and replayed
    into the trainer's counters, events and scale before the exception goes on: the counters always equal what
    the optimizer did."""
    blocker = window_blocker(trainer)
    if blocker is not None:
        return _eager(trainer, batches, loss_fn, after_step, blocker)
    device, opt, precision = trainer.device, trainer.optimizer, trainer.precision
    losses: list[torch.Tensor] = []
    flags: list[torch.Tensor] = []
    scales: Optional[list[torch.Tensor]] = [] if precision.uses_scaler else None
    found = torch.zeros((), device=device)
    params = [p for group in opt.param_groups for p in group["params"]]
    try:
        for batch in batches:  # lazily: a batch may depend on the step before (a critic's targets on its target network)
            loss = trainer.training_step(batch, loss_fn)
            finite = torch.isfinite(loss.detach()).all()
            precision.backward(loss)
            found.copy_(~finite)  # a non-finite loss skips its step even where its gradients came out finite
            if precision.uses_scaler:  # gradients unscaled in place, found = 1 where one is not finite
                precision.window_unscale_([p.grad for p in params if p.grad is not None], found)
            if trainer.config.max_grad_norm is not None:
                trainer._clip_gradients(trainer.config.max_grad_norm)
            opt.grad_scale, opt.found_inf = None, found  # the fused kernel skips the whole step when found_inf is 1
            try:
                opt.step()
            finally:
                del opt.grad_scale, opt.found_inf
            # from here the step happened: its record goes in before anything else can raise
            value = loss.detach().float().reshape(-1)[0] if loss.numel() else torch.full((), math.nan, device=device)
            losses.append(value)
            flags.append(found.clone())
            opt.zero_grad(set_to_none=True)
            precision.window_update(found, finite)
            if scales is not None:
                scales.append(precision.scale_tensor().clone())
            if after_step is not None:
                after_step(1.0 - flags[-1])
    except BaseException:
        _settle(trainer, losses, flags, scales)  # the steps that ran are accounted for before the error goes on
        raise
    return _settle(trainer, losses, flags, scales)


def _settle(trainer: Any, losses: list[torch.Tensor], flags: list[torch.Tensor],
            scales: Optional[list[torch.Tensor]]) -> WindowResult:
    """Read the window's records back once and replay them into ``trainer``. A step interrupted between its
    optimizer step and its scale update has no scale recorded: the scale read back is then the one on the
    device now, which is what the scaler holds."""
    k = len(losses)
    if k == 0:
        return WindowResult()
    if scales is not None and len(scales) < k:
        scales = scales + [trainer.precision.scale_tensor().clone()]
    read = torch.stack(losses + flags[:k] + (scales or [])).tolist()  # the window's one read
    result = WindowResult(steps=k, losses=read[:k])
    result.stepped = [f == 0.0 for f in read[k:2 * k]]
    replay(trainer, result, read[2 * k:] if scales is not None else None)
    result.skipped = result.stepped.count(False)
    return result


def replay(trainer: Any, result: WindowResult, scales: Optional[list[float]]) -> None:
    """The counters and events of a window's steps, in order, from what it read back once."""
    threshold = trainer.config.nonfinite_streak_threshold
    for i, (loss, stepped) in enumerate(zip(result.losses, result.stepped)):
        trainer.micro_steps += 1
        trainer.training_steps += 1
        if not math.isfinite(loss):
            trainer.nonfinite_losses += 1
            trainer.nonfinite_streak += 1
            trainer._emit("trainer.step_skipped", "warning", reason="nonfinite_loss", step=trainer.training_steps, loss=loss,
                       nonfinite_losses=trainer.nonfinite_losses, streak=trainer.nonfinite_streak)
            if trainer.nonfinite_streak == threshold:
                trainer._emit("trainer.nonfinite_streak", "error", streak=trainer.nonfinite_streak, step=trainer.training_steps)
            continue
        trainer.nonfinite_streak = 0
        if scales is not None and scales[i] != trainer._last_scale:
            trainer._emit("trainer.scale_changed", "info" if stepped else "warning", old_scale=trainer._last_scale, new_scale=scales[i],
                       step=trainer.training_steps)
            trainer._last_scale = scales[i]
        if not stepped:
            trainer.overflow_steps += 1
            trainer._emit("trainer.step_skipped", "warning", reason="overflow", step=trainer.training_steps,
                       overflow_steps=trainer.overflow_steps, overflow_rate=trainer.overflow_rate)
    trainer.precision.window_done(scales[-1] if scales else None)


def _eager(trainer: Any, batches: Iterable[Any], loss_fn: LossFn, after_step: Optional[StepHook], why: str) -> WindowResult:
    from .telemetry import log_once

    log_once(trainer._log, f"window_eager:{trainer.name}:{why}", "info", "trainer.window_eager", reason=why)
    result = WindowResult(eager=why)
    for batch in batches:
        before = trainer.training_steps
        loss = trainer.training_step(batch, loss_fn)
        stepped = trainer.backward_and_step(loss)
        if trainer.training_steps == before:  # a micro-step of an accumulation window: no optimizer step yet
            continue
        result.steps += 1  # optimizer steps, as the device window counts them
        result.losses.append(float(loss.detach().float().reshape(-1)[0]) if loss.numel() else math.nan)
        result.stepped.append(stepped)
        if after_step is not None:
            after_step(torch.ones((), device=trainer.device) if stepped else torch.zeros((), device=trainer.device))
    result.skipped = result.stepped.count(False)
    return result


def fused_adam(params: Iterable[torch.nn.Parameter], lr: float, device: torch.device) -> torch.optim.Adam:
    """``Adam(fused=True)`` where ``device`` has the fused kernel (CPU and CUDA in the torch versions this project
    supports): it skips a step on the device's ``found_inf``, so a window needs it; elsewhere the plain Adam, and a
    window there runs the per-step path (`window_blocker` says why)."""
    from torch.optim.optimizer import _get_fused_kernels_supported_devices

    fused = torch.device(device).type in _get_fused_kernels_supported_devices()
    return torch.optim.Adam(params, lr=lr, fused=fused or None)


def guarded_windows(training: Any, batches: Iterable[Any], loss_fn: LossFn, window: int, after_step: Optional[StepHook],
                    after_rollback: Optional[Callable[[], None]]) -> WindowResult:
    """`GuardedTraining.train_windows` (``training``: not imported here, it imports this module): the batches in
    windows on its trainer, its FP32 reference on each window's batches, a trip rolled back at the window's end."""
    if window < 1:
        raise ValueError(f"GuardedTraining.train_windows: window={window}; expected a positive number of steps")
    it, out = iter(batches), WindowResult()
    while True:
        training._ensure_good_checkpoint()
        taken: list[Any] = []

        def feed() -> Iterator[Any]:
            for batch in itertools.islice(it, window):
                taken.append(batch)
                yield batch

        trainer = training.trainer
        before = trainer.training_steps
        result = trainer.train_window(feed(), loss_fn, after_step)
        if not taken:
            return out
        out.steps, out.skipped, out.eager = out.steps + result.steps, out.skipped + result.skipped, out.eager or result.eager
        out.losses += result.losses
        out.stepped += result.stepped
        if result.losses:
            training.last_loss = torch.tensor(result.losses[-1])
        reference = training._call.reference if training._call is not None else None
        if reference is not None:
            reference.trainer.train_window(taken, loss_fn)
        if training._handle_trip():
            if after_rollback is not None:
                after_rollback()
        elif training.checkpoint_every and training.guard is not None \
                and trainer.training_steps // training.checkpoint_every > before // training.checkpoint_every:
            training.save_good_checkpoint()

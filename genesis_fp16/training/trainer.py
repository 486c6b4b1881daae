"""The trainer: one loop for every precision, two ways to step it, one account of what a step did.

The loop calls the precision plugin's hooks and never branches on the mode
(Lightning Fabric's precision plugins; nanoGPT's one loop for every dtype).
The order of operations is PyTorch's AMP recipe ("Automatic Mixed Precision
examples", gradient clipping and accumulation sections): ``backward(loss/N)``
per micro-step (FP16: ``scaler.scale(loss/N).backward()``), then once per
optimizer step ``unscale_`` -> ``clip_grad_norm_`` -> ``optimizer_step``
(FP16: ``scaler.step`` -> ``scaler.update``).

**The precision** is decided before the trainer steps
(`genesis_fp16.precision.decision`): the trainer takes a `PrecisionDecision`
and runs its mode's plugin; it reads no settings, no ledger and no
measurement, and never swaps its plugin (except `cast_model_to_fp16`, asked
for by name). Built without a decision (the seed API), it asks the decision
part for one (`genesis_fp16.precision.bare`: the config's request under the
kill switch); an ``auto`` that waits for its first batch is decided there, on
that batch, by the decision part's `FirstBatch`, which the trainer holds.

**Two ways to step.** The per-step path (`training_step`, then
`backward_and_step` -> bool) reads the loss's finiteness every step, and with
FP16 the scale after it. On a GPU every such read (``.item()``, ``float(t)``,
``bool(t)``) is a synchronisation: the host waits for the device instead of
queueing the next step, and nothing with a synchronisation in it can be
captured as a CUDA graph. A training window (`train_window`) runs K steps
with no value read back until its end:

* a non-finite loss, or with FP16's scaler a gradient overflow, skips its step
  on the device: the gradients are unscaled and checked by the op
  ``GradScaler.unscale_`` uses, and the optimizer gets the result as
  ``found_inf``, which a fused optimizer (``Adam(fused=True)``, ``AdamW``,
  ``SGD``) honours without reading it (PyTorch's ``torch/amp/grad_scaler.py``
  hands it ``grad_scale`` and ``found_inf`` the same way);
* the FP16 scale updates on the device (`FP16Mixed.window_update`), left as it
  was after a non-finite loss, as the per-step path leaves it;
* each step's loss and overflow flag go into device buffers, read once at the
  window's end (or when something raises inside it), and each step is then
  accounted for as the per-step path accounts for it.

A window needs a fused optimizer, no LR scheduler (it steps per step on the
host), one micro-step per optimizer step and the finite-loss check on
(`window_blocker`); where one is missing the window's batches take the
per-step path and the trainer says why once (``trainer.window_eager``).

**One account.** Both paths record a step through `_account`: the counters,
the scale, and the events the rollback guard listens to (``step_skipped``,
``scale_changed``, ``nonfinite_streak``), so the guard sees the same steps
whichever path ran them.

**Checkpoints** hold model, optimizer, scaler, scheduler, counters, precision,
RNG and the caller's ``extra`` (`genesis_fp16.training.checkpoint`: the file,
its format and checks); a load checks the whole payload before anything
changes, and puts back what it changed should applying it fail all the same.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, ContextManager, Iterable, Iterator, Optional, Union

import torch

from genesis_fp16.base.telemetry import EventListener, get_logger, log_once
from genesis_fp16.base.vocabulary import PrecisionMode
from genesis_fp16.precision.bare import FirstBatch, bare_decision
from genesis_fp16.precision.decision import PrecisionDecision
from genesis_fp16.precision.modes import MODES
from genesis_fp16.precision.plugins import Precision
from genesis_fp16.precision.request import Source
from genesis_fp16.training import checkpoint as ckpt
from genesis_fp16.training.capture import WARMUP as CAPTURE_WARMUP
from genesis_fp16.training.capture import StepGraphs, capture_blocker
from genesis_fp16.training.config import FP16TrainingConfig

__all__ = [
    "CHECKPOINT_WARNING_EVENT",
    "ExtraCheck",
    "FP16Trainer",
    "FP16TrainingConfig",
    "WINDOW_STEPS",
    "WindowResult",
    "calibration_copies",
    "fused_adam",
]

LossFn = Callable[[torch.nn.Module, Any], torch.Tensor]
StepHook = Callable[[torch.Tensor], None]
"""Called after each step of a window with a device flag, 1.0 when the step was taken and 0.0 when skipped (e.g. a
target network's Polyak update, masked by it)."""
WINDOW_STEPS = 16
"""Steps per training window (`GuardedTraining.train_windows`): one read back to the host per 16 steps, and a storm
judged (and rolled back) at most 15 steps after the per-step path would have."""
CHECKPOINT_WARNING_EVENT = "checkpoint.fresh_scaler"
ExtraCheck = Callable[[dict[str, Any]], None]
"""Checks a checkpoint's ``extra`` dict before a load changes anything; raises ``ValueError`` or ``TypeError``
naming the field (the trainer adds the file)."""


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


def _infer_device(model: torch.nn.Module) -> torch.device:
    for tensor in list(model.parameters()) + list(model.buffers()):
        return tensor.device
    return torch.device("cpu")


def _first_value(loss: torch.Tensor) -> float:
    return float(loss.detach().float().reshape(-1)[0]) if loss.numel() else math.nan


class FP16Trainer:
    """Mixed-precision trainer around a model, an optimizer and an optional
    LR scheduler. See `FP16TrainingConfig` for the options.

    ``precision_plugins`` maps each mode to its plugin class; a subclass
    swaps variants there (the FSDP trainer's FP16 uses a sharded scaler)."""

    precision_plugins: ClassVar[Mapping[PrecisionMode, type[Precision]]] = MODES
    supports_window: ClassVar[bool] = True
    """Whether `train_window` may run its steps on the device; the distributed trainers keep the per-step path,
    where the ranks agree on a loss's finiteness."""
    measures_auto: ClassVar[bool] = True
    """Whether ``precision="auto"`` built without a decision may be measured at the first batch: the DDP trainer
    measures on rank 0 and sends every rank its decision; False for FSDP2, whose sharded model cannot be copied and
    stepped on one rank alone: it keeps the flag rule."""

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
        self._log = get_logger("genesis_fp16.training.trainer", trainer=name)
        self.first_batch: Optional[FirstBatch] = None
        """The decision part's `FirstBatch` while a seed-API ``auto`` waits for its first batch; None once decided."""
        if decision is None:
            decision, self.first_batch = bare_decision(
                self.config.request, self.device, may_measure=type(self).measures_auto
            )
        self.decision: PrecisionDecision = decision
        """What this trainer trains in, where that came from and why (`genesis_fp16.precision.decision`); before a
        seed-API ``auto``'s first batch, the flag rule's provisional choice (`auto_pending`)."""
        self.precision: Precision = self.precision_plugins[self.decision.mode](
            self.device, self.config.precision_config
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
        self._graphs: Optional[StepGraphs] = None
        """The window's captured steps (CUDA; `genesis_fp16.training.capture`), made at the first window."""
        self.host_is_device = self.device.type == "cpu"
        """Whether reading a device value back waits on nothing (a CPU): a window's step then reads its flag and
        the host skips the step. False runs a CPU window as a GPU's, with nothing read back inside it (what
        ``scripts/count_host_reads.py`` counts)."""
        self._host_flags = (torch.zeros(()), torch.ones(()))
        """A CPU window's step flags (taken, skipped): constants, never written (a scaler's flag is made per step)."""

    # -- a seed-API auto, decided at the first batch by the decision part ---------------
    @property
    def auto_pending(self) -> bool:
        """True while a seed-API ``auto`` waits for its first batch (it runs the rule's choice until then)."""
        return self.first_batch is not None

    def _first_batch_decision(self, first: FirstBatch, batch: Any, loss_fn: LossFn) -> PrecisionDecision:
        """The decision part's decision on ``batch`` (the distributed trainer takes rank 0's on every rank)."""
        return first.decide(
            self.model,
            self.optimizer,
            batch,
            loss_fn,
            device=self.device,
            copy_trainer=calibration_copies(self.config, self.device, self.name),
        )

    def _decide_at_first_batch(self, batch: Any, loss_fn: LossFn) -> None:
        """Take the waiting decision on ``batch`` and run its precision's plugin (kept when the provisional one is
        the same mode: a scaler state loaded from a checkpoint stays)."""
        first = self.first_batch
        assert first is not None
        decision = self._first_batch_decision(first, batch, loss_fn)
        if decision.mode != self.decision.mode:
            self.precision = self.precision_plugins[decision.mode](self.device, self.config.precision_config)
            self.model = self.precision.convert_module(self.model)
            self._last_scale = self.precision.scale
        self.decision = decision
        self.first_batch = None

    def _decide_at_first_of(self, batches: Iterable[Any], loss_fn: LossFn) -> Iterable[Any]:
        """`_decide_at_first_batch` on the first of ``batches``; returns them all, that one included."""
        rest = iter(batches)
        for first in rest:
            self._decide_at_first_batch(first, loss_fn)
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

    # -- one step's account, both paths ------------------------------------------------
    def _account(self, *, nonfinite_loss: Optional[float], stepped: bool, scale: Optional[float]) -> None:
        """One optimizer step as both paths record it: counted; a non-finite loss (``nonfinite_loss``, its value)
        skipped before its step, counted and its streak followed; otherwise the scale after it (``scale``; None
        without a scaler) and an overflow (``stepped`` False). The events are the rollback guard's input."""
        self.training_steps += 1
        if nonfinite_loss is not None:
            self.nonfinite_losses += 1
            self.nonfinite_streak += 1
            self._emit(
                "trainer.step_skipped",
                "warning",
                reason="nonfinite_loss",
                step=self.training_steps,
                loss=nonfinite_loss,
                nonfinite_losses=self.nonfinite_losses,
                streak=self.nonfinite_streak,
            )
            if self.nonfinite_streak == self.config.nonfinite_streak_threshold:
                self._emit("trainer.nonfinite_streak", "error", streak=self.nonfinite_streak, step=self.training_steps)
            return
        self.nonfinite_streak = 0
        if scale is not None and scale != self._last_scale:
            self._emit(
                "trainer.scale_changed",
                "info" if stepped else "warning",
                old_scale=self._last_scale,
                new_scale=scale,
                step=self.training_steps,
            )
            self._last_scale = scale
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

    # -- the per-step path ------------------------------------------------------------
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

    def training_step(self, batch: Any, compute_loss_fn: LossFn) -> torch.Tensor:
        """Run ``compute_loss_fn(model, batch)`` under autocast and return the
        loss. A seed-API ``auto`` is first decided on this batch (the first one)."""
        if self.first_batch is not None:
            self._decide_at_first_batch(batch, compute_loss_fn)
        self._training_mode(self.is_last_micro_step)
        with self.autocast():
            loss = compute_loss_fn(self.model, batch)
        self._count_samples(batch)
        return loss

    def _training_mode(self, sync: bool) -> None:
        """Before a step's forward, on either path: the model in training mode, the gradient sync set."""
        if not self.model.training:
            # Only after someone switched the model to eval (validation, inference):
            # model.train() walks every submodule, about 2 us each, which is 1-2% of a
            # small world model's step (measured by `genesis-fp16 bench`, docs/PERFORMANCE.md).
            self.model.train()
        self._set_gradient_sync(sync)

    def _count_samples(self, batch: Any) -> None:
        """After a step's forward, on either path: the batch's rows (a batch, or a tuple led by one) counted."""
        first = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
        if isinstance(first, torch.Tensor) and first.dim() > 0:
            self.samples_seen += int(first.shape[0])

    def backward_and_step(self, loss: torch.Tensor) -> bool:
        """Backward pass, and on the last micro-step the optimizer step.

        Returns False when the step was skipped (non-finite loss, or gradient
        overflow detected by the scaler). A skipped step zeroes the gradients,
        is counted and does not advance the scheduler.
        """
        self.micro_steps += 1
        finite = (not self.config.check_finite_loss) or self._all_finite(loss)
        if not finite:
            # Drop the whole accumulation window: gradients of earlier micro-steps
            # would otherwise be stepped with a missing share of the batch.
            self.optimizer.zero_grad(set_to_none=True)
            self._micro_in_window = 0
            self._account(nonfinite_loss=_first_value(loss), stepped=False, scale=None)
            return False
        self.nonfinite_streak = 0
        accum = self.config.grad_accumulation_steps
        self.precision.backward(loss / accum if accum > 1 else loss)
        self._micro_in_window += 1
        if self._micro_in_window < self.config.grad_accumulation_steps:
            return True
        return self._optimizer_step()

    def _optimizer_step(self) -> bool:
        self._micro_in_window = 0
        if self.config.max_grad_norm is not None:
            self.precision.unscale_(self.optimizer)  # clip the true gradients, not the scaled ones
            self._clip_gradients(self.config.max_grad_norm)
        stepped = self.precision.optimizer_step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        self._account(nonfinite_loss=None, stepped=stepped, scale=self.precision.scale)
        if stepped and self.scheduler is not None:
            self.scheduler.step()
        return stepped

    def train_batches(self, batches: Iterator[Any], compute_loss_fn: LossFn) -> list[float]:
        """Convenience loop: one micro-step per batch; returns the losses."""
        losses = []
        for batch in batches:
            loss = self.training_step(batch, compute_loss_fn)
            self.backward_and_step(loss)
            losses.append(float(loss.detach()))
        return losses

    # -- the training window ----------------------------------------------------------------
    def window_blocker(self) -> Optional[str]:
        """Why this trainer cannot run a window on the device (None: it can)."""
        opt = self.optimizer
        # torch's own fused optimizers take found_inf; the flag marking them is lost by a deep copy (auto's copies)
        takes_found_inf = getattr(opt, "_step_supports_amp_scaling", False) or type(opt).__module__.startswith(
            "torch.optim."
        )
        if not takes_found_inf or not all(g.get("fused") for g in opt.param_groups):
            return (
                f"{type(opt).__name__} is not a fused optimizer: a skipped step would need its found_inf read on "
                "the host (use e.g. torch.optim.Adam(params, fused=True))"
            )
        if self.scheduler is not None:
            return "an LR scheduler steps per optimizer step on the host"
        if self.config.grad_accumulation_steps != 1:
            return "gradient accumulation (grad_accumulation_steps > 1)"
        if not self.config.check_finite_loss:
            return "check_finite_loss=False (the per-step path steps on a non-finite loss)"
        if not type(self).supports_window:
            return f"{type(self).__name__} keeps the per-step path (ranks agree on finiteness there)"
        return None

    def train_window(
        self, batches: Iterable[Any], compute_loss_fn: LossFn, after_step: Optional[StepHook] = None
    ) -> WindowResult:
        """One micro-step and optimizer step per batch with nothing read back
        to the host until the window ends (see the module docstring): a
        non-finite loss or an overflow skips its step on the device; then every
        step is accounted for as `backward_and_step` would have. Whatever raises
        inside the window (the loss, the data, a ``KeyboardInterrupt``), the
        steps already taken are accounted for before the error goes on.
        ``after_step(taken)`` runs after each step with a device flag (1.0
        taken, 0.0 skipped). Where a window cannot run on the device it runs
        the per-step path and says why once. A seed-API ``auto`` is decided on
        the first batch before the window starts."""
        if self.first_batch is not None:
            batches = self._decide_at_first_of(batches, compute_loss_fn)
        blocker = self.window_blocker()
        if blocker is not None:
            return self._per_step_window(batches, compute_loss_fn, after_step, blocker)
        graphs = self._step_graphs()
        precision = self.precision
        losses: list[torch.Tensor] = []
        flags: list[torch.Tensor] = []
        scales: Optional[list[torch.Tensor]] = [] if precision.uses_scaler else None

        def step(batch: Any, cache: bool) -> tuple[torch.Tensor, torch.Tensor]:
            return self._window_step(batch, compute_loss_fn, cache)

        try:
            for (
                batch
            ) in batches:  # lazily: a batch may depend on the step before (a critic's targets on its target network)
                self._training_mode(True)
                value, flag = graphs.step(batch, step) if graphs is not None else step(batch, True)
                # from here the step happened: its record goes in before anything else can raise
                self._count_samples(batch)
                losses.append(value)
                flags.append(flag)
                if scales is not None:
                    scales.append(precision.scale_tensor().clone())
                if after_step is not None:
                    after_step(1.0 - flag)
        except BaseException:
            self._settle_window(losses, flags, scales)  # the steps that ran are accounted for before the error goes on
            raise
        return self._settle_window(losses, flags, scales)

    def _step_graphs(self) -> Optional[StepGraphs]:
        """The captured steps where this trainer's window may be captured (CUDA), checked against the state they
        hold; None where the eager window runs (said once on CUDA, with why)."""
        why = capture_blocker(self)
        if why is not None:
            if self.device.type == "cuda":
                self._say_uncaptured(why)
            return None
        if self._graphs is None:
            self._graphs = StepGraphs(self, self._say_uncaptured)
        self._graphs.check_state()
        return self._graphs

    @property
    def window_warmup_steps(self) -> int:
        """Window steps before this trainer's steps run as they will from then on: the eager warm-up and the capture
        where the window is captured (CUDA), else none. A measurement times what comes after them (auto's)."""
        if self.window_blocker() is not None or capture_blocker(self) is not None:
            return 0
        return CAPTURE_WARMUP + 1

    @property
    def step_graphs(self) -> Optional[StepGraphs]:
        """The window's captured steps (None until a window is captured: CUDA, ``config.capture``)."""
        return self._graphs

    def _say_uncaptured(self, why: str) -> None:
        log_once(self._log, f"window_uncaptured:{self.name}:{why}", "info", "trainer.window_uncaptured", reason=why)

    def _window_step(self, batch: Any, loss_fn: LossFn, cache: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of a window on the device, nothing read back: forward under the precision's autocast (its
        weight cache off where ``cache`` is False, as a CUDA-graph capture needs), backward, a flag ``found`` (1.0
        where the loss or, with a scaler, a gradient is not finite), clipping, the fused optimizer step skipped on
        ``found``, the scale updated. Returns the loss's first value and ``found``, new device tensors. The same
        calls eager and captured."""
        precision, opt = self.precision, self.optimizer
        with precision.forward_context(cache=cache):
            loss = loss_fn(self.model, batch)
        detached = loss.detach()
        finite = torch.isfinite(detached).all()
        precision.backward(loss)
        on_host, taken = self.host_is_device, True
        if on_host and not precision.uses_scaler:  # one of two constants: two ops fewer a step than making a flag
            taken = bool(finite)
            found = self._host_flags[0 if taken else 1]
        else:
            found = finite.logical_not().float()  # a non-finite loss skips its step even where its gradients are finite
        if precision.uses_scaler:  # gradients unscaled in place, found = 1 where one is not finite
            grads = [p.grad for group in opt.param_groups for p in group["params"] if p.grad is not None]
            precision.window_unscale_(grads, found)
        if self.config.max_grad_norm is not None:
            self._clip_gradients(self.config.max_grad_norm)
        if on_host:
            # the host skips the step (`host_is_device`): the fused kernel is called without found_inf, whose CPU
            # fallback subtracts the flag from each state's step count one tensor at a time (about 2% of a small
            # model's step); the same weights bit for bit
            if precision.uses_scaler:
                taken = not bool(found)
            if taken:
                opt.step()
        else:
            opt.grad_scale, opt.found_inf = None, found  # the fused kernel skips the whole step when found_inf is 1
            try:
                opt.step()
            finally:
                del opt.grad_scale, opt.found_inf
        if detached.dim() == 0 and detached.dtype == torch.float32:  # the usual loss: no views to make
            value = detached
        elif detached.numel():
            value = detached.float().reshape(-1)[0]
        else:
            value = torch.full((), math.nan, device=self.device)
        opt.zero_grad(set_to_none=True)
        precision.window_update(found, finite)
        return value, found

    def _settle_window(
        self, losses: list[torch.Tensor], flags: list[torch.Tensor], scales: Optional[list[torch.Tensor]]
    ) -> WindowResult:
        """Read the window's records back once and account for each step in order. A step interrupted between its
        optimizer step and its scale update has no scale recorded: the scale read back is then the one on the
        device now, which is what the scaler holds."""
        k = len(losses)
        if k == 0:
            return WindowResult()
        if scales is not None and len(scales) < k:
            scales = scales + [self.precision.scale_tensor().clone()]
        read = torch.stack(losses + flags[:k] + (scales or [])).tolist()  # the window's one read
        result = WindowResult(steps=k, losses=read[:k])
        result.stepped = [f == 0.0 for f in read[k : 2 * k]]
        scale_values = read[2 * k :] if scales is not None else None
        for i, (loss, stepped) in enumerate(zip(result.losses, result.stepped)):
            self.micro_steps += 1
            self._account(
                nonfinite_loss=None if math.isfinite(loss) else loss,
                stepped=stepped,
                scale=scale_values[i] if scale_values is not None else None,
            )
        self.precision.window_done(scale_values[-1] if scale_values else None)
        result.skipped = result.stepped.count(False)
        return result

    def _per_step_window(
        self, batches: Iterable[Any], loss_fn: LossFn, after_step: Optional[StepHook], why: str
    ) -> WindowResult:
        """A window's batches on the per-step path (``why``: what keeps it off the device, said once); its
        ``steps`` are optimizer steps, as the device window counts them."""
        log_once(self._log, f"window_eager:{self.name}:{why}", "info", "trainer.window_eager", reason=why)
        result = WindowResult(eager=why)
        for batch in batches:
            before = self.training_steps
            loss = self.training_step(batch, loss_fn)
            stepped = self.backward_and_step(loss)
            if self.training_steps == before:  # a micro-step of an accumulation window: no optimizer step yet
                continue
            result.steps += 1
            result.losses.append(_first_value(loss))
            result.stepped.append(stepped)
            if after_step is not None:
                after_step(torch.ones((), device=self.device) if stepped else torch.zeros((), device=self.device))
        result.skipped = result.stepped.count(False)
        return result

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
            "requested_precision": self.decision.requested.value,
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

    # -- checkpoints -------------------------------------------------------------------
    def counters(self) -> dict[str, int]:
        """The counters a checkpoint keeps."""
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
        """Model, optimizer, scaler, scheduler, counters, precision, RNG and ``extra``; refused mid accumulation
        window."""
        if self._micro_in_window:
            raise RuntimeError(
                f"cannot checkpoint in the middle of an accumulation window ({self._micro_in_window}/"
                f"{self.config.grad_accumulation_steps} micro-steps); save after an optimizer step"
            )
        return ckpt.build_payload(
            model=self._model_state(),
            optimizer=self.optimizer.state_dict(),
            optimizer_type=ckpt.optimizer_type_name(self.optimizer),
            scaler=self.precision.state_dict(),
            scheduler=self.scheduler.state_dict() if self.scheduler is not None else None,
            counters=self.counters(),
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
        """Restore from ``path``; returns the checkpoint's ``extra`` dict. All or
        nothing (`apply_payload`): a checkpoint that fails raises one
        `CheckpointError` naming the file and the field, the trainer left as it was."""
        payload = ckpt.load_payload(path, map_location=self.device)
        self.apply_payload(payload, source=str(path), restore_rng=restore_rng, check_extra=check_extra)
        return payload.get("extra") or {}

    def check_payload(
        self, payload: dict[str, Any], *, source: str = "<memory>", check_extra: Optional[ExtraCheck] = None
    ) -> None:
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
        restoring fail all the same, what was changed is put back (`_Snapshot`)
        before one `CheckpointError` naming the file and the field."""
        self.check_payload(payload, source=source, check_extra=check_extra)
        counters = ckpt.check_counters(payload.get("counters"), source)
        snapshot = _Snapshot.take(self)
        scaler_state = payload.get("scaler") or {}
        try:
            # the model last: its weights are copied in place, the others' state objects swapped
            if payload.get("optimizer") is not None:
                # how the optimizer computes (fused, foreach, capturable) is this trainer's, not the checkpoint's: a
                # checkpoint of a plain Adam loads into a fused one (a training window needs it) and stays fused
                kernels = [{k: g[k] for k in ckpt.KERNEL_OPTIONS if k in g} for g in self.optimizer.param_groups]
                self.optimizer.load_state_dict(payload["optimizer"])
                for group, kept in zip(self.optimizer.param_groups, kernels):
                    group.update(kept)
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


@dataclass
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


def calibration_copies(config: FP16TrainingConfig, device: Union[str, torch.device], name: str):
    """``copy_trainer(model, optimizer, mode)`` for the measurement of ``auto``
    (`genesis_fp16.precision.measure`): an `FP16Trainer` of ``mode`` over the
    copies it made, with ``config``'s other options, decided by name."""
    device = torch.device(device)

    def copy_trainer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, mode: PrecisionMode) -> FP16Trainer:
        options = dataclasses.replace(config, precision=mode.value, enabled=True, device=str(device))
        decision = PrecisionDecision(mode, Source.EXPLICIT, "a calibration copy", mode, str(device))
        return FP16Trainer(model, optimizer, options, name=f"{name}.calibration.{mode.value}", decision=decision)

    return copy_trainer


def fused_adam(params: Iterable[torch.nn.Parameter], lr: float, device: torch.device) -> torch.optim.Adam:
    """``Adam(fused=True)`` where ``device`` has the fused kernel (CPU and CUDA in the torch versions this project
    supports): it skips a step on the device's ``found_inf``, so a window needs it; elsewhere the plain Adam, and a
    window there runs the per-step path (`FP16Trainer.window_blocker` says why)."""
    from torch.optim.optimizer import _get_fused_kernels_supported_devices

    fused = torch.device(device).type in _get_fused_kernels_supported_devices()
    return torch.optim.Adam(params, lr=lr, fused=fused or None)

"""A learned part trained as a guarded agent of its own: the base the world model and the critic share.

A learner owns a model and its optimizer, and trains them through its own
`GuardedTraining` (``training``), built in its constructor: its precision is
decided there, once (settings, its profile, its ledger stage, the kill switch,
a measured ``auto`` on a sample batch, or a resumed run's ``decision``), and
a rollback reaches it as a callback (`on_rollback`). What every learner does
the same is written here once (mbrl-lib's ``ModelTrainer`` shape, with the
loss as a method):

* ``await train(...)`` runs a call in a worker thread (torch releases the GIL
  in its kernels, so the event loop keeps running), one call at a time (an
  `asyncio.Lock`), under the settings' torch threads; each call's report is
  kept in ``history``;
* a call (`_guarded_call`): ``begin_call`` with `prepare`, the steps in
  training windows over `batches` with the `loss`, ``finish_call`` with the
  `validation`, what `after_call` adds, a checkpoint (marked good when the
  call was healthy), the report;
* `save` and `load`: the trainer's checkpoint with the learner's `extra`;
  a load is checked whole (`check_checkpoint`) before anything changes.

A subclass gives its model and optimizer to `_train_through` and overrides
`loss`, `prepare`, `batches`, `validation` and, where it needs them,
`step_hook`, `on_rollback`, `after_call`, `checkpoint_extra`,
`check_checkpoint` and `restored`.
"""

from __future__ import annotations

import asyncio
import copy
import math
import time
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Iterator, Optional, TypeVar, Union

import numpy as np
import torch

from genesis_fp16.base.device import DeviceArg, resolve_device
from genesis_fp16.base.names import check_agent_name
from genesis_fp16.base.settings import Settings, load_settings
from genesis_fp16.base.telemetry import get_logger
from genesis_fp16.base.threads import torch_threads
from genesis_fp16.precision.decision import PrecisionDecision
from genesis_fp16.precision.request import PrecisionRequest
from genesis_fp16.training import checkpoint as ckpt
from genesis_fp16.training.guarded import (
    UNGUARDED,
    CallReport,
    Guard,
    GuardChoice,
    GuardedTraining,
    RollbackSummary,
    Sample,
    ValFn,
    Verdict,
    resolve_guard,
)
from genesis_fp16.training.trainer import ExtraCheck, FP16Trainer, StepHook

__all__ = ["GuardedCallReport", "GuardedLearner", "StepFn"]

R = TypeVar("R")


StepFn = Callable[[int], None]
"""``on_step(done)``: the steps a training call has done so far, after each one (the caller's progress)."""


def _handing_over(batches: Iterable[Any]) -> Iterator[Any]:
    for (
        batch
    ) in batches:  # the GIL handed to the event loop after each batch, not at the interpreter's 5 ms forced switch
        yield batch
        time.sleep(0)


def _counted(batches: Iterable[Any], on_step: Optional[StepFn]) -> Iterator[Any]:
    """``batches``, ``on_step`` told the steps done as each next batch is asked for (its step is then done)."""
    if on_step is None:
        yield from batches
        return
    done = 0
    for batch in batches:
        yield batch
        done += 1
        on_step(done)


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
            val_loss=float(val) if val is not None else float("nan"),
            precision=call.precision,
            skipped_steps=call.skipped_steps,
            fp32_val_loss=call.fp32_val_loss,
            shadow_gap=call.gap,
            reference=call.reference if call.fp32_val_loss is not None else None,
            rollback=call.rollback,
            guard_decision=call.decision,
            events=list(call.events),
            precision_decision=call.precision_decision.as_dict() if call.precision_decision is not None else None,
            **fields,
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


class GuardedLearner:
    """A model trained as a guarded agent of its own; see the module docstring.

    Args (the subclasses' own, documented there too):
        kind: the learner's kind (``world_model``, ``critic``): its logger's and its events' name.
        agent: the name its precision policy and guard are resolved for.
        settings: the settings (default: ``load_settings()``).
        device: where it trains (``auto``, ``cpu``, ``cuda``, ``cuda:N`` or a `torch.device`; default: the
            setting ``GENESIS_FP16_DEVICE``); one that is not there follows ``on_unsupported``.
        guard: its rollback guard (default: its own `RollbackGuard`; ``UNGUARDED``: none).
        precision: the precision asked for (a `PrecisionRequest` or its text); None: settings and profile.
        decision: a decision made earlier for this agent (a resumed run's): trained on instead of deciding again,
            while the request it answered stands; one made for another device is not.
    """

    report: ClassVar[type[GuardedCallReport]]
    """The report class a call returns."""

    def __init__(
        self,
        kind: str,
        agent: str,
        *,
        settings: Optional[Settings],
        device: DeviceArg,
        guard: Union[Guard, GuardChoice],
        precision: Union[PrecisionRequest, str, None],
        decision: Optional[PrecisionDecision],
    ) -> None:
        owner = f"{type(self).__name__}({agent!r})"
        self.kind = kind
        self.settings = settings or load_settings()
        self.agent = check_agent_name(agent)  # it names the checkpoint files (<agent>.pt)
        self._log = get_logger(f"infrastructure.{kind}", agent=agent)
        choice = resolve_device(
            self.settings.device if device is None else device, self.settings.on_unsupported, owner=owner
        )
        if choice.fallback_reason is not None:
            self._log.warning(
                f"{kind}.device_fallback",
                requested=choice.requested,
                device=str(choice.device),
                reason=choice.fallback_reason,
            )
        self.device = choice.device
        self.guard: Optional[Guard] = resolve_guard(owner, self.agent, guard, self.settings)
        self._precision = None if precision is None else PrecisionRequest.parse(precision)
        if decision is not None and decision.device != str(self.device):
            self._log.info(
                "precision.decision_not_reused", agent=self.agent, decided_on=decision.device, device=str(self.device)
            )
            decision = None
        self._decision = decision
        self.trained = False
        self.history: list[Any] = []
        self._lock = asyncio.Lock()
        self._on_step: Optional[StepFn] = None  # of the call that is running
        self.checkpoint_dir = Path(self.settings.state_dir) / kind
        self.training: GuardedTraining

    def _train_through(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        checkpoint_dir: Union[str, Path, None],
        sample: Sample,
    ) -> None:
        """The end of a subclass's constructor: its `GuardedTraining`, where the precision is decided once (a
        measured ``auto`` runs on ``sample``, a batch of the workload and its loss)."""
        if checkpoint_dir:
            self.checkpoint_dir = Path(checkpoint_dir)
        with torch_threads(self.settings.torch_threads):  # as it trains: a measured workload's key counts its threads
            self.training = self._guarded_training(model, optimizer, sample)

    def _guarded_training(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, sample: Sample
    ) -> GuardedTraining:
        return GuardedTraining(
            self.agent,
            model,
            optimizer,
            settings=self.settings,
            precision=self._precision,
            guard=self.guard if self.guard is not None else UNGUARDED,
            checkpoint_dir=self.checkpoint_dir,
            good_name=f"{self.agent}.initial.pt",
            checkpoint_every=0,
            save=self.save,
            sample=sample,
            decision=self._decision,
            on_rollback=self.on_rollback,
        )

    # -- what a subclass says about its training ------------------------------------------------------
    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        """The training loss of ``model`` on ``batch`` (the FP32 reference's too: a copy of the model)."""
        raise NotImplementedError

    def prepare(self, model: torch.nn.Module) -> None:
        """Fit per-call state the model holds (a normaliser) to this call's data: on the model, its FP32
        reference, and again on restored weights after a rollback."""

    def batches(self, steps: int) -> Iterable[Any]:
        """This call's ``steps`` batches (made after `prepare`; lazily, when a batch depends on the step before)."""
        raise NotImplementedError

    def validation(self) -> ValFn:
        """``val_fn(model, trainer)``: this call's validation loss (made after the steps)."""
        raise NotImplementedError

    def step_hook(self) -> Optional[StepHook]:
        """Called after each training step with a device flag (1.0 taken, 0.0 skipped); None: nothing."""
        return None

    def on_rollback(self) -> None:
        """Called by the guarded training after each rollback, once the restored weights are in place."""

    def after_call(self, call: CallReport) -> dict[str, Any]:
        """The report fields this learner adds once a call's steps and validation are done."""
        return {}

    # -- one call ----------------------------------------------------------------------------------
    async def _train_in_thread(self, work: Callable[..., R], *args: Any, on_step: Optional[StepFn] = None) -> R:
        """``work(*args)`` in a worker thread under the settings' torch threads (process-wide, so it holds in the
        worker thread too); its report kept in ``history``; ``on_step`` told of each of the call's steps. The caller
        holds the lock."""
        self._on_step = on_step
        try:
            with torch_threads(self.settings.torch_threads):
                report = await asyncio.to_thread(work, *args)
        finally:
            self._on_step = None
        self.history.append(report)
        return report

    def _guarded_call(self, started: float, steps: int, save: bool, **fields: Any) -> Any:
        """A `train()` call's guarded part, its data set up by the subclass: `begin_call` with `prepare`, `batches`
        in windows of `loss` (`step_hook` after each step), `finish_call` with `validation`, `after_call`'s
        fields, a checkpoint if ``save`` (marked good if healthy), the report."""
        training = self.training
        training.begin_call(prepare=self.prepare)
        batches = _counted(_handing_over(self.batches(steps)), self._on_step)
        result = training.train_windows(batches, self.loss, after_step=self.step_hook())
        call = training.finish_call(self.validation())
        fields.update(self.after_call(call))
        self.trained = True
        checkpoint = str(self.save()) if save else None
        healthy = call.decision is None or call.decision.action != "rollback"
        if (
            checkpoint is not None
            and self.guard is not None
            and healthy
            and call.val_loss is not None
            and math.isfinite(call.val_loss)
        ):
            training.mark_good(checkpoint)
        finite = [v for v in result.losses[-50:] if math.isfinite(v)]
        return self.report.from_call(
            call,
            train_loss=float(np.mean(finite)) if finite else float("nan"),
            wall_s=time.perf_counter() - started,
            checkpoint=checkpoint,
            device=str(self.device),
            steps=steps,
            **fields,
        )

    # -- checkpoints ---------------------------------------------------------------------------------
    @property
    def checkpoint_path(self) -> Path:
        """Where `save()` and `load()` go without a path: ``<checkpoint_dir>/<agent>.pt``."""
        return self.checkpoint_dir / f"{self.agent}.pt"

    def checkpoint_extra(self) -> dict[str, Any]:
        """What this learner keeps in its checkpoints beside the trainer's state."""
        return {"trained": self.trained, "agent": self.agent}

    def check_checkpoint(self, payload: dict[str, Any], source: str) -> None:
        """Raise `CheckpointError` unless ``payload`` is a checkpoint of this learner (its architecture, its spec)."""

    check_extra: Optional[ExtraCheck] = None
    """Checks the ``extra`` of a checkpoint before a load changes anything (the trainer's ``check_extra``)."""

    def restored(self, extra: dict[str, Any]) -> None:
        """Take what `checkpoint_extra` kept, once the trainer's state is restored."""
        self.trained = bool(extra.get("trained", True))

    def save(self, path: Union[str, Path, None] = None) -> Path:
        """Write the trainer's state and `checkpoint_extra` atomically to ``path`` (default `checkpoint_path`)."""
        return self.training.trainer.save_checkpoint(path or self.checkpoint_path, extra=self.checkpoint_extra())

    def load(self, path: Union[str, Path, None] = None) -> Path:
        """Restore what `save()` wrote to ``path`` (default `checkpoint_path`), read with ``weights_only=True``
        onto this learner's device. A missing, corrupt or foreign checkpoint raises `CheckpointError`, and then
        nothing has changed. Returns the path read."""
        path = Path(path or self.checkpoint_path)
        trainer = self.training.trainer
        payload = ckpt.load_payload(path, map_location=trainer.device)
        self.check_checkpoint(payload, str(path))
        trainer.apply_payload(payload, source=str(path), restore_rng=False, check_extra=self.check_extra)
        self.restored(payload.get("extra") or {})
        return path

    # -- what runs --------------------------------------------------------------------------------
    @property
    def trainer(self) -> FP16Trainer:
        """The trainer in use (a new one after a rollback or a policy change)."""
        return self.training.trainer

    @property
    def precision(self) -> str:
        """The precision training runs in now (`fp32`, `bf16`, ...)."""
        return self.training.trainer.precision.name

    @property
    def decision(self) -> PrecisionDecision:
        """The trainer's `PrecisionDecision` (mode, source, reason)."""
        assert self.training.decision is not None
        return self.training.decision

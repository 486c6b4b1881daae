"""Train one agent under its rollout policy: the one place that does it.

`GuardedTraining` decides the agent's precision once, before its trainer
exists (``registry.resolve_trainer``: the request layered by the rollout
policy, measured for ``auto`` when a ``sample`` batch is given, decided by
`genesis_fp16.precision.decision.decide`), builds the trainer with that
decision (the `EffectivePolicy` kept beside it), attaches a `RollbackGuard`
(unless the caller passes ``guard=UNGUARDED``), keeps good checkpoints, steps
an FP32 reference beside the reduced-precision run (stage ``shadow``: one copy
kept for the stage; stage ``on``: a fresh canary every
``guard.canary_every``-th reduced-precision call), rebuilds the trainer when
settings, profile or ledger now resolve to another policy, and handles every
rollback through ``guard.recover()``: a new trainer (FP32: the ledger says
``rolled_back``), the last good checkpoint restored into it, the trip cleared,
training going on, and the caller told through its ``on_rollback`` callback.
The caller keeps its batches, its loss and its validation:

* ``step(batch, loss_fn)``: one step (and the reference's on the same batch);
* ``train_windows(batches, loss_fn)``: the steps in training windows (nothing
  read back to the host inside one), judged at each window's end;
* ``begin_call()`` ... ``finish_call(val_fn)``: one training call, judged at
  its end and reported as a `CallReport`;
* ``run(batches, loss_fn, val_fn)``: all together.

The learners (``infrastructure.learner``), PPO's guard and the drill train
through it. What it needs of a guard is `Guard` (`RollbackGuard` is the real
one); the guard's verdict, from its rule to the reports, is
`genesis_fp16.rollout.judge.Verdict`.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Protocol, Union

import torch

from genesis_fp16.base.names import check_agent_name
from genesis_fp16.base.settings import Settings, load_settings
from genesis_fp16.base.telemetry import get_logger, log_once
from genesis_fp16.precision.decision import PrecisionDecision
from genesis_fp16.precision.request import PrecisionRequest
from genesis_fp16.rollout.canary import CANARY_SUFFIX, SHADOW_SUFFIX, fp32_reference
from genesis_fp16.rollout.guard import RollbackGuard
from genesis_fp16.rollout.judge import Verdict
from genesis_fp16.rollout.ledger import LedgerError, RolloutLedger, Stage
from genesis_fp16.rollout.policy import EffectivePolicy, resolve_policy
from genesis_fp16.training import registry
from genesis_fp16.training.registry import Sample
from genesis_fp16.training.trainer import WINDOW_STEPS, FP16Trainer, StepHook, WindowResult

__all__ = [
    "DEFAULT_GUARD",
    "UNGUARDED",
    "CallReport",
    "Guard",
    "GuardChoice",
    "GuardedTraining",
    "LoadFn",
    "LossFn",
    "QualityLedger",
    "Reference",
    "RollbackSummary",
    "SaveFn",
    "Sample",
    "ValFn",
    "Verdict",
    "resolve_guard",
]

LossFn = Callable[[torch.nn.Module, Any], torch.Tensor]
ValFn = Callable[[torch.nn.Module, FP16Trainer], float]
"""``val_fn(model, trainer) -> validation loss``, under ``trainer.autocast()`` (the reference's is FP32)."""
SaveFn = Callable[[Path], Path]
LoadFn = Callable[[FP16Trainer, Path], Any]


class GuardChoice(enum.Enum):
    """``guard=`` without a guard object: the agent's own `RollbackGuard`
    (``DEFAULT_GUARD``, the default) or none, said explicitly (``UNGUARDED``)."""

    DEFAULT = "default"
    UNGUARDED = "unguarded"


DEFAULT_GUARD = GuardChoice.DEFAULT
"""The default ``guard=``: ``RollbackGuard(agent)`` with the agent's thresholds."""
UNGUARDED = GuardChoice.UNGUARDED
"""Pass as ``guard=`` to train without a rollback guard (no rollback, no canary, no good checkpoints)."""


class QualityLedger(Protocol):
    """Where reference measurements go (`genesis_fp16.rollout.ledger.RolloutLedger`)."""

    def record_shadow_gap(self, agent: str, val_loss: float, fp32_val_loss: float, precision: str) -> object: ...

    def record_quality_check(
        self,
        agent: str,
        kind: str,
        metrics: dict[str, Any],
        precision: Optional[str] = None,
        alarm: Optional[bool] = None,
    ) -> object: ...


class Guard(Protocol):
    """What `GuardedTraining` needs of a rollback guard (`RollbackGuard` is the real one)."""

    tripped: Optional[Verdict]
    ledger: QualityLedger

    @property
    def canary_every(self) -> int: ...

    def canary_due(self) -> bool: ...

    @property
    def last_good_checkpoint(self) -> Union[str, Path, None]: ...

    def attach(self, trainer: FP16Trainer) -> None: ...

    def check(
        self,
        trainer: FP16Trainer,
        *,
        val_loss: Optional[float] = None,
        fp32_val_loss: Optional[float] = None,
        reference: str = "shadow",
    ) -> Verdict: ...

    def check_policy_canary(
        self, trainer: Optional[FP16Trainer] = None, *, kl: float, max_logp_delta: float, max_value_delta: float
    ) -> Verdict: ...

    def recover(
        self, build: Callable[[], FP16Trainer], load: Optional[LoadFn] = None
    ) -> tuple[FP16Trainer, Optional[Path]]: ...

    def record_good_checkpoint(self, path: Union[str, Path]) -> None: ...

    def reset(self) -> None: ...


@dataclass
class Reference:
    """An FP32 copy trained beside the reduced-precision model on the same batches."""

    kind: str
    """``shadow`` (kept for the rollout stage) or ``canary`` (fresh from the current weights, for one call)."""
    model: torch.nn.Module
    trainer: FP16Trainer


class RollbackSummary:
    """``rolled_back`` and ``rollback_reason`` of a report with a ``rollback`` verdict (None without one)."""

    rollback: Optional[Verdict]

    @property
    def rolled_back(self) -> bool:
        """Whether the call rolled back."""
        return self.rollback is not None

    @property
    def rollback_reason(self) -> Optional[str]:
        """``"<severity>: <reason>"`` of the first rollback in the call (`Verdict.summary`)."""
        return None if self.rollback is None else self.rollback.summary


@dataclass
class CallReport(RollbackSummary):
    """What one training call (``begin_call`` ... ``finish_call``) did."""

    precision: str
    """The precision that runs after the call (``fp32`` after a rollback)."""
    val_loss: Optional[float] = None
    """The validation loss of the weights in use after the call (the restored ones after a rollback); None without
    ``val_fn``."""
    fp32_val_loss: Optional[float] = None
    """The FP32 reference's validation loss; None when no reference trained this call."""
    gap: Optional[float] = None
    """``(val_loss - fp32_val_loss) / fp32_val_loss``; None when undefined."""
    reference: Optional[str] = None
    """Where ``fp32_val_loss`` comes from: ``shadow``, ``canary`` or None."""
    canary_due: bool = False
    """Whether this call was a canary call (every ``guard.canary_every``-th reduced-precision call)."""
    rollback: Optional[Verdict] = None
    """The guard's verdict of the first rollback in the call (None: no rollback)."""
    restored: Optional[str] = None
    """The checkpoint the rollback restored."""
    decision: Optional[Verdict] = None
    """The guard's judgement at the end of the call (None unguarded)."""
    skipped_steps: int = 0
    """Steps skipped during the call, over every trainer it used."""
    events: list[str] = field(default_factory=list)
    """What happened, in words (``restored <path>``, ``rolled back to fp32: ...``)."""
    precision_decision: Optional["PrecisionDecision"] = None
    """The precision decision of the trainer in use after the call (mode, source, reason)."""


def resolve_guard(owner: str, agent: str, guard: Union[Guard, GuardChoice], settings: Settings) -> Optional[Guard]:
    """The guard a ``guard=`` argument means: left out (`DEFAULT_GUARD`), the
    agent's own `RollbackGuard`; `UNGUARDED`, none; a guard, itself. ``None``
    is refused, so that "no guard" is always said out loud."""
    if guard is UNGUARDED:
        return None
    if guard is DEFAULT_GUARD:
        return RollbackGuard(agent, settings=settings)
    if guard is None:
        raise TypeError(
            f"{owner}: guard=None; expected a RollbackGuard, nothing (the agent's own "
            "RollbackGuard) or guard=UNGUARDED to train without one"
        )
    return guard


@dataclass
class _Call:
    """One training call's bookkeeping in `GuardedTraining` (begin_call ... finish_call)."""

    skipped_from: int
    report: CallReport
    reference: Optional[Reference] = None
    skipped_before: int = 0
    prepare: Optional[Callable[[torch.nn.Module], None]] = None


def record_training(ledger: QualityLedger, agent: str, report: CallReport, log: Any) -> None:
    """A training call's outcome in the ledger (kind ``training``): `rollout status` shows every agent that trained,
    with its precision, where that came from and how its last training went. A ledger that cannot be written
    (read-only, full disk) costs the record, not the training."""

    decision = report.precision_decision
    metrics = {
        "skipped_steps": report.skipped_steps,
        "val_loss": report.val_loss,
        "source": decision.source.value if decision is not None else None,
        "outcome": f"rolled back: {report.rollback_reason}" if report.rolled_back else "healthy",
    }
    try:
        ledger.record_quality_check(agent, "training", metrics, precision=report.precision, alarm=report.rolled_back)
    except LedgerError as exc:
        log_once(log, f"training_unrecorded:{agent}", "warning", "guarded.training_unrecorded", error=str(exc))


def _restore_weights(trainer: FP16Trainer, path: Path) -> None:
    # the run goes on with its own randomness, not the checkpoint's
    trainer.load_checkpoint(path, restore_rng=False)


class GuardedTraining:
    """One agent's trainer under its rollout policy, its guard and its good checkpoints.

    Args:
        agent: the agent's name (its profile, its stage in the rollout ledger, its guard).
        model: the model the trainer trains.
        optimizer: its optimizer.
        scheduler: an optional LR scheduler.
        settings: the settings (default: ``load_settings()``).
        precision: the precision asked for by argument, a `PrecisionRequest`
            or its text (the ledger and the kill switch still win; a rebuild
            after a rollback is FP32).
        overrides: explicit trainer options for the registry.
        guard: the rollback guard; left out, ``RollbackGuard(agent)`` with the
            agent's thresholds. ``guard=UNGUARDED`` trains without one (no
            rollback, no canary, no good checkpoints); ``None`` is refused, so
            that "no guard" is always said explicitly.
        checkpoint_dir: where good checkpoints go (default
            ``<state_dir>/checkpoints/<agent>``). A last good checkpoint the
            ledger holds from elsewhere (another run of the same agent) is
            never restored: one of this directory's is written before the first
            reduced-precision step.
        good_name: the file name of the good checkpoints written here
            (``save_good_checkpoint``), overwritten atomically.
        checkpoint_every: also record a good checkpoint after every Nth
            healthy optimizer step (0: only the first and those from
            `save_good_checkpoint` / `mark_good`).
        save: ``save(path) -> path`` writes a checkpoint (default
            ``trainer.save_checkpoint``), for callers whose checkpoints carry more.
        load: ``load(trainer, path)`` restores one into a rebuilt trainer
            (default ``trainer.load_checkpoint(path, restore_rng=False)``).
        fp32_reference: train the stage's FP32 reference (shadow, canary)
            beside the model; False where ``loss_fn`` cannot train a copy
            (PPO's loss calls its own network) and the caller judges
            precision its own way (`check_policy_canary`).
        sample: ``(batch, loss_fn)``, a batch of the workload, for a measured
            ``auto`` (`genesis_fp16.precision.measure`): measured (or read from the
            host cache) once, before the trainer is built. Without it
            ``auto`` follows the device's flag rule, said in ``decision``.
        decision: a decision made earlier for this agent (a resumed run's,
            from its manifest): reused, never measured again, while the
            request it answered stands (another request decides anew).
        on_rollback: called after each rollback, once the restored weights
            are in place (a learner resets what it derives from them, e.g. a
            target network).

    Attributes:
        trainer: the trainer in use now (a new one after a rollback or a policy change).
        policy: the `EffectivePolicy` it was built from.
        decision: the trainer's `PrecisionDecision` (mode, source, reason).
        rollbacks: the decision of each rollback handled, oldest first.
    """

    def __init__(
        self,
        agent: str,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        scheduler: Any = None,
        settings: Optional[Settings] = None,
        precision: Union[PrecisionRequest, str, None] = None,
        overrides: Optional[dict[str, Any]] = None,
        guard: Union[Guard, GuardChoice] = DEFAULT_GUARD,
        checkpoint_dir: Optional[Union[str, Path]] = None,
        good_name: str = "good.pt",
        checkpoint_every: int = 100,
        save: Optional[SaveFn] = None,
        load: Optional[LoadFn] = None,
        fp32_reference: bool = True,
        sample: Optional[Sample] = None,
        decision: Optional[PrecisionDecision] = None,
        on_rollback: Optional[Callable[[], None]] = None,
    ) -> None:
        if checkpoint_every < 0:
            raise ValueError(
                f"GuardedTraining({agent!r}): checkpoint_every={checkpoint_every}; expected 0 (off) or a positive "
                "step count"
            )
        self.agent = check_agent_name(agent)  # it names the checkpoint directory under the state dir
        self.settings = settings or load_settings()
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.precision: Optional[PrecisionRequest] = None if precision is None else PrecisionRequest.parse(precision)
        """The request asked for by argument (the layers under it: settings and profile; over it: ledger, kill switch).
        """
        self.overrides = overrides
        self.on_rollback = on_rollback
        self.sample = sample
        self.decision: Optional[PrecisionDecision] = decision
        """The precision decision of the trainer in use (`genesis_fp16.precision.decision`); one passed in (a resumed
        run's)
        is reused while the request it answered stands."""
        self.guard: Optional[Guard] = resolve_guard(f"GuardedTraining({agent!r})", agent, guard, self.settings)
        self.checkpoint_every = int(checkpoint_every)
        self.fp32_reference = fp32_reference
        self.checkpoint_dir = (
            Path(checkpoint_dir) if checkpoint_dir is not None else self.settings.state_dir / "checkpoints" / agent
        )
        self.good_path = self.checkpoint_dir / good_name
        self._save = save or (lambda path: self.trainer.save_checkpoint(path))
        self._load = load or _restore_weights
        self.rollbacks: list[Verdict] = []
        """Every rollback decision handled, oldest first."""
        self.shadow: Optional[Reference] = None
        """Stage ``shadow``: the FP32 copy kept for the stage (None in other stages)."""
        self._ledger: Optional[QualityLedger] = self.guard.ledger if self.guard is not None else None
        self._call: Optional[_Call] = None
        self._handled: Optional[Verdict] = None
        self._owned: Optional[Union[str, Path]] = None  # the last good checkpoint last seen to be this run's
        self.last_loss: Optional[torch.Tensor] = None
        """The loss of the last `step` (detached)."""
        self._log = get_logger("genesis_fp16.training.guarded", agent=agent)
        self.trainer: FP16Trainer
        """The trainer in use now (a new one after a rollback or a policy change)."""
        self.policy: EffectivePolicy
        """The effective policy the trainer was built for (settings, profile, ledger)."""
        self.trainer, self.policy = self._build()

    # -- the trainer -------------------------------------------------------------------
    def _build(self) -> tuple[FP16Trainer, EffectivePolicy]:
        built = registry.resolve_trainer(
            self.agent,
            self.model,
            self.optimizer,
            scheduler=self.scheduler,
            settings=self.settings,
            precision=self.precision,
            overrides=self.overrides,
            sample=self.sample,
            decision=self.decision,
        )
        self.decision = built.decision  # a measurement is kept for the rebuilds of the same request
        if self.guard is not None:
            self.guard.attach(built.trainer)
        return built.trainer, built.policy

    def _rebuild(self) -> FP16Trainer:
        self.trainer, self.policy = self._build()
        return self.trainer

    def policy_changed(self) -> bool:
        """Whether settings, profile or ledger now resolve to another trainer
        config or stage than the trainer's (cheap while neither file changed:
        both reads are cached by the file's stat)."""
        now = resolve_policy(self.agent, self.settings, precision=self.precision, overrides=self.overrides)
        return (
            now.precision != self.policy.precision or now.config != self.policy.config or now.stage != self.policy.stage
        )

    @property
    def reduced(self) -> bool:
        """Whether the trainer in use runs in reduced precision (anything but FP32)."""
        return self.trainer.precision.name != "fp32"

    # -- good checkpoints -----------------------------------------------------------------
    def save_good_checkpoint(self) -> Path:
        """Checkpoint the trainer to ``good_path`` now and record it as the last good one.
        Refused while the guard is tripped (that state is not good)."""
        return self.mark_good(self._save(self.good_path))

    def mark_good(self, path: Union[str, Path]) -> Path:
        """Record ``path`` (a checkpoint of the current weights) as the last good one.
        Refused while the guard is tripped; nothing to record unguarded."""
        if self.guard is not None and self.guard.tripped is not None and self.guard.tripped is not self._handled:
            raise RuntimeError(
                f"GuardedTraining({self.agent!r}): the guard is tripped ({self.guard.tripped.reason}); "
                "a good checkpoint cannot be recorded until the rollback is handled (step() or check() do it)"
            )
        if self.guard is not None:
            self.guard.record_good_checkpoint(path)
        return Path(path)

    def _owns(self, path: Union[str, Path, None]) -> bool:
        return path is not None and Path(path).resolve().parent == self.checkpoint_dir.resolve()

    def _ensure_good_checkpoint(self) -> None:
        """Before reduced-precision steps: a good checkpoint of this run's own
        (the ledger keeps one per agent across runs: a rollback must never load
        weights another run trained). FP32 has nothing to roll back."""
        if self.guard is None or not self.reduced:
            return
        last = self.guard.last_good_checkpoint
        if last is not None and (last == self._owned or self._owns(last)):
            self._owned = last
            return
        self.save_good_checkpoint()

    # -- one training call ------------------------------------------------------------------
    def _canary_due(self) -> bool:
        """Count one guarded reduced-precision call outside stage ``shadow``
        (which has its FP32 copy all along): stage ``on``, or reduced precision
        from the settings or a profile before the ledger has a stage for the
        agent. Whether it is the ``guard.canary_every``-th: the count lives in
        the rollout ledger (`RollbackGuard.canary_due`), so the schedule goes
        on in the next process (each `genesis-fp16 evolve` is one)."""
        if self.guard is None or not self.reduced or self.policy.stage == Stage.SHADOW:
            return False
        return self.guard.canary_due()

    def begin_call(self, prepare: Optional[Callable[[torch.nn.Module], None]] = None) -> CallReport:
        """Start a training call: rebuild the trainer when the policy changed
        (else clear the guard's judgement of the last call), write a good
        checkpoint of this run's own if there is none, and set up this call's
        FP32 reference (stage ``shadow``: the stage's copy; stage ``on``: a fresh
        canary when one is due). ``prepare(model)`` fits per-call state the
        model holds (e.g. a normaliser); it is applied to the model, then to the
        reference, and again after a rollback restored the model. Returns the
        call's report, filled in by the steps and `finish_call`."""
        if self.policy_changed():
            self._rebuild()
            self.shadow = None  # one copy per stage
        elif self.guard is not None:
            self.guard.reset()
        self._ensure_good_checkpoint()
        report = CallReport(precision=self.trainer.precision.name, precision_decision=self.decision)
        self._call = _Call(skipped_from=self.trainer.skipped_steps, report=report, prepare=prepare)
        if prepare is not None:
            prepare(self.model)
        self._set_up_reference(self._call)
        return report

    def _set_up_reference(self, call: _Call) -> None:
        report = call.report
        report.precision = self.trainer.precision.name
        report.canary_due = self._canary_due()
        reference = self._reference(report.canary_due)
        if reference is not None and call.prepare is not None and reference.kind == "shadow":
            call.prepare(reference.model)
        call.reference = reference
        report.reference = reference.kind if reference is not None else None

    def _reference(self, canary: bool) -> Optional[Reference]:
        stage = self.policy.stage
        if not self.fp32_reference:
            return None
        if stage == "shadow" and self.reduced:
            if self.shadow is None:
                self.shadow = Reference(
                    "shadow", *fp32_reference(self.model, self.optimizer, self.trainer, f"{self.agent}{SHADOW_SUFFIX}")
                )
            return self.shadow
        if stage == "on" and canary:
            return Reference(
                "canary", *fp32_reference(self.model, self.optimizer, self.trainer, f"{self.agent}{CANARY_SUFFIX}")
            )
        return None

    def step(self, batch: Any, loss_fn: LossFn) -> bool:
        """One micro-step: ``loss_fn(model, batch)`` under autocast, backward,
        and the optimizer step on the last micro-step; the call's FP32
        reference takes the same batch. The loss is kept in ``last_loss``. Returns False when the step was
        skipped. A P0 trip is rolled back before this returns; later steps
        train the restored weights (in FP32) and count."""
        self._ensure_good_checkpoint()
        trainer = self.trainer
        before = trainer.training_steps
        loss = trainer.training_step(batch, loss_fn)
        stepped = trainer.backward_and_step(loss)
        self.last_loss = loss.detach()
        reference = self._call.reference if self._call is not None else None
        if reference is not None:
            reference.trainer.backward_and_step(reference.trainer.training_step(batch, loss_fn))
        if (
            not self._handle_trip()
            and stepped
            and trainer.training_steps > before
            and self.checkpoint_every
            and trainer.training_steps % self.checkpoint_every == 0
            and self.guard is not None
        ):
            self.save_good_checkpoint()
        return stepped

    def _handle_trip(self) -> bool:
        """Roll back a P0 trip not handled yet; the restored weights train on this call's data (its ``prepare``),
        with no reference (FP32 now). True when it rolled back."""
        trip = self.guard.tripped if self.guard is not None else None
        if trip is None or trip is self._handled:
            return False
        self._roll_back(trip)
        if self._call is not None:
            if self._call.prepare is not None:
                self._call.prepare(self.model)
            self._call.reference = None
        self._tell_rollback()
        return True

    def _tell_rollback(self) -> None:
        if self.on_rollback is not None:
            self.on_rollback()

    def train(self, batches: Iterable[Any], loss_fn: LossFn) -> int:
        """`step` over ``batches``; returns how many steps were not skipped."""
        return sum(bool(self.step(batch, loss_fn)) for batch in batches)

    def train_windows(
        self,
        batches: Iterable[Any],
        loss_fn: LossFn,
        *,
        window: int = WINDOW_STEPS,
        after_step: Optional[StepHook] = None,
    ) -> WindowResult:
        """`step` over ``batches`` in windows of ``window`` steps with nothing
        read back to the host inside one (`FP16Trainer.train_window`): the
        guard judges each window's steps at its end (the events are those of
        the per-step path, step by step), so a P0 storm is rolled back within
        the window it started in, and the windows after it train the restored
        weights in FP32 (``on_rollback`` is called then). The call's FP32
        reference trains each window's batches. Returns every step's loss and
        whether it was taken, over all windows."""
        if window < 1:
            raise ValueError(f"GuardedTraining.train_windows: window={window}; expected a positive number of steps")
        it, out = iter(batches), WindowResult()
        while True:
            self._ensure_good_checkpoint()
            taken: list[Any] = []

            def feed() -> Iterator[Any]:
                for batch in itertools.islice(it, window):
                    taken.append(batch)
                    yield batch

            trainer = self.trainer
            before = trainer.training_steps
            result = trainer.train_window(feed(), loss_fn, after_step)
            if not taken:
                return out
            out.steps, out.skipped, out.eager = (
                out.steps + result.steps,
                out.skipped + result.skipped,
                out.eager or result.eager,
            )
            out.losses += result.losses
            out.stepped += result.stepped
            if result.losses:
                self.last_loss = torch.tensor(result.losses[-1])
            reference = self._call.reference if self._call is not None else None
            if reference is not None:
                reference.trainer.train_window(taken, loss_fn)
            if (
                not self._handle_trip()
                and self.checkpoint_every
                and self.guard is not None
                and trainer.training_steps // self.checkpoint_every > before // self.checkpoint_every
            ):
                self.save_good_checkpoint()

    def finish_call(self, val_fn: Optional[ValFn] = None) -> CallReport:
        """End the call: the validation losses (``val_fn`` on the model and on
        the reference), the shadow gap recorded in the ledger, the guard's
        judgement (``reference="canary"`` for a canary), a rollback handled as
        in `step`, and the validation loss measured again on the restored weights."""
        call = (
            self._call
            if self._call is not None
            else _Call(self.trainer.skipped_steps, CallReport(self.trainer.precision.name))
        )
        report = call.report
        if val_fn is not None:
            report.val_loss = val_fn(self.model, self.trainer)
        reference = call.reference
        if val_fn is not None and reference is not None and report.val_loss is not None:
            report.fp32_val_loss = val_fn(reference.model, reference.trainer)
            report.gap = (
                (report.val_loss - report.fp32_val_loss) / report.fp32_val_loss if report.fp32_val_loss > 0 else None
            )
            if reference.kind == "shadow":  # a canary's outcome the guard records itself
                self.ledger.record_shadow_gap(
                    self.agent, report.val_loss, report.fp32_val_loss, self.trainer.precision.name
                )
        else:
            report.reference = None
        if self.guard is not None:
            report.decision = self.guard.check(
                self.trainer,
                val_loss=report.val_loss,
                fp32_val_loss=report.fp32_val_loss,
                reference=report.reference or "shadow",
            )
            if report.decision.action == "rollback" and not report.rolled_back:
                self._roll_back(report.decision)
                if val_fn is not None:
                    report.val_loss = val_fn(self.model, self.trainer)  # the restored weights'
                self._tell_rollback()
        report.precision = self.trainer.precision.name
        report.precision_decision = self.decision
        report.skipped_steps = call.skipped_before + self.trainer.skipped_steps - call.skipped_from
        self._call = None
        record_training(self.ledger, self.agent, report, self._log)
        return report

    def run(self, batches: Iterable[Any], loss_fn: LossFn, val_fn: Optional[ValFn] = None) -> CallReport:
        """One training call over ``batches``: `begin_call`, `step` each, `finish_call(val_fn)`."""
        self.begin_call()
        for batch in batches:
            self.step(batch, loss_fn)
        return self.finish_call(val_fn)

    @property
    def ledger(self) -> QualityLedger:
        """The guard's ledger, or the settings' when unguarded."""
        if self._ledger is None:
            self._ledger = RolloutLedger.from_settings(self.settings)
        return self._ledger

    # -- judging and rolling back --------------------------------------------------------------
    def check(self, **kwargs: Any) -> Verdict:
        """``guard.check(trainer, **kwargs)`` (P1/P2: ``val_loss``,
        ``fp32_val_loss``, ``throughput_ratio``, ``reference``); a rollback is
        handled as in `step` before this returns."""
        return self._judged(self._require_guard("check").check(self.trainer, **kwargs))

    def check_policy_canary(self, **gap: float) -> Verdict:
        """``guard.check_policy_canary(trainer, kl=..., max_logp_delta=...,
        max_value_delta=...)`` (a policy's canary on a held batch); a confirmed
        alarm is rolled back as in `step`."""
        return self._judged(self._require_guard("check_policy_canary").check_policy_canary(self.trainer, **gap))

    def _judged(self, decision: Verdict) -> Verdict:
        if decision.action == "rollback":
            self._roll_back(decision)
            self._tell_rollback()
        return decision

    def _require_guard(self, what: str) -> Guard:
        if self.guard is None:
            raise RuntimeError(
                f"GuardedTraining({self.agent!r}).{what}: trained with guard=UNGUARDED; there is no guard to judge"
            )
        return self.guard

    def _roll_back(self, decision: Verdict) -> None:
        """Through ``guard.recover``: a new trainer (the ledger says
        rolled_back: FP32), the last good checkpoint restored into it in the
        dtype that trainer needs, the trip cleared."""
        guard = self._require_guard("rollback")
        self._handled = guard.tripped
        if guard.last_good_checkpoint is None:
            raise RuntimeError(
                f"GuardedTraining({self.agent!r}): rolled back ({decision.reason}) but no good checkpoint is recorded; "
                "call save_good_checkpoint() after a healthy run"
            )
        call = self._call
        if call is not None:
            call.skipped_before += self.trainer.skipped_steps - call.skipped_from
        self.trainer, restored = guard.recover(self._rebuild, self._load)
        self.shadow = None
        self.rollbacks.append(decision)
        reason = decision.summary
        precision = self.trainer.precision.name
        if call is not None:
            call.skipped_from = self.trainer.skipped_steps
            report = call.report
            if report.rollback is None:
                report.rollback = decision
                report.restored = str(restored) if restored is not None else None
            if restored is not None:
                report.events.append(f"restored {restored}")
            report.events.append(f"rolled back to {precision}: {reason}")
        self._log.warning(
            "guarded.restored",
            severity=decision.severity,
            reason=decision.reason,
            checkpoint=str(restored) if restored is not None else None,
            precision=precision,
            step=self.trainer.training_steps,
        )

"""The rollback guard: reads a trainer's events and statistics and acts.

| severity | trigger | action |
|---|---|---|
| P0 | ``trainer.nonfinite_streak``, or more than ``failed_fraction`` of the steps skipped | roll back now; restore the
last good checkpoint |
| P1 | overflow rate over ``overflow_rollback``, or a confirmed validation-loss gap to the FP32 reference (shadow or
canary) | roll back |
| P2 | overflow rate over ``overflow_warn``, or throughput under ``throughput_ratio`` x FP32 | warn and record a
recommendation |

The rules are pure functions in `genesis_fp16.rollout.judge`; this module gathers
their inputs (a trainer's statistics, the ledger's confirmation windows) and
acts: ledger writes, events, the trip.

P0 is caught as it happens, from the trainer's events (`attach`):
`tripped` is set and the ledger says ``rolled_back`` before the next
step. P1 and P2 need a whole run's statistics and are judged by `check`
(PPO's policy canary: `check_policy_canary`). In stage ``on``,
`RollbackGuard.canary_due` says which training calls get an FP32 canary.
A rollback writes the ledger, so the next trainer built by
``registry.trainer_for`` is FP32, also in a new process. An FP32 trainer has
nothing to roll back: its decisions are ``warn``.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from genesis_fp16.rollout.canary import canary_due as _canary_schedule
from genesis_fp16.rollout.judge import Action, Finding, Reference, judge, judge_policy_canary, verdict_of
from genesis_fp16.rollout.judge import Verdict as GuardDecision
from genesis_fp16.rollout.profiles import THRESHOLD_DEFAULTS, GuardThresholds, guard_thresholds
from genesis_fp16.rollout.ledger import RolloutLedger, Severity, Stage
from genesis_fp16.base.settings import Settings, load_settings
from genesis_fp16.base.telemetry import get_logger

if TYPE_CHECKING:
    from genesis_fp16.training.trainer import FP16Trainer

__all__ = ["ACTIONS", "Action", "GuardDecision", "Reference", "RollbackGuard", "Severity", "Stage"]

ACTIONS = tuple(a.value for a in Action)
# GuardDecision is `genesis_fp16.rollout.judge.Verdict`: the rule's verdict is the decision, logged and acted on as it
# is.


class RollbackGuard:
    """Watches one agent's trainers and acts on what `genesis_fp16.rollout.judge`
    finds. Thresholds come from the agent's profile (see
    `genesis_fp16.rollout.profiles.GuardThresholds`), then ``thresholds`` (a
    `GuardThresholds` or a dict of some of its keys).

    The confirmation windows of the FP32 references and the canary's call
    count live in the ledger, so a confirmation begun in one process is
    completed in the next."""

    def __init__(
        self,
        agent: str,
        settings: Optional[Settings] = None,
        ledger: Optional[RolloutLedger] = None,
        thresholds: Union[GuardThresholds, dict[str, Any], None] = None,
    ) -> None:
        self.agent = agent
        self.settings = settings or load_settings()
        self.ledger = ledger or RolloutLedger.from_settings(self.settings)
        if isinstance(thresholds, GuardThresholds):
            self.thresholds: GuardThresholds = thresholds
        else:
            unknown = set(thresholds or {}) - set(THRESHOLD_DEFAULTS)
            if unknown:
                raise ValueError(
                    f"RollbackGuard({agent!r}): unknown threshold(s) {', '.join(sorted(unknown))}; "
                    f"allowed are {', '.join(THRESHOLD_DEFAULTS)}"
                )
            self.thresholds = guard_thresholds(agent, self.settings, thresholds)
        self.tripped: Optional[GuardDecision] = None
        self.decisions: list[GuardDecision] = []
        self.trainer: Optional[FP16Trainer] = None
        self._tripped_trainer: Optional[FP16Trainer] = None
        self._rolled_back: Optional[tuple[FP16Trainer, GuardDecision]] = (
            None  # (trainer, decision) of the last rollback
        )
        self._last_good: Optional[Path] = None
        self._since: Optional[tuple[int, int, int]] = None
        """(training, skipped, overflow) steps of the trainer when the last rollback restored it: its failure and
        overflow rates count from there, so a storm rolled back is not judged again on the healthy calls after it."""
        self._lock = threading.Lock()
        self._log = get_logger("genesis_fp16.rollout.guard", agent=agent)

    # -- checkpoints -------------------------------------------------------------
    def record_good_checkpoint(self, path: Union[str, Path]) -> None:
        """Remember ``path`` as the last checkpoint written by a healthy run
        (kept in the ledger too, so a new process knows it)."""
        path = Path(path)
        self._last_good = path
        self.ledger.set_last_good_checkpoint(self.agent, path)
        self._log.info("guard.good_checkpoint", path=str(path))

    @property
    def last_good_checkpoint(self) -> Optional[Path]:
        """The last good checkpoint recorded, here or (from the ledger) by an earlier process; None if none."""
        if self._last_good is None:
            self._last_good = self.ledger.last_good_checkpoint(self.agent)
        return self._last_good

    # -- live events (P0) -----------------------------------------------------------
    def recover(
        self, build: Callable[[], FP16Trainer], load: Optional[Callable[[FP16Trainer, Path], None]] = None
    ) -> tuple[FP16Trainer, Optional[Path]]:
        """After a rollback: a new trainer from ``build`` (the ledger now says
        rolled_back, so the registry gives FP32), the last good checkpoint
        restored into it (``load``, default ``trainer.load_checkpoint``), the
        trip forgotten and this guard watching the new trainer. Returns the
        trainer and the checkpoint restored (None when there is none)."""
        checkpoint = self.last_good_checkpoint
        trainer = build()
        restored = Path(checkpoint) if checkpoint is not None and Path(checkpoint).exists() else None
        if restored is not None:
            if load is None:
                trainer.load_checkpoint(restored)
            else:
                load(trainer, restored)
        self.reset()
        if self.trainer is not trainer:
            self.attach(trainer)
        self._since = (trainer.training_steps, trainer.skipped_steps, trainer.overflow_steps)  # a new window from here
        return trainer, restored

    def attach(self, trainer: FP16Trainer) -> None:
        """Listen to ``trainer``'s events. Events from a trainer attached
        earlier are ignored once another one is attached."""
        self.trainer, self._since = trainer, None
        trainer.add_listener(lambda event, fields, t=trainer: self._on_event(t, event, fields))
        self._log.debug("guard.attached", trainer=trainer.name, precision=trainer.precision.name)

    def _on_event(self, trainer: FP16Trainer, event: str, fields: dict[str, Any]) -> None:
        if trainer is not self.trainer or self.tripped is not None:
            return
        if event == "trainer.nonfinite_streak":
            self._trip(
                trainer,
                f"non-finite loss streak of {fields.get('streak')} steps at step {fields.get('step')}",
                {"streak": fields.get("streak"), "step": fields.get("step")},
            )
        elif event == "trainer.step_skipped":
            steps, failed, _ = self._window(trainer)
            limit = self.thresholds.failed_fraction
            if steps >= self.thresholds.min_steps and failed / steps > limit:
                self._trip(
                    trainer,
                    f"{failed} of {steps} steps failed ({failed / steps:.0%} > {limit:.0%})",
                    {"failed_steps": failed, "training_steps": steps},
                )

    def _window(self, trainer: FP16Trainer) -> tuple[int, int, int]:
        """(training, skipped, overflow) steps of ``trainer`` since the last rollback restored it (else all of them)."""
        counts = (trainer.training_steps, trainer.skipped_steps, trainer.overflow_steps)
        if self._since is None or trainer is not self.trainer:
            return counts
        return (counts[0] - self._since[0], counts[1] - self._since[1], counts[2] - self._since[2])

    def _trip(self, trainer: FP16Trainer, reason: str, metrics: dict[str, Any]) -> None:
        with self._lock:
            if self.tripped is not None:
                return
            metrics = dict(metrics, precision=trainer.precision.name)
            decision = self._act(verdict_of((Finding(Severity.P0, reason, True),), metrics))
            if decision.action == Action.ROLLBACK:
                self.tripped = decision
                self._tripped_trainer = trainer

    # -- FP32 references: the canary's schedule and the confirmation windows -----------
    @property
    def canary_every(self) -> int:
        """Stage ``on``: compare with an FP32 canary every Nth training call (0: never)."""
        return self.thresholds.canary_every

    def canary_due(self) -> bool:
        """Count one reduced-precision training call in stage ``on`` (in the
        ledger, so the count goes on in the next process) and say whether it
        gets an FP32 canary: every ``canary_every``-th call since the agent's
        last stage change (`genesis_fp16.rollout.canary.canary_due`). Call it once
        per such training call, before training."""
        return _canary_schedule(self.ledger.count_canary_call(self.agent), self.canary_every)

    def _window_kind(self, reference: Reference) -> str:
        # the val-loss canary and PPO's policy canary share one window: both are stage on's canary
        return "shadow" if reference == Reference.SHADOW else "canary"

    def _record_canary(self, verdict: GuardDecision, metrics: dict[str, Any]) -> None:
        """Log and record (quality_checks) one canary's outcome."""
        check = verdict.check
        assert check is not None
        level = "warning" if check.alarm else "info"
        getattr(self._log, level)(
            "guard.canary",
            alarm=check.alarm,
            alarms=check.alarms,
            window=len(check.window),
            confirm=self.thresholds.canary_confirm,
            confirmed=check.confirmed,
            **metrics,
        )
        kind = "policy_canary" if metrics.get("kind") == "policy" else "canary"
        numbers = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self.ledger.record_quality_check(
            self.agent,
            kind,
            dict(numbers, alarms=check.alarms, confirmed=check.confirmed),
            precision=metrics.get("precision"),
            alarm=check.alarm,
        )

    def _push(self, reference: Reference, verdict: GuardDecision) -> None:
        """Keep this check's outcome in the ledger's window for the next check (in this process or another)."""
        if verdict.check is not None:
            self.ledger.push_guard_outcome(
                self.agent, self._window_kind(reference), verdict.check.alarm, self.thresholds.canary_window
            )

    def check_policy_canary(
        self, trainer: Optional[FP16Trainer] = None, *, kl: float, max_logp_delta: float, max_value_delta: float
    ) -> GuardDecision:
        """A policy canary (PPO): the held batch's log-probabilities and values
        in reduced precision against FP32. An alarm is ``kl`` over ``canary_kl``,
        ``max_logp_delta`` over ``canary_logp_delta`` or ``max_value_delta``
        (relative: over max(1, max |FP32 value|)) over ``canary_value_delta``; a
        confirmed alarm is P1 (rollback)."""
        trainer = trainer if trainer is not None else self.trainer
        values = {"kl": float(kl), "max_logp_delta": float(max_logp_delta), "max_value_delta": float(max_value_delta)}
        window = self.ledger.guard_window(self.agent, self._window_kind(Reference.CANARY))
        precision = trainer.precision.name if trainer is not None else None
        verdict = judge_policy_canary(values, self.thresholds, window, precision)
        self._push(Reference.CANARY, verdict)
        self._record_canary(verdict, verdict.metrics)
        if not verdict.findings:
            self.decisions.append(verdict)
            return verdict
        return self._act(verdict)

    # -- whole-run statistics (P1, P2) ------------------------------------------------
    def check(
        self,
        trainer: Optional[FP16Trainer] = None,
        *,
        val_loss: Optional[float] = None,
        fp32_val_loss: Optional[float] = None,
        throughput_ratio: Optional[float] = None,
        reference: Union[Reference, str] = Reference.SHADOW,
    ) -> GuardDecision:
        """Judge ``trainer``'s statistics (default: the attached one) and the
        given validation losses / throughput ratio (`genesis_fp16.rollout.judge.judge`);
        act on the most severe finding. ``reference`` says where
        ``fp32_val_loss`` comes from: ``shadow`` (an FP32 copy trained beside
        it all along) or ``canary`` (stage on); either way a gap rolls back
        once confirmed over that reference's window, kept in the ledger."""
        if reference not in (Reference.SHADOW, Reference.CANARY):
            raise ValueError(f"RollbackGuard.check: reference={reference!r}; expected 'shadow' or 'canary'")
        reference = Reference(reference)
        trainer = trainer if trainer is not None else self.trainer
        if self.tripped is not None and trainer is self._tripped_trainer:
            return self.tripped  # already acted on; judging it again would roll back twice
        if self._rolled_back is not None and trainer is self._rolled_back[0]:
            return self._rolled_back[1]  # a P1 rollback of this trainer: the same, once
        stats: dict[str, Any] = {}
        if trainer is not None:
            steps, failed, overflow = self._window(trainer)
            stats = dict(
                trainer.get_stats(),
                init_scale=trainer.config.init_scale,
                growth_interval=trainer.config.growth_interval,
                training_steps=steps,
                failed_step_rate=failed / steps if steps else 0.0,
                overflow_rate=overflow / steps if steps else 0.0,
            )
        window = self.ledger.guard_window(self.agent, self._window_kind(reference))
        verdict = judge(
            stats,
            self.thresholds,
            val_loss=val_loss,
            fp32_val_loss=fp32_val_loss,
            throughput_ratio=throughput_ratio,
            reference=reference,
            window=window,
        )
        self._push(reference, verdict)
        if reference == Reference.CANARY and verdict.check is not None:
            canary = {k: verdict.metrics.get(k) for k in ("val_loss", "fp32_val_loss", "val_loss_ratio", "precision")}
            self._record_canary(verdict, dict(canary, kind="val_loss"))
        if not verdict.findings:
            self.decisions.append(verdict)
            self._log.info(
                "guard.decision", severity=None, action=Action.NONE.value, reason="healthy", **verdict.metrics
            )
            return verdict
        decision = self._act(verdict)
        if decision.severity == Severity.P0 and decision.action == Action.ROLLBACK:
            self.tripped = decision
            self._tripped_trainer = trainer
        if decision.action == Action.ROLLBACK and trainer is not None:
            self._rolled_back = (trainer, decision)
        return decision

    # -- acting -------------------------------------------------------------------------
    def _act(self, decision: GuardDecision) -> GuardDecision:
        """Act on a verdict with findings (`genesis_fp16.rollout.judge.verdict_of`):
        log it, and on a rollback write the ledger (which also clears the
        agent's windows: the next trainer starts new ones); record a recommendation."""
        severity, action, reason, recommendation = (
            decision.severity,
            decision.action,
            decision.reason,
            decision.recommendation,
        )
        assert severity is not None
        metrics, precision = decision.metrics, decision.metrics.get("precision")
        self.decisions.append(decision)
        level = "error" if action == Action.ROLLBACK else "warning"
        getattr(self._log, level)(
            "guard.decision",
            severity=severity.value,
            action=action.value,
            reason=reason,
            restore_checkpoint=decision.restore_checkpoint,
            **{k: v for k, v in metrics.items() if k not in ("severity", "action", "reason")},
        )
        if action == Action.ROLLBACK:
            entry = self.ledger.rollback(self.agent, decision.summary, actor="guard", severity=severity)
            self._log.error(
                "guard.rollback",
                severity=severity.value,
                reason=reason,
                from_stage=None if entry["from_stage"] is None else entry["from_stage"].value,
                precision=precision,
                restore_checkpoint=decision.restore_checkpoint,
                last_good_checkpoint=str(self.last_good_checkpoint) if self.last_good_checkpoint else None,
            )
        if recommendation is not None:
            self.ledger.record_recommendation(
                self.agent, recommendation["changes"], recommendation["reason"], severity.value
            )
            self._log.warning(
                "guard.recommendation",
                severity=severity.value,
                changes=recommendation["changes"],
                reason=recommendation["reason"],
                precision=precision,
            )
        return decision

    def reset(self) -> None:
        """Forget the trip and decisions (the next training run); keeps the
        last good checkpoint and the confirmation windows (a rollback clears those)."""
        with self._lock:
            self.tripped = None
            self._tripped_trainer = None
            self._rolled_back = None
            self.decisions = []

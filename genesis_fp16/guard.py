"""The rollback guard: reads a trainer's events and statistics and acts.

| severity | trigger | action |
|---|---|---|
| P0 | ``trainer.nonfinite_streak``, or more than ``failed_fraction`` of the steps skipped | roll back now; restore the last good checkpoint |
| P1 | overflow rate over ``overflow_rollback``, or val loss over ``val_loss_ratio`` x the FP32 shadow (``canary_val_loss_ratio`` x the canary) | roll back |
| P2 | overflow rate over ``overflow_warn``, or throughput under ``throughput_ratio`` x FP32 | warn and record a recommendation |

In stage ``on`` the FP32 reference is a canary (every ``canary_every``-th
training call): its gap rolls back only when ``canary_confirm`` of the last
``canary_window`` canaries alarmed (``check(..., reference="canary")``;
PPO's policy canary: `check_policy_canary`).

P0 is caught as it happens, from the trainer's events (`attach`):
`tripped` is set and the ledger says ``rolled_back`` before the next
step. P1 and P2 need a whole run's statistics and are judged by `check`.
A rollback writes the ledger, so the next trainer built by
``registry.trainer_for`` is FP32, also in a new process. An FP32 trainer has
nothing to roll back: its decisions are ``warn``.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from .profiles import THRESHOLD_DEFAULTS, thresholds_for
from .rollout import RolloutLedger
from .settings import Settings, load_settings
from .telemetry import get_logger

if TYPE_CHECKING:
    from .trainer import FP16Trainer

ACTIONS = ("none", "warn", "rollback")


@dataclass
class GuardDecision:
    """What the guard decided. ``severity`` None means healthy."""

    severity: Optional[str] = None
    """`P0` (roll back now), `P1` (roll back) or `P2` (warn); None when healthy."""
    action: str = "none"
    """`none`, `warn` or `rollback`."""
    reason: str = ""
    """What was measured against which threshold, in words."""
    restore_checkpoint: bool = False
    """Whether the rollback restores the last good checkpoint."""
    recommendation: Optional[dict[str, Any]] = None
    """A proposed profile change (P2), as `genesis-fp16 tune` shows it."""
    metrics: dict[str, Any] = field(default_factory=dict)
    """The measurements the decision rests on (overflow rate, loss ratio, ...)."""

    def as_dict(self) -> dict[str, Any]:
        """The fields as a plain dictionary (for JSON and event logs)."""
        return asdict(self)


def _finite(value: Any) -> Optional[float]:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


class RollbackGuard:
    """Watches one agent's trainers. Thresholds come from the agent's profile
    (see `genesis_fp16.profiles.THRESHOLD_DEFAULTS`) unless given."""

    def __init__(
        self,
        agent: str,
        settings: Optional[Settings] = None,
        ledger: Optional[RolloutLedger] = None,
        thresholds: Optional[dict[str, Any]] = None,
    ) -> None:
        self.agent = agent
        self.settings = settings or load_settings()
        self.ledger = ledger or RolloutLedger.from_settings(self.settings)
        base = thresholds_for(agent, self.settings)
        unknown = set(thresholds or {}) - set(THRESHOLD_DEFAULTS)
        if unknown:
            raise ValueError(
                f"RollbackGuard({agent!r}): unknown threshold(s) {', '.join(sorted(unknown))}; "
                f"allowed are {', '.join(THRESHOLD_DEFAULTS)}"
            )
        self.thresholds: dict[str, Any] = {**base, **(thresholds or {})}
        self.tripped: Optional[GuardDecision] = None
        self.decisions: list[GuardDecision] = []
        self.trainer: Optional[FP16Trainer] = None
        self._tripped_trainer: Optional[FP16Trainer] = None
        self._rolled_back: Optional[tuple[FP16Trainer, GuardDecision]] = None  # (trainer, decision) of the last rollback
        self._last_good: Optional[Path] = None
        # the last canary_window canary outcomes (True: an alarm); kept across runs, cleared by a rollback
        self._canaries: deque[bool] = deque(maxlen=int(self.thresholds["canary_window"]))
        self._lock = threading.Lock()
        self._log = get_logger("genesis_fp16.guard", agent=agent)

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
        return trainer, restored

    def attach(self, trainer: FP16Trainer) -> None:
        """Listen to ``trainer``'s events. Events from a trainer attached
        earlier are ignored once another one is attached."""
        self.trainer = trainer
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
            steps = trainer.training_steps
            failed = trainer.skipped_steps
            limit = self.thresholds["failed_fraction"]
            if steps >= self.thresholds["min_steps"] and failed / steps > limit:
                self._trip(
                    trainer,
                    f"{failed} of {steps} steps failed ({failed / steps:.0%} > {limit:.0%})",
                    {"failed_steps": failed, "training_steps": steps},
                )

    def _trip(self, trainer: FP16Trainer, reason: str, metrics: dict[str, Any]) -> None:
        with self._lock:
            if self.tripped is not None:
                return
            decision = self._decide(trainer, "P0", reason, metrics, restore=True)
            if decision.action == "rollback":
                self.tripped = decision
                self._tripped_trainer = trainer

    # -- canaries (stage on) --------------------------------------------------------------
    @property
    def canary_every(self) -> int:
        """Stage ``on``: compare with an FP32 canary every Nth training call (0: never)."""
        return int(self.thresholds["canary_every"])

    def _canary(self, alarm: bool, metrics: dict[str, Any]) -> bool:
        """Record one canary outcome; True when this one alarmed and so did
        ``canary_confirm`` of the last ``canary_window`` (a confirmed gap, not
        one noisy sample)."""
        with self._lock:
            self._canaries.append(bool(alarm))
            alarms = sum(self._canaries)
        confirmed = bool(alarm) and alarms >= int(self.thresholds["canary_confirm"])
        level = "warning" if alarm else "info"
        getattr(self._log, level)(
            "guard.canary", alarm=bool(alarm), alarms=alarms, window=len(self._canaries),
            confirm=int(self.thresholds["canary_confirm"]), confirmed=confirmed, **metrics,
        )
        kind = "policy_canary" if metrics.get("kind") == "policy" else "canary"
        numbers = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self.ledger.record_quality_check(
            self.agent, kind, dict(numbers, alarms=alarms, confirmed=confirmed), precision=metrics.get("precision"), alarm=bool(alarm)
        )
        return confirmed

    def check_policy_canary(
        self, trainer: Optional[FP16Trainer] = None, *, kl: float, max_logp_delta: float, max_value_delta: float
    ) -> GuardDecision:
        """A policy canary (PPO): the held batch's log-probabilities and values
        in reduced precision against FP32. An alarm is ``kl`` over ``canary_kl``,
        ``max_logp_delta`` over ``canary_logp_delta`` or ``max_value_delta``
        (relative: over max(1, max |FP32 value|)) over ``canary_value_delta``; a
        confirmed alarm is P1 (rollback)."""
        trainer = trainer if trainer is not None else self.trainer
        th = self.thresholds
        values = {"kl": float(kl), "max_logp_delta": float(max_logp_delta), "max_value_delta": float(max_value_delta)}
        limits = {"kl": th["canary_kl"], "max_logp_delta": th["canary_logp_delta"], "max_value_delta": th["canary_value_delta"]}
        over = [k for k, v in values.items() if not (math.isfinite(v) and v <= limits[k])]
        precision = trainer.precision.name if trainer is not None else None
        metrics: dict[str, Any] = {**values, "precision": precision, "kind": "policy"}
        if not self._canary(bool(over), metrics):
            decision = GuardDecision(None, "none", "healthy", False, None, metrics)
            self.decisions.append(decision)
            return decision
        reason = "policy canary: " + ", ".join(f"{k} {values[k]:.3g} (> {limits[k]:g})" for k in over)
        decision = self._decide(trainer, "P1", f"{reason}, confirmed", metrics, restore=True)
        if decision.action == "rollback":
            self._canaries.clear()
        return decision

    # -- whole-run statistics (P1, P2) ------------------------------------------------
    def check(
        self,
        trainer: Optional[FP16Trainer] = None,
        *,
        val_loss: Optional[float] = None,
        fp32_val_loss: Optional[float] = None,
        throughput_ratio: Optional[float] = None,
        reference: str = "shadow",
    ) -> GuardDecision:
        """Judge ``trainer``'s statistics (default: the attached one) and the
        given validation losses / throughput ratio; act on the most severe finding.
        ``reference`` says where ``fp32_val_loss`` comes from: ``shadow`` (an FP32
        copy trained beside it all along: one gap over ``val_loss_ratio`` rolls
        back) or ``canary`` (stage on: a gap over ``canary_val_loss_ratio`` rolls back only when confirmed,
        see `_canary`)."""
        if reference not in ("shadow", "canary"):
            raise ValueError(f"RollbackGuard.check: reference={reference!r}; expected 'shadow' or 'canary'")
        trainer = trainer if trainer is not None else self.trainer
        stats = trainer.get_stats() if trainer is not None else {}
        th = self.thresholds
        steps = int(stats.get("training_steps", 0))
        overflow = float(stats.get("overflow_rate", 0.0))
        failed = float(stats.get("failed_step_rate", 0.0))
        metrics: dict[str, Any] = {
            "training_steps": steps,
            "overflow_rate": overflow,
            "failed_step_rate": failed,
            "current_scale": stats.get("current_scale"),
            "precision": stats.get("precision"),
        }
        val, ref = _finite(val_loss), _finite(fp32_val_loss)
        ratio = None
        if val_loss is not None and fp32_val_loss is not None:
            metrics.update(val_loss=val_loss, fp32_val_loss=fp32_val_loss)
            if ref is not None and ref > 0:
                ratio = (val / ref) if val is not None else math.inf
                metrics["val_loss_ratio"] = ratio if math.isfinite(ratio) else None
        if throughput_ratio is not None:
            metrics["throughput_ratio"] = float(throughput_ratio)
        judged = steps >= th["min_steps"]

        findings: list[tuple[str, str, bool, Optional[dict[str, Any]]]] = []
        if self.tripped is not None and trainer is self._tripped_trainer:
            return self.tripped  # already acted on; judging it again would roll back twice
        if self._rolled_back is not None and trainer is self._rolled_back[0]:
            return self._rolled_back[1]  # a P1 rollback of this trainer: the same, once
        if judged and failed > th["failed_fraction"]:
            findings.append(("P0", f"{failed:.0%} of {steps} steps failed (> {th['failed_fraction']:.0%})", True, None))
        if judged and overflow > th["overflow_rollback"]:
            findings.append(("P1", f"overflow rate {overflow:.0%} over {steps} steps (> {th['overflow_rollback']:.0%})", False, None))
        limit = th["canary_val_loss_ratio"] if reference == "canary" else th["val_loss_ratio"]
        gap = ratio is not None and ratio > limit
        if reference == "canary" and ratio is not None:
            canary_metrics = {k: metrics.get(k) for k in ("val_loss", "fp32_val_loss", "val_loss_ratio", "precision")}
            confirmed = self._canary(gap, dict(canary_metrics, kind="val_loss"))
            metrics["canary_confirmed"] = confirmed
            gap = gap and confirmed
        if gap and ratio is not None:
            shown = f"{ratio:.2f}x" if math.isfinite(ratio) else "non-finite"
            where = "the FP32 canary, confirmed" if reference == "canary" else "the FP32 reference"
            findings.append(("P1", f"validation loss {shown} {where} (> {limit:.2f}x)", False, None))
        if judged and th["overflow_warn"] < overflow <= th["overflow_rollback"]:
            findings.append(("P2", f"overflow rate {overflow:.0%} over {steps} steps (> {th['overflow_warn']:.0%})", False,
                             self._overflow_recommendation(trainer, overflow) if trainer is not None else None))
        if throughput_ratio is not None and float(throughput_ratio) < th["throughput_ratio"]:
            findings.append(("P2", f"throughput {float(throughput_ratio):.2f}x FP32 (< {th['throughput_ratio']:.2f}x)", False,
                             {"changes": {"precision": "fp32"}, "reason": "reduced precision is slower than FP32 here"}))
        if not findings:
            decision = GuardDecision(None, "none", "healthy", False, None, metrics)
            self.decisions.append(decision)
            self._log.info("guard.decision", severity=None, action="none", reason="healthy", **metrics)
            return decision
        findings.sort(key=lambda f: f[0])
        severity = findings[0][0]
        reasons = "; ".join(f[1] for f in findings if f[0] == severity)
        recommendation = next((f[3] for f in findings if f[3] is not None), None)
        decision = self._decide(trainer, severity, reasons, metrics, restore=findings[0][2], recommendation=recommendation)
        if severity == "P0" and decision.action == "rollback":
            self.tripped = decision
            self._tripped_trainer = trainer
        if decision.action == "rollback" and trainer is not None:
            self._rolled_back = (trainer, decision)
        if decision.action == "rollback":
            self._canaries.clear()  # the next trainer starts a new confirmation window
        return decision

    def _overflow_recommendation(self, trainer: FP16Trainer, overflow: float) -> dict[str, Any]:
        scale, init, interval = trainer.current_scale, trainer.config.loss_scale, trainer.config.growth_interval
        new_init = min(init / 2, scale) if scale >= 1 else init / 2
        return {
            "changes": {"init_scale": max(1.0, 2.0 ** math.floor(math.log2(max(new_init, 1.0)))), "growth_interval": interval * 2},
            "reason": f"overflow rate {overflow:.0%}: start the scale lower and grow it less often",
        }

    # -- acting -------------------------------------------------------------------------
    def _decide(
        self,
        trainer: Optional[FP16Trainer],
        severity: str,
        reason: str,
        metrics: dict[str, Any],
        *,
        restore: bool,
        recommendation: Optional[dict[str, Any]] = None,
    ) -> GuardDecision:
        precision = trainer.precision.name if trainer is not None else metrics.get("precision")
        metrics = dict(metrics, precision=precision)
        action = "rollback" if severity in ("P0", "P1") else "warn"
        if action == "rollback" and precision == "fp32":
            action, reason = "warn", f"{reason} (already FP32: nothing to roll back)"
        decision = GuardDecision(severity, action, reason, restore and action == "rollback", recommendation, metrics)
        self.decisions.append(decision)
        level = "error" if action == "rollback" else "warning"
        getattr(self._log, level)(
            "guard.decision",
            severity=severity,
            action=action,
            reason=reason,
            restore_checkpoint=decision.restore_checkpoint,
            **{k: v for k, v in metrics.items() if k not in ("severity", "action", "reason")},
        )
        if action == "rollback":
            entry = self.ledger.rollback(self.agent, f"{severity}: {reason}", actor="guard", severity=severity)
            self._log.error(
                "guard.rollback",
                severity=severity,
                reason=reason,
                from_stage=entry["from_stage"],
                precision=precision,
                restore_checkpoint=decision.restore_checkpoint,
                last_good_checkpoint=str(self.last_good_checkpoint) if self.last_good_checkpoint else None,
            )
        if recommendation is not None:
            self.ledger.record_recommendation(self.agent, recommendation["changes"], recommendation["reason"], severity)
            self._log.warning(
                "guard.recommendation",
                severity=severity,
                changes=recommendation["changes"],
                reason=recommendation["reason"],
                precision=precision,
            )
        return decision

    def reset(self) -> None:
        """Forget the trip and decisions (the next training run); keeps the last good checkpoint."""
        with self._lock:
            self.tripped = None
            self._tripped_trainer = None
            self._rolled_back = None
            self.decisions = []

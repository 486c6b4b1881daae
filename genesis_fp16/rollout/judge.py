"""The rollback guard's rules as pure functions: statistics, losses and
thresholds in, findings out. No trainer, no ledger, no events: `RollbackGuard`
(genesis_fp16/rollout/guard.py) gathers the inputs and acts on the verdict.

One rule for the FP32 references (the shadow in stage ``shadow``, the canary in
stage ``on``): a validation-loss ratio is taken over ``max(FP32 val loss,
val_loss_floor)``, so tiny losses do not alarm on a ratio alone; a ratio over
the alarm level is an alarm; a rollback needs a confirmed alarm, ``canary_confirm``
alarms among the last ``canary_window`` checks of that reference. The alarm
level comes from FP32's own seed-to-seed spread (docs/ROLLBACK_PLAN.md):
``canary_val_loss_ratio`` (1.30, over its 95th percentile on every workload
measured) for the canary; the shadow, checked on every call, alarms from
``val_loss_ratio`` (1.20, the pooled 95th percentile) and a single shadow gap
over ``canary_val_loss_ratio``, or a non-finite val loss, counts as confirmed.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from genesis_fp16.rollout.profiles import GuardThresholds
from genesis_fp16.rollout.ledger import Severity, TextEnum


class Action(TextEnum):
    """What the guard does about a finding."""

    NONE = "none"
    WARN = "warn"
    ROLLBACK = "rollback"


class Reference(TextEnum):
    """Where an FP32 validation loss comes from: the shadow (an FP32 copy
    trained beside the agent for the whole stage ``shadow``) or a canary (a
    copy made every ``canary_every``-th call in stage ``on``)."""

    SHADOW = "shadow"
    CANARY = "canary"


@dataclass(frozen=True)
class Finding:
    """One thing found wrong; the guard acts on the most severe."""

    severity: Severity
    reason: str
    restore_checkpoint: bool = False
    recommendation: Optional[dict[str, Any]] = None


@dataclass(frozen=True)
class Confirmation:
    """One FP32-reference check in its confirmation window."""

    alarm: bool
    window: tuple[bool, ...]
    """The outcomes after this check, oldest first (at most ``canary_window``)."""
    confirmed: bool

    @property
    def alarms(self) -> int:
        return sum(self.window)


def confirm(alarm: bool, earlier: Sequence[bool], th: GuardThresholds, *, alone: bool = False) -> Confirmation:
    """Add this check's outcome to the ``earlier`` ones: confirmed when it
    alarmed and so did ``canary_confirm`` of the last ``canary_window``
    (this one included), or when it alarmed ``alone`` (beyond doubt by itself)."""
    window = (*earlier, bool(alarm))[-th.canary_window :]
    confirmed = bool(alarm) and (alone or sum(window) >= th.canary_confirm)
    return Confirmation(bool(alarm), tuple(window), confirmed)


@dataclass(frozen=True)
class Gap:
    """A validation loss against its FP32 reference."""

    ratio: float
    """``val_loss / max(fp32_val_loss, val_loss_floor)``; inf for a non-finite val loss."""
    limit: float
    """The alarm level it was judged against."""
    alarm: bool
    alone: bool
    """Whether this one alarm rolls back without waiting for confirmation."""


def judge_gap(
    val_loss: Optional[float], fp32_val_loss: Optional[float], th: GuardThresholds, reference: Reference
) -> Optional[Gap]:
    """The gap of ``val_loss`` to ``fp32_val_loss``, or None when there is
    nothing to judge (either missing, or an FP32 loss that is not finite)."""
    if val_loss is None or fp32_val_loss is None:
        return None
    ref = float(fp32_val_loss)
    if not math.isfinite(ref) or max(ref, th.val_loss_floor) <= 0:
        return None
    val = float(val_loss)
    ratio = val / max(ref, th.val_loss_floor) if math.isfinite(val) else math.inf
    if reference == Reference.CANARY:
        return Gap(ratio, th.canary_val_loss_ratio, ratio > th.canary_val_loss_ratio, alone=False)
    alarm = ratio > th.val_loss_ratio
    return Gap(ratio, th.val_loss_ratio, alarm, alone=alarm and ratio > th.canary_val_loss_ratio)


@dataclass(frozen=True)
class Verdict:
    """The guard's verdict, one type from the rule to the report: what `judge`
    and `judge_policy_canary` return, what `genesis_fp16.rollout.guard.RollbackGuard`
    logs and acts on (``GuardDecision`` there is this type), what
    `GuardedTraining.rollbacks` keeps and the training-call reports carry.
    ``severity`` None means healthy."""

    severity: Optional[Severity] = None
    """`P0` (roll back now), `P1` (roll back) or `P2` (warn); None when healthy."""
    action: Action = Action.NONE
    """`none`, `warn` or `rollback` (`action_for`: an FP32 trainer has nothing to roll back)."""
    reason: str = "healthy"
    """What was measured against which threshold, in words (the most severe findings')."""
    restore_checkpoint: bool = False
    """Whether the rollback restores the last good checkpoint."""
    recommendation: Optional[dict[str, Any]] = None
    """A proposed profile change (P2), as `genesis-fp16 tune` shows it."""
    metrics: dict[str, Any] = field(default_factory=dict)
    """The measurements the verdict rests on (overflow rate, loss ratio, precision, ...)."""
    findings: tuple[Finding, ...] = ()
    """Everything found wrong, most severe first."""
    check: Optional[Confirmation] = None
    """The FP32 reference's check in its window (None when no gap was judged)."""

    def __post_init__(self) -> None:
        # the strings a caller may pass ("P1", "rollback") become the enums
        if self.severity is not None:
            object.__setattr__(self, "severity", Severity(self.severity))
        object.__setattr__(self, "action", Action(self.action))

    @property
    def summary(self) -> str:
        """``"<severity>: <reason>"``, as the ledger and the reports say a rollback."""
        return f"{self.severity}: {self.reason}"

    def as_dict(self) -> dict[str, Any]:
        """Severity, action, reason, restore_checkpoint, recommendation and
        metrics as plain data (for JSON and event logs): severity and action as their strings."""
        return {
            "severity": None if self.severity is None else self.severity.value,
            "action": self.action.value,
            "reason": self.reason,
            "restore_checkpoint": self.restore_checkpoint,
            "recommendation": copy.deepcopy(self.recommendation),
            "metrics": copy.deepcopy(self.metrics),
        }


def action_for(severity: Optional[Severity], precision: Optional[str]) -> Action:
    """P0 and P1 roll back, P2 warns; an FP32 trainer has nothing to roll back."""
    if severity is None:
        return Action.NONE
    if severity in (Severity.P0, Severity.P1) and precision != "fp32":
        return Action.ROLLBACK
    return Action.WARN


def verdict_of(findings: Sequence[Finding], metrics: dict[str, Any], check: Optional[Confirmation] = None) -> Verdict:
    """The verdict on ``findings``: the most severe decide severity and
    reason, ``action_for`` the action at ``metrics["precision"]`` (P0/P1 of an
    FP32 trainer only warn, and the reason says so), the first recommendation."""
    ordered = tuple(sorted(findings, key=lambda f: f.severity.value))
    if not ordered:
        return Verdict(metrics=metrics, check=check)
    severity = ordered[0].severity
    reason = "; ".join(f.reason for f in ordered if f.severity == severity)
    action = action_for(severity, metrics.get("precision"))
    if severity in (Severity.P0, Severity.P1) and action == Action.WARN:
        reason = f"{reason} (already FP32: nothing to roll back)"
    recommendation = next((f.recommendation for f in ordered if f.recommendation is not None), None)
    restore = ordered[0].restore_checkpoint and action == Action.ROLLBACK
    return Verdict(severity, action, reason, restore, recommendation, metrics, ordered, check)


def _overflow_recommendation(stats: Mapping[str, Any], overflow: float) -> Optional[dict[str, Any]]:
    scale, init, interval = stats.get("current_scale"), stats.get("init_scale"), stats.get("growth_interval")
    if scale is None or init is None or interval is None:
        return None
    new_init = min(init / 2, scale) if scale >= 1 else init / 2
    return {
        "changes": {
            "init_scale": max(1.0, 2.0 ** math.floor(math.log2(max(new_init, 1.0)))),
            "growth_interval": interval * 2,
        },
        "reason": f"overflow rate {overflow:.0%}: start the scale lower and grow it less often",
    }


def judge(
    stats: Mapping[str, Any],
    th: GuardThresholds,
    *,
    val_loss: Optional[float] = None,
    fp32_val_loss: Optional[float] = None,
    throughput_ratio: Optional[float] = None,
    reference: Reference = Reference.SHADOW,
    window: Sequence[bool] = (),
) -> Verdict:
    """Judge a run. ``stats`` are a trainer's (`FP16Trainer.get_stats`, plus
    ``init_scale`` and ``growth_interval`` for an overflow recommendation);
    ``window`` the earlier outcomes of ``reference``'s checks, oldest first."""
    reference = Reference(reference)
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
    if val_loss is not None and fp32_val_loss is not None:
        metrics.update(val_loss=val_loss, fp32_val_loss=fp32_val_loss)
        ref = float(fp32_val_loss)
        if math.isfinite(ref) and ref > 0:
            raw = float(val_loss) / ref
            metrics["val_loss_ratio"] = raw if math.isfinite(raw) else None
    if throughput_ratio is not None:
        metrics["throughput_ratio"] = float(throughput_ratio)
    judged = steps >= th.min_steps

    findings: list[Finding] = []
    if judged and failed > th.failed_fraction:
        findings.append(
            Finding(Severity.P0, f"{failed:.0%} of {steps} steps failed (> {th.failed_fraction:.0%})", True)
        )
    if judged and overflow > th.overflow_rollback:
        findings.append(
            Finding(Severity.P1, f"overflow rate {overflow:.0%} over {steps} steps (> {th.overflow_rollback:.0%})")
        )
    gap = judge_gap(val_loss, fp32_val_loss, th, reference)
    check = None
    if gap is not None:
        check = confirm(gap.alarm, window, th, alone=gap.alone)
        metrics["judged_ratio"] = gap.ratio if math.isfinite(gap.ratio) else None
        metrics[f"{reference}_alarms"] = check.alarms
        metrics[f"{reference}_confirmed"] = check.confirmed
        if check.confirmed:
            shown = f"{gap.ratio:.2f}x" if math.isfinite(gap.ratio) else "non-finite"
            if reference == Reference.CANARY:
                where, limit = "the FP32 canary, confirmed", gap.limit
            elif check.alarms >= th.canary_confirm:
                where, limit = (
                    f"the FP32 reference, confirmed by {check.alarms} of the last {len(check.window)} checks",
                    gap.limit,
                )
            else:  # one gap beyond FP32's own spread on every workload measured
                where, limit = "the FP32 reference", th.canary_val_loss_ratio
            findings.append(Finding(Severity.P1, f"validation loss {shown} {where} (> {limit:.2f}x)"))
    if judged and th.overflow_warn < overflow <= th.overflow_rollback:
        findings.append(
            Finding(
                Severity.P2,
                f"overflow rate {overflow:.0%} over {steps} steps (> {th.overflow_warn:.0%})",
                recommendation=_overflow_recommendation(stats, overflow),
            )
        )
    if throughput_ratio is not None and float(throughput_ratio) < th.throughput_ratio:
        findings.append(
            Finding(
                Severity.P2,
                f"throughput {float(throughput_ratio):.2f}x FP32 (< {th.throughput_ratio:.2f}x)",
                recommendation={
                    "changes": {"precision": "fp32"},
                    "reason": "reduced precision is slower than FP32 here",
                },
            )
        )
    return verdict_of(findings, metrics, check)


POLICY_LIMITS = {"kl": "canary_kl", "max_logp_delta": "canary_logp_delta", "max_value_delta": "canary_value_delta"}


def judge_policy_canary(
    values: Mapping[str, float], th: GuardThresholds, window: Sequence[bool] = (), precision: Optional[str] = None
) -> Verdict:
    """A policy canary (PPO): ``values`` (``kl``, ``max_logp_delta``,
    ``max_value_delta``) against ``canary_kl``, ``canary_logp_delta``,
    ``canary_value_delta``; a non-finite value alarms; a confirmed alarm is P1
    (a rollback, restoring the last good checkpoint, unless ``precision`` is FP32)."""
    limits = {k: float(getattr(th, name)) for k, name in POLICY_LIMITS.items()}
    over = [k for k, v in values.items() if not (math.isfinite(v) and v <= limits[k])]
    check = confirm(bool(over), window, th)
    metrics = {**values, "precision": precision, "kind": "policy"}
    if not check.confirmed:
        return verdict_of((), metrics, check)
    reason = "policy canary: " + ", ".join(f"{k} {values[k]:.3g} (> {limits[k]:g})" for k in over)
    return verdict_of((Finding(Severity.P1, f"{reason}, confirmed", True),), metrics, check)

"""The guard's rules as pure functions: no trainer, no ledger. The FP32
references (shadow and canary) share one noise-aware rule: a ratio over
max(FP32 loss, floor), an alarm level from FP32's own seed-to-seed spread,
and a rollback only for a confirmed gap."""

from __future__ import annotations

import math

import pytest

from genesis_fp16.rollout.judge import Action, Reference, action_for, confirm, judge, judge_gap, judge_policy_canary
from genesis_fp16.rollout.profiles import GuardThresholds
from genesis_fp16.rollout.ledger import Severity

TH = GuardThresholds()
HEALTHY = {
    "training_steps": 50,
    "overflow_rate": 0.0,
    "failed_step_rate": 0.0,
    "current_scale": 1.0,
    "precision": "bf16",
}


def test_tiny_losses_within_fp32_spread_do_not_roll_a_shadow_back():
    # a custom 5-d PointMass task: 1.21x on losses of about 2e-4, which a flat 1.20x rule rolled back
    val, ref = 2.18e-4, 1.8e-4
    assert val / ref > TH.val_loss_ratio
    for window in ((), (False,), (False, False)):
        verdict = judge(HEALTHY, TH, val_loss=val, fp32_val_loss=ref, reference=Reference.SHADOW, window=window)
        assert verdict.findings == () and verdict.severity is None and verdict.check.alarm is False
    assert verdict.metrics["val_loss_ratio"] == pytest.approx(val / ref)
    assert verdict.metrics["judged_ratio"] == pytest.approx(val / TH.val_loss_floor)


def test_the_floor_does_not_hide_a_real_gap_on_tiny_losses():
    verdict = judge(HEALTHY, TH, val_loss=5e-3, fp32_val_loss=1.8e-4, reference=Reference.SHADOW)
    assert verdict.severity == Severity.P1 and "5.00x" in verdict.reason


def test_a_shadow_gap_within_fp32_spread_alarms_but_needs_confirmation():
    # 1.25x: inside FP32's seed-to-seed spread (the LSTM's 95th percentile is 1.27x)
    first = judge(HEALTHY, TH, val_loss=1.25, fp32_val_loss=1.0, reference="shadow")
    assert first.findings == () and first.check.alarm and not first.check.confirmed
    after_a_clean_one = judge(HEALTHY, TH, val_loss=1.25, fp32_val_loss=1.0, window=(False, False))
    assert after_a_clean_one.findings == ()
    confirmed = judge(HEALTHY, TH, val_loss=1.25, fp32_val_loss=1.0, window=(True, False))
    assert confirmed.severity == Severity.P1 and "confirmed by 2 of the last 3 checks" in confirmed.reason
    assert confirmed.check.window == (True, False, True)


def test_a_shadow_gap_beyond_fp32_spread_or_non_finite_is_confirmed_alone():
    for val in (1.35, float("nan"), float("inf")):
        verdict = judge(HEALTHY, TH, val_loss=val, fp32_val_loss=1.0, reference=Reference.SHADOW)
        assert verdict.severity == Severity.P1 and verdict.check.confirmed and "(> 1.30x)" in verdict.reason


def test_a_canary_always_needs_confirmation():
    one = judge(HEALTHY, TH, val_loss=2.0, fp32_val_loss=1.0, reference=Reference.CANARY)
    assert one.findings == () and one.check.alarm
    assert judge(HEALTHY, TH, val_loss=1.25, fp32_val_loss=1.0, reference="canary").check.alarm is False  # under 1.30x
    two = judge(HEALTHY, TH, val_loss=2.0, fp32_val_loss=1.0, reference=Reference.CANARY, window=(True, False))
    assert two.severity == Severity.P1 and "canary, confirmed" in two.reason


def test_confirm_keeps_only_the_window():
    th = GuardThresholds(canary_confirm=2, canary_window=2)
    assert confirm(True, (True, False), th).window == (False, True) and not confirm(True, (True, False), th).confirmed
    assert confirm(True, (False, True), th).confirmed
    assert not confirm(False, (True, True), th).confirmed


def test_nothing_to_judge_without_a_finite_reference():
    assert judge_gap(1.0, None, TH, Reference.SHADOW) is None
    assert judge_gap(1.0, float("nan"), TH, Reference.SHADOW) is None
    assert judge(HEALTHY, TH, val_loss=5.0, fp32_val_loss=float("nan")).findings == ()


def test_rates_from_statistics_alone():
    storm = dict(HEALTHY, overflow_rate=0.5)
    assert judge(storm, TH).severity == Severity.P1
    warn = dict(HEALTHY, overflow_rate=0.2, current_scale=1024.0, init_scale=65536.0, growth_interval=2000)
    verdict = judge(warn, TH)
    assert verdict.severity == Severity.P2 and verdict.recommendation["changes"] == {
        "init_scale": 1024.0,
        "growth_interval": 4000,
    }
    assert judge(dict(warn, training_steps=5), TH).findings == ()  # under min_steps
    failing = judge(dict(HEALTHY, failed_step_rate=0.6, overflow_rate=0.6), TH)
    assert failing.severity == Severity.P0 and failing.restore_checkpoint and "steps failed" in failing.reason
    assert judge(HEALTHY, TH, throughput_ratio=0.5).recommendation == {
        "changes": {"precision": "fp32"},
        "reason": "reduced precision is slower than FP32 here",
    }


def test_actions_and_policy_canary():
    assert action_for(None, "bf16") == Action.NONE == "none"
    assert action_for(Severity.P1, "bf16") == Action.ROLLBACK and action_for(Severity.P1, "fp32") == Action.WARN
    assert action_for(Severity.P2, "fp16") == "warn"
    gap = {"kl": 0.5, "max_logp_delta": 0.1, "max_value_delta": math.nan}
    assert judge_policy_canary(gap, TH).findings == ()
    verdict = judge_policy_canary(gap, TH, window=(True,))
    assert (
        verdict.severity == Severity.P1 and "kl 0.5 (> 0.1)" in verdict.reason and "max_value_delta" in verdict.reason
    )

"""The check a reduced precision must pass against FP32 on the same work: its loss over FP32's, taken over
``max(FP32 loss, floor)``, at most a limit. The canary (`genesis_fp16.rollout.judge`) and the measurement of
``auto`` (`genesis_fp16.precision.calibration`) judge by it; the guard's thresholds
(`genesis_fp16.rollout.profiles.GuardThresholds`) take their defaults from here. Torch-free."""

from __future__ import annotations

import math
from typing import Optional

CANARY_LOSS_RATIO = 1.30
"""A reduced precision whose loss is above this multiple of FP32's fails: above the 95th percentile of FP32's own
seed-to-seed validation-loss ratio on every workload measured (scripts/canary_threshold.py, docs/ROLLBACK_PLAN.md),
so FP32's noise never fails."""
LOSS_FLOOR = 1e-3
"""Ratios are taken over max(FP32 loss, this): on the world model's normalised targets an RMS error of about 3% of a
target's spread (its measured validation losses are 0.03-0.06); under it a ratio of two losses measures rounding and
seed noise, not a worse model."""


def loss_ratio(loss: float, fp32_loss: float, floor: float = LOSS_FLOOR) -> float:
    """The loss over FP32's, taken over ``max(FP32 loss, floor)``, so tiny losses do not fail on a ratio alone.
    Written as ``1 + (loss - fp32) / max(|fp32|, floor)``, which is that ratio for a positive FP32 loss and stays
    meaningful for a negative one (a Gaussian NLL); inf when the loss is not finite."""
    if not math.isfinite(loss):
        return math.inf
    if not math.isfinite(fp32_loss):
        return 1.0  # nothing to compare against: FP32 itself failed; the speed decides among the finite
    return 1.0 + (loss - fp32_loss) / max(abs(fp32_loss), floor)


def passes(ratio: Optional[float], limit: float = CANARY_LOSS_RATIO) -> bool:
    """Whether a loss ratio (`loss_ratio`) passes the FP32 check; None (not checked) does not."""
    return ratio is not None and ratio <= limit

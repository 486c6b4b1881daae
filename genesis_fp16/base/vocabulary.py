"""The words settings, requests and decisions share: the precision modes, what a mode the device cannot run does,
and how ``auto`` decides. Their own module in the base, so that the trainer and the decision speak them without
reading the settings."""

from __future__ import annotations

from enum import Enum


class PrecisionMode(str, Enum):
    """The one precision vocabulary (trainer, PPO, forensics, bench, agents).
    ``auto`` never picks ``tf32`` or ``fp16-true``: they are asked for by name."""

    AUTO = "auto"
    FP16 = "fp16"
    BF16 = "bf16"
    FP32 = "fp32"
    TF32 = "tf32"
    FP16_TRUE = "fp16-true"


class OnUnsupported(str, Enum):
    """What a trainer does with a precision its device cannot run: fallback
    (log it and train in the nearest precision at least as precise as asked,
    never a less precise one) or error."""

    FALLBACK = "fallback"
    ERROR = "error"


class AutoPrecision(str, Enum):
    """How ``precision=auto`` decides: measure (time each precision the device
    runs on the workload itself, once per workload and host, and keep the
    decision in the host cache) or rule (read the device's capability flags only)."""

    MEASURE = "measure"
    RULE = "rule"

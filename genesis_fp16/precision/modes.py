"""The mode table: each precision mode's plugin class (`MODES`), which modes keep FP32 weights or compute in 16
bits, and what a device that cannot run a mode falls back to (`runnable_mode`: never a less precise mode).
``auto`` is not in the table: `genesis_fp16.precision.decision.decide` decides it."""

from __future__ import annotations

from typing import Any, Optional, Union

import torch

from genesis_fp16.base.errors import UnsupportedPrecisionError
from genesis_fp16.base.settings import OnUnsupported, PrecisionMode
from genesis_fp16.base.telemetry import get_logger, log_once
from genesis_fp16.precision import capability
from genesis_fp16.precision.capability import Support
from genesis_fp16.precision.plugins import TF32, BF16Mixed, FP16Mixed, HalfTrue, Precision
from genesis_fp16.precision.request import parse_mode, parse_on_unsupported

MODES: dict[PrecisionMode, type[Precision]] = {
    PrecisionMode.FP32: Precision,
    PrecisionMode.TF32: TF32,
    PrecisionMode.BF16: BF16Mixed,
    PrecisionMode.FP16: FP16Mixed,
    PrecisionMode.FP16_TRUE: HalfTrue,
}

# modes that keep FP32 master weights (every mode but fp16-true), in MODES order:
# what the benchmark compares
FP32_WEIGHT_MODES: tuple[PrecisionMode, ...] = tuple(m for m, cls in MODES.items() if cls.keeps_fp32_weights)
# modes that compute in a 16-bit dtype
REDUCED_MODES: tuple[PrecisionMode, ...] = tuple(m for m, cls in MODES.items() if cls.compute_dtype != torch.float32)


# For each mode, the modes at least as precise as it, nearest first: where a
# device cannot run a mode, ``fallback`` takes the first of these it can run.
# Never downwards: tf32 (FP32 weights, near-FP32 matmuls) may become fp32, never
# BF16; bf16 becomes fp32, not fp16 (another format, not a more precise one).
AT_LEAST_AS_PRECISE: dict[PrecisionMode, tuple[PrecisionMode, ...]] = {
    PrecisionMode.FP16_TRUE: (PrecisionMode.FP16, PrecisionMode.FP32),
    PrecisionMode.FP16: (PrecisionMode.FP32,),
    PrecisionMode.BF16: (PrecisionMode.FP32,),
    PrecisionMode.TF32: (PrecisionMode.FP32,),
    PrecisionMode.FP32: (),
}


def fallback_for(device: Union[str, torch.device], mode: PrecisionMode) -> PrecisionMode:
    """The nearest mode at least as precise as ``mode`` that ``device`` runs (fp32 always runs)."""
    for candidate in AT_LEAST_AS_PRECISE[mode]:
        if capability.device_support(device, candidate) != Support.NONE:
            return candidate
    return PrecisionMode.FP32


def runnable_mode(
    requested: Union[str, PrecisionMode],
    device: Union[str, torch.device],
    on_unsupported: Union[str, OnUnsupported] = OnUnsupported.FALLBACK,
) -> tuple[PrecisionMode, Optional[str]]:
    """``(mode, fallback reason)`` for a named precision on ``device``: the mode
    itself (reason None) where the device runs it; else per ``on_unsupported``,
    ``error`` raises `UnsupportedPrecisionError`, ``fallback`` logs and gives
    `fallback_for` (never a less precise mode) with why. ``auto`` is not
    named: `genesis_fp16.precision.decision` decides it."""
    device = torch.device(device)
    mode = parse_mode(requested)
    if mode == PrecisionMode.AUTO:
        raise ValueError("runnable_mode: auto is decided by genesis_fp16.precision.decision.decide, not here")
    if capability.device_support(device, mode) != Support.NONE:
        return mode, None
    why = capability.unsupported_reason(device, mode) or f"{mode.value} is not supported on {device}"
    if parse_on_unsupported(on_unsupported) == OnUnsupported.ERROR:
        raise UnsupportedPrecisionError(
            f"precision {mode.value!r} is not supported on {device} ({why}); "
            f"set GENESIS_FP16_PRECISION to one of {supported_modes(device)} or GENESIS_FP16_ON_UNSUPPORTED=fallback"
        )
    fallback = fallback_for(device, mode)
    reason = (
        f"{mode.value} is not supported on {device} ({why}); on_unsupported=fallback uses "
        f"{fallback.value}, the nearest precision at least as precise as {mode.value}"
    )
    log_once(
        get_logger("genesis_fp16.precision"),
        f"fallback:{device}:{mode.value}",
        "warning",
        "precision.fallback",
        device=str(device),
        requested=mode.value,
        precision=fallback.value,
        reason=reason,
    )
    return fallback, reason


def supported_modes(device: Union[str, torch.device]) -> list[str]:
    return [m.value for m in MODES if capability.device_support(device, m) != Support.NONE]


def capability_report(device: Union[str, torch.device]) -> dict[str, Any]:
    device = torch.device(device)
    auto, reason = capability.auto_precision(device)
    return {
        "device": str(device),
        "name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "support": {m.value: capability.device_support(device, m).value for m in MODES},
        "fast": [m.value for m in MODES if capability.device_support(device, m) == Support.NATIVE],
        "auto_precision": auto.value,
        "auto_reason": reason,
    }

"""Precision modes and device capability.

A mode is a small class on a base with no-op hooks (the Lightning Fabric
pattern): it gives the forward context and the gradient scaler. The trainer
holds one and never branches on the mode itself.

Capability is decided by plain functions (torchtune style) that tests patch so
every error path runs on any machine.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, ContextManager, Optional, Union

import torch

from .settings import OnUnsupported, PrecisionMode
from .telemetry import get_logger, log_once


class Support(str, Enum):
    """How well a device runs a precision."""

    NATIVE = "native"  # hardware support, measured fast
    SLOW = "slow"  # runs correctly but measured slower than FP32 on this device
    NONE = "none"  # cannot run


class UnsupportedPrecisionError(RuntimeError):
    pass


# -- capability -------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX-BF16: the CPU has BF16 instructions (not that they are fast)."""
    flags = cpu_flags()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_has_fast_bf16() -> bool:
    """AMX-BF16: BF16 autocast measured 2.28x FP32 at size L (docs/PERFORMANCE.md).
    AVX512-BF16 without AMX is not enough: on such a CPU BF16 autocast measured
    0.66-0.74x FP32 at every bench size (docs/PERFORMANCE.md)."""
    return "amx_bf16" in cpu_flags()


def slow_reason(device: Union[str, torch.device], mode: PrecisionMode) -> str:
    """Why ``mode`` is :attr:`Support.SLOW` on ``device``, with the measured figure."""
    device = torch.device(device)
    if device.type == "cpu" and mode == PrecisionMode.BF16:
        if cpu_has_native_bf16():
            return (
                "CPU has AVX512-BF16 but no AMX: BF16 autocast measured 0.66-0.74x fp32 at every bench size "
                "on such a CPU (docs/PERFORMANCE.md)"
            )
        return "CPU has no BF16 instructions: BF16 is emulated"
    if device.type == "cpu" and mode == PrecisionMode.FP16:
        return (
            "FP16 on CPU is not faster than fp32: measured 0.05x fp32 for an LSTM, 0.66-1.02x for MLPs "
            "(docs/PERFORMANCE.md)"
        )
    return f"{mode.value} on {device.type} runs through autocast without measured hardware support"


def cuda_supports_bf16(device: torch.device) -> bool:
    if not torch.cuda.is_available():
        return False
    return bool(torch.cuda.is_bf16_supported())


def device_support(device: Union[str, torch.device], mode: PrecisionMode) -> Support:
    """How well ``device`` runs ``mode`` (``auto`` is not a mode here)."""
    device = torch.device(device)
    if mode == PrecisionMode.FP32:
        return Support.NATIVE
    if device.type == "cuda":
        if mode == PrecisionMode.FP16:
            return Support.NATIVE
        return Support.NATIVE if cuda_supports_bf16(device) else Support.NONE
    if device.type == "cpu":
        if mode == PrecisionMode.BF16:
            return Support.NATIVE if cpu_has_fast_bf16() else Support.SLOW
        # FP16 autocast on CPUs runs but never beats FP32 or BF16 here: measured
        # 0.05x FP32 for an LSTM, 0.66-1.02x for MLPs (docs/PERFORMANCE.md).
        return Support.SLOW
    # mps, xla, ...: only what torch.autocast documents for the device type
    try:
        torch.autocast(device.type, dtype=torch.float16 if mode == PrecisionMode.FP16 else torch.bfloat16)
    except Exception:
        return Support.NONE
    return Support.SLOW


SUPPORT_REASONS = {
    ("cuda", PrecisionMode.FP16): "CUDA tensor cores run FP16; a gradient scaler keeps small gradients",
    ("cuda", PrecisionMode.BF16): "CUDA device reports BF16 support",
    ("cpu", PrecisionMode.BF16): "CPU has AMX-BF16 (BF16 autocast measured 2.28x FP32 at size L)",
}


def auto_precision(device: Union[str, torch.device]) -> tuple[PrecisionMode, str]:
    """What ``auto`` picks on ``device`` and why."""
    device = torch.device(device)
    if device.type == "cuda":
        return PrecisionMode.FP16, "CUDA: FP16 with a gradient scaler (Precision-RL finding: least train/inference mismatch)"
    if device.type == "cpu" and device_support(device, PrecisionMode.BF16) == Support.NATIVE:
        return PrecisionMode.BF16, "CPU with AMX-BF16: BF16 autocast measured faster than FP32 (2.28x at size L)"
    if device.type == "cpu" and cpu_has_native_bf16():
        return PrecisionMode.FP32, "CPU has AVX512-BF16 but no AMX: BF16 measured slower than FP32 (0.66x at size L)"
    return PrecisionMode.FP32, f"{device.type}: no reduced precision measured faster than FP32 here"


# -- modes --------------------------------------------------------------------


@dataclass(frozen=True)
class ScalerOptions:
    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000


class Precision:
    """FP32: no autocast, a disabled scaler (so the trainer has one loop path)."""

    name = "fp32"
    compute_dtype = torch.float32
    uses_scaler = False

    def __init__(self, device: Union[str, torch.device], scaler: Optional[ScalerOptions] = None) -> None:
        self.device = torch.device(device)
        self.scaler_options = scaler or ScalerOptions()

    def autocast(self) -> ContextManager[Any]:
        return contextlib.nullcontext()

    def make_scaler(self) -> torch.amp.GradScaler:
        opts = self.scaler_options
        return torch.amp.GradScaler(
            self.device.type,
            init_scale=opts.init_scale,
            growth_factor=opts.growth_factor,
            backoff_factor=opts.backoff_factor,
            growth_interval=opts.growth_interval,
            enabled=self.uses_scaler,
        )

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device})"


class FP16Mixed(Precision):
    """FP16 autocast with a dynamic loss scaler (``torch.amp.GradScaler``)."""

    name = "fp16"
    compute_dtype = torch.float16
    uses_scaler = True

    def autocast(self) -> ContextManager[Any]:
        return torch.autocast(self.device.type, dtype=torch.float16)


class BF16Mixed(Precision):
    """BF16 autocast; BF16 has FP32's exponent range, so no scaler."""

    name = "bf16"
    compute_dtype = torch.bfloat16

    def autocast(self) -> ContextManager[Any]:
        return torch.autocast(self.device.type, dtype=torch.bfloat16)


class HalfTrue(Precision):
    """Weights themselves in FP16 (``cast_model_to_fp16``): for inference and
    memory-bound deployment. There are no FP32 master weights, and
    ``GradScaler`` refuses to unscale FP16 gradients, so no scaler."""

    name = "fp16-true"
    compute_dtype = torch.float16

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module.to(dtype=torch.float16)


MODES: dict[PrecisionMode, type[Precision]] = {
    PrecisionMode.FP32: Precision,
    PrecisionMode.FP16: FP16Mixed,
    PrecisionMode.BF16: BF16Mixed,
}


def parse_mode(value: Union[str, PrecisionMode]) -> PrecisionMode:
    try:
        return PrecisionMode(value.value if isinstance(value, PrecisionMode) else str(value).lower())
    except ValueError:
        allowed = ", ".join(m.value for m in PrecisionMode)
        raise ValueError(f"unknown precision {value!r}: allowed values are {allowed}") from None


def parse_on_unsupported(value: Union[str, OnUnsupported]) -> OnUnsupported:
    try:
        return OnUnsupported(value.value if isinstance(value, OnUnsupported) else str(value).lower())
    except ValueError:
        allowed = ", ".join(m.value for m in OnUnsupported)
        raise ValueError(f"unknown on_unsupported {value!r}: allowed values are {allowed}") from None


def best_supported(device: torch.device) -> PrecisionMode:
    mode, _ = auto_precision(device)
    return mode


def resolve_precision(
    requested: Union[str, PrecisionMode],
    device: Union[str, torch.device],
    on_unsupported: Union[str, OnUnsupported] = OnUnsupported.FALLBACK,
    scaler: Optional[ScalerOptions] = None,
) -> Precision:
    """Turn a requested mode into a ``Precision`` for ``device``.

    ``auto`` picks by :func:`auto_precision` and logs why, once. A mode the
    device cannot run follows ``on_unsupported``; a mode that runs but is slow
    here runs as asked and warns once. Nothing is substituted silently.
    """
    log = get_logger("genesis_fp16.precision")
    device = torch.device(device)
    mode = parse_mode(requested)
    policy = parse_on_unsupported(on_unsupported)
    if mode == PrecisionMode.AUTO:
        mode, reason = auto_precision(device)
        log_once(log, f"auto:{device}", "info", "precision.auto_selected", device=str(device), precision=mode.value, reason=reason)
        return MODES[mode](device, scaler)
    support = device_support(device, mode)
    if support == Support.NONE:
        if policy == OnUnsupported.ERROR:
            raise UnsupportedPrecisionError(
                f"precision {mode.value!r} is not supported on {device}; "
                f"set GENESIS_FP16_PRECISION to one of {supported_modes(device)} or GENESIS_FP16_ON_UNSUPPORTED=fallback"
            )
        fallback = best_supported(device)
        log_once(
            log,
            f"fallback:{device}:{mode.value}",
            "warning",
            "precision.fallback",
            device=str(device),
            requested=mode.value,
            precision=fallback.value,
            reason=f"{mode.value} is not supported on {device}; on_unsupported=fallback",
        )
        return MODES[fallback](device, scaler)
    if support == Support.SLOW:
        log_once(
            log,
            f"slow:{device}:{mode.value}",
            "warning",
            "precision.slow_on_device",
            device=str(device),
            precision=mode.value,
            reason=f"{mode.value} runs on {device.type} but is not faster than fp32 here: {slow_reason(device, mode)}",
        )
    return MODES[mode](device, scaler)


def supported_modes(device: Union[str, torch.device]) -> list[str]:
    return [m.value for m in MODES if device_support(device, m) != Support.NONE]


def capability_report(device: Union[str, torch.device]) -> dict[str, Any]:
    device = torch.device(device)
    auto, reason = auto_precision(device)
    return {
        "device": str(device),
        "name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "support": {m.value: device_support(device, m).value for m in MODES},
        "fast": [m.value for m in MODES if device_support(device, m) == Support.NATIVE],
        "auto_precision": auto.value,
        "auto_reason": reason,
    }

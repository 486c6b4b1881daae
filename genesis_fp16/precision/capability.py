"""Device capability: how well a device runs each precision, and what ``auto`` picks.

Plain functions (torchtune style) that tests patch, at this module
(``genesis_fp16.precision.capability``), so every error path runs on any machine.
"""

from __future__ import annotations

import functools
from enum import Enum
from pathlib import Path
from typing import Optional, Union

import torch

from ..settings import PrecisionMode


class Support(str, Enum):
    """How well a device runs a precision."""

    NATIVE = "native"  # hardware support, measured fast
    SLOW = "slow"  # runs correctly but measured slower than FP32 on this device
    NONE = "none"  # cannot run


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


def cuda_supports_bf16(device: torch.device) -> bool:
    if not torch.cuda.is_available():
        return False
    return bool(torch.cuda.is_bf16_supported())


def cuda_supports_tf32(device: torch.device) -> bool:
    """TF32 tensor cores exist from compute capability 8.0 (Ampere); older GPUs
    ignore the TF32 switches and run strict FP32."""
    if not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device) >= (8, 0)


def slow_reason(device: Union[str, torch.device], mode: PrecisionMode) -> str:
    """Why ``mode`` is `Support.SLOW` on ``device``, with the measured figure."""
    device = torch.device(device)
    if device.type == "cpu" and mode == PrecisionMode.BF16:
        if cpu_has_native_bf16():
            return (
                "CPU has AVX512-BF16 but no AMX: BF16 autocast measured 0.66-0.74x fp32 at every bench size "
                "on such a CPU (docs/PERFORMANCE.md)"
            )
        return "CPU has no BF16 instructions: BF16 is emulated"
    if device.type == "cpu" and mode in (PrecisionMode.FP16, PrecisionMode.FP16_TRUE):
        return (
            "FP16 on CPU is not faster than fp32: measured 0.05x fp32 for an LSTM, 0.66-1.02x for MLPs "
            "(docs/PERFORMANCE.md)"
        )
    return f"{mode.value} on {device.type} runs through autocast without measured hardware support"


def unsupported_reason(device: Union[str, torch.device], mode: PrecisionMode) -> Optional[str]:
    """Why ``device`` cannot run ``mode``; None when it can (natively or slowly)."""
    device = torch.device(device)
    if device_support(device, mode) != Support.NONE:
        return None
    if mode == PrecisionMode.TF32:
        if device.type == "cuda":
            return "TF32 needs a CUDA device of compute capability 8.0 or newer (Ampere); this one has none"
        return "TF32 is a CUDA tensor-core mode; not applicable on this device"
    if mode == PrecisionMode.BF16 and device.type == "cuda":
        return "this CUDA device does not support BF16"
    return f"{mode.value} is not supported on {device}"


def device_support(device: Union[str, torch.device], mode: PrecisionMode) -> Support:
    """How well ``device`` runs ``mode`` (``auto`` is not a mode here)."""
    device = torch.device(device)
    if mode == PrecisionMode.FP32:
        return Support.NATIVE
    if mode == PrecisionMode.TF32:
        # on a CPU the CUDA TF32 switches do nothing: an "fp32-equivalent" run would
        # be labelled tf32 without being it, so it is unsupported there
        return Support.NATIVE if device.type == "cuda" and cuda_supports_tf32(device) else Support.NONE
    if device.type == "cuda":
        if mode in (PrecisionMode.FP16, PrecisionMode.FP16_TRUE):
            return Support.NATIVE
        return Support.NATIVE if cuda_supports_bf16(device) else Support.NONE
    if device.type == "cpu":
        if mode == PrecisionMode.BF16:
            return Support.NATIVE if cpu_has_fast_bf16() else Support.SLOW
        # FP16 on CPUs runs but never beats FP32 or BF16 here: measured
        # 0.05x FP32 for an LSTM, 0.66-1.02x for MLPs (docs/PERFORMANCE.md).
        return Support.SLOW
    # mps, xla, ...: only what torch.autocast documents for the device type
    try:
        torch.autocast(device.type, dtype=torch.bfloat16 if mode == PrecisionMode.BF16 else torch.float16)
    except Exception:
        return Support.NONE
    return Support.SLOW


SUPPORT_REASONS = {
    ("cuda", PrecisionMode.FP16): "CUDA tensor cores run FP16; a gradient scaler keeps small gradients",
    ("cuda", PrecisionMode.BF16): "CUDA device reports BF16 support",
    ("cpu", PrecisionMode.BF16): "CPU has AMX-BF16 (BF16 autocast measured 2.28x FP32 at size L)",
}


def auto_precision(device: Union[str, torch.device]) -> tuple[PrecisionMode, str]:
    """What ``auto`` picks on ``device`` and why (never tf32 or fp16-true: those are asked for by name)."""
    device = torch.device(device)
    if device.type == "cuda":
        return PrecisionMode.FP16, "CUDA: FP16 with a gradient scaler (Precision-RL finding: least train/inference mismatch)"
    if device.type == "cpu" and device_support(device, PrecisionMode.BF16) == Support.NATIVE:
        return PrecisionMode.BF16, "CPU with AMX-BF16: BF16 autocast measured faster than FP32 (2.28x at size L)"
    if device.type == "cpu" and cpu_has_native_bf16():
        return PrecisionMode.FP32, "CPU has AVX512-BF16 but no AMX: BF16 measured slower than FP32 (0.66x at size L)"
    return PrecisionMode.FP32, f"{device.type}: no reduced precision measured faster than FP32 here"

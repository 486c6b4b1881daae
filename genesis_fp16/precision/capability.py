"""Device capability: how well a device runs each precision, and what ``auto`` picks.

Plain functions (torchtune style) that tests patch, at this module
(``genesis_fp16.precision.capability``), so every error path runs on any machine.
"""

from __future__ import annotations

import functools
from enum import Enum
from pathlib import Path
from typing import NamedTuple, Optional, Union

import torch

from genesis_fp16.base.settings import PrecisionMode


class Support(str, Enum):
    """How well a device runs a precision."""

    NATIVE = "native"  # hardware support, measured fast
    SLOW = "slow"  # runs correctly but measured slower than FP32 on this device
    NONE = "none"  # cannot run


class CpuInfo(NamedTuple):
    """The first CPU's model name and feature flags, as ``/proc/cpuinfo`` lists them."""

    name: str
    flags: frozenset[str]


@functools.lru_cache(maxsize=1)
def cpu_info() -> CpuInfo:
    """The one reader of ``/proc/cpuinfo`` (empty where it cannot be read: not Linux)."""
    try:
        return parse_cpuinfo(Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return CpuInfo("", frozenset())


def parse_cpuinfo(text: str) -> CpuInfo:
    """`CpuInfo` from the text of ``/proc/cpuinfo`` (its first CPU's block)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if fields:  # a blank line ends the first CPU's block
                break
            continue
        fields.setdefault(key.strip(), value.strip())
    return CpuInfo(fields.get("model name", ""), frozenset(fields.get("flags", "").split()))


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (tests patch this function, ``--cpu-kind``)."""
    return cpu_info().flags


def cpu_name() -> str:
    """The CPU's model name, or ``cpu`` where it cannot be read."""
    return cpu_info().name or "cpu"


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX-BF16: the CPU has BF16 instructions (not that they are fast)."""
    flags = cpu_flags()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_has_fast_bf16() -> bool:
    """AMX-BF16: the flag rule's test for a CPU where BF16 pays. Only a rule:
    whether it pays depends on the workload (``auto`` measures it by default,
    `genesis_fp16.precision.calibration`)."""
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
    """Why the flag rule calls ``mode`` `Support.SLOW` on ``device``: facts
    about this device only (its flags), never another host's figures; whether
    it is slower for a given model is what ``auto`` measures."""
    device = torch.device(device)
    if device.type == "cpu" and mode == PrecisionMode.BF16:
        if cpu_has_native_bf16():
            return (
                "this CPU has AVX512-BF16 but no AMX tiles; whether BF16 pays depends on the model "
                "(not measured here: precision=auto measures it)"
            )
        return "this CPU has no BF16 instructions: BF16 is emulated"
    if device.type == "cpu" and mode in (PrecisionMode.FP16, PrecisionMode.FP16_TRUE):
        return (
            "this CPU has no FP16 matrix units: FP16 autocast converts in software "
            "(not measured here: precision=auto measures it)"
        )
    return f"{mode.value} on {device.type} runs through autocast without known hardware support"


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
    ("cpu", PrecisionMode.BF16): "CPU has AMX-BF16 tiles",
}


def auto_precision(device: Union[str, torch.device]) -> tuple[PrecisionMode, str]:
    """What the flag rule picks on ``device`` and why, from its flags and type
    alone (never tf32 or fp16-true: those are asked for by name). The reasons
    state facts about this device, no figures: ``auto`` with
    ``GENESIS_FP16_AUTO_PRECISION=measure`` (the default) measures instead."""
    device = torch.device(device)
    if device.type == "cuda":
        return (
            PrecisionMode.FP16,
            "rule: CUDA device, FP16 with a gradient scaler (Precision-RL finding: least train/inference mismatch)",
        )
    if device.type == "cpu" and device_support(device, PrecisionMode.BF16) == Support.NATIVE:
        return PrecisionMode.BF16, "rule: this CPU has AMX-BF16 tiles, so BF16 (not measured for this model)"
    if device.type == "cpu" and cpu_has_native_bf16():
        return (
            PrecisionMode.FP32,
            "rule: this CPU has AVX512-BF16 but no AMX tiles, so FP32 (not measured for this model)",
        )
    return PrecisionMode.FP32, f"rule: no reduced precision with hardware support on this {device.type}, so FP32"

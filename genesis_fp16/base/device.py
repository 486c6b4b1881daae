"""Which torch device a component runs on: ``GENESIS_FP16_DEVICE`` (or an
explicit argument) turned into a `torch.device` that is there.

``auto`` is the first CUDA GPU when torch sees one, else the CPU. A device
that is not there (``cuda`` without CUDA, ``cuda:N`` past the last GPU)
follows ``on_unsupported``, as a precision the device cannot run does:
``error`` raises `DeviceUnavailableError` naming the device and the setting,
``fallback`` gives the CPU and the reason, which the caller logs. The CUDA
check is `torch.cuda.is_available`, which tests patch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from genesis_fp16.base.errors import DeviceUnavailableError  # noqa: F401  (re-exported: defined torch-free for the CLI)
from genesis_fp16.base.settings import DEVICE_CHOICES, DEVICE_PATTERN, OnUnsupported

DeviceArg = Union[str, torch.device, None]


@dataclass(frozen=True)
class DeviceChoice:
    """The device to run on, what was asked for, and why they differ
    (``fallback_reason`` is None when the asked device is used)."""

    device: torch.device
    requested: str
    fallback_reason: Optional[str] = None


def parse_device(value: DeviceArg, what: str = "device") -> str:
    """``value`` as one of auto, cpu, cuda, cuda:N (lower case); anything else is a `ValueError`."""
    if isinstance(value, torch.device):
        value = str(value)
    if not isinstance(value, str) or not DEVICE_PATTERN.fullmatch(value.strip().lower()):
        raise ValueError(f"{what}={value!r}: expected {DEVICE_CHOICES}")
    return value.strip().lower()


def missing_reason(name: str) -> Optional[str]:
    """Why the CUDA device ``name`` (cuda, cuda:N) is not there; None when it is."""
    if not torch.cuda.is_available():
        return "torch sees no CUDA device (torch.cuda.is_available() is False: no GPU, no driver, or a CPU-only torch)"
    index = torch.device(name).index
    count = torch.cuda.device_count()
    if index is not None and index >= count:
        return f"torch sees {count} CUDA device(s), numbered 0 to {count - 1}"
    return None


def resolve_device(
    value: DeviceArg, on_unsupported: OnUnsupported, *, owner: str, setting: str = "GENESIS_FP16_DEVICE"
) -> DeviceChoice:
    """The device ``value`` (auto, cpu, cuda, cuda:N or a `torch.device`)
    means here. A device that is not there: `DeviceUnavailableError` under
    ``on_unsupported=error``, else the CPU with the reason in ``fallback_reason``."""
    name = parse_device(value, f"{owner}: device")
    if name == "auto":
        return DeviceChoice(torch.device("cuda" if torch.cuda.is_available() else "cpu"), name)
    if name == "cpu":
        return DeviceChoice(torch.device("cpu"), name)
    why = missing_reason(name)
    if why is None:
        return DeviceChoice(torch.device(name), name)
    if OnUnsupported(on_unsupported) == OnUnsupported.ERROR:
        raise DeviceUnavailableError(
            f"{owner}: device {name!r} is not available: {why}. Set {setting} (or device=) to cpu or auto, "
            "or GENESIS_FP16_ON_UNSUPPORTED=fallback to run on the CPU instead"
        )
    return DeviceChoice(torch.device("cpu"), name, f"device {name!r} is not available: {why}; running on the CPU")

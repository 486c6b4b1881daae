"""What a benchmark run measures: the options, the precisions, the device."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from genesis_fp16.precision.modes import FP32_WEIGHT_MODES
from genesis_fp16.precision.request import parse_mode
from genesis_fp16.precision.capability import unsupported_reason
from genesis_fp16_tools.bench.models import QUICK_STEPS, SizeSpec, default_sizes

# the modes that keep FP32 master weights, in the vocabulary's order
# (fp16-true has none, so its quality and speed are not comparable here)
PRECISIONS: tuple[str, ...] = tuple(m.value for m in FP32_WEIGHT_MODES)
CLOCKS = ("wall", "cpu")
MODES = ("eager", "captured")


@dataclass
class BenchOptions:
    """What to measure.

    sizes / precisions: the matrix (see ``models.SIZES`` and ``PRECISIONS``); the
        default sizes are a CPU's (``models.default_sizes``: no XL); the CLI picks
        the device's.
    repeats: timed raw/ours pairs per cell; the median is reported.
    quick: CI smoke budget (few steps, short chunks).
    compile: torch.compile the model (a failure is logged and the cell runs eager).
    modes: how the trainer runs its training window's steps: ``eager``, and
        ``captured`` (each step one CUDA graph, `genesis_fp16.training.capture`;
        CUDA only). None: both on CUDA, ``eager`` elsewhere.
    chunk_s: target seconds per timed chunk (steps per chunk are calibrated to it).
    warmup_steps: untimed steps before calibration, per loop.
    threads: torch intra-op threads (None: torch's default, one per core).
    clock: ``wall`` (elapsed time) or ``cpu`` (the measuring thread's CPU time:
        on a shared machine other processes' load does not count; needs
        ``threads=1`` on a CPU device, where every kernel runs in that thread).
    """

    sizes: list[SizeSpec] = field(default_factory=lambda: default_sizes("cpu"))
    precisions: list[str] = field(default_factory=lambda: list(PRECISIONS))
    repeats: int = 11
    quick: bool = False
    compile: bool = False
    modes: Optional[list[str]] = None
    device: Optional[str] = None
    seed: int = 0
    chunk_s: float = 0.25
    warmup_steps: int = 3
    threads: Optional[int] = None
    clock: str = "wall"
    command: str = ""

    def __post_init__(self) -> None:
        self.precisions = parse_precisions(self.precisions)
        if self.modes is not None:
            self.modes = parse_modes(self.modes)
        if not (isinstance(self.repeats, int) and self.repeats >= 1):
            raise ValueError(f"repeats={self.repeats!r}: expected an integer >= 1")
        if self.threads is not None and not (isinstance(self.threads, int) and self.threads >= 1):
            raise ValueError(f"threads={self.threads!r}: expected an integer >= 1")
        if self.clock not in CLOCKS:
            raise ValueError(f"clock={self.clock!r}: expected one of {', '.join(CLOCKS)}")
        if self.clock == "cpu" and self.threads != 1:
            raise ValueError(
                "--clock cpu counts the measuring thread's CPU time, so every kernel must run in that thread: add "
                "--threads 1"
            )
        if not self.chunk_s > 0:
            raise ValueError(f"chunk_s={self.chunk_s!r}: expected seconds > 0")

    def quality_steps(self, spec: SizeSpec) -> int:
        return QUICK_STEPS[spec.name] if self.quick else spec.quality_steps


def _parse_names(values: Any, allowed: tuple[str, ...], flag: str, what: str) -> list[str]:
    """A comma list (or a list) of names from ``allowed``, in order, each once; a ValueError naming ``flag``."""
    if isinstance(values, str):
        values = values.split(",")
    names = [str(v).strip().lower() for v in values if str(v).strip()]
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        raise ValueError(
            f"{flag}: unknown {what}(s) {', '.join(unknown) or '(none given)'}; expected some of {', '.join(allowed)}"
        )
    return list(dict.fromkeys(names))


def parse_modes(values: Any) -> list[str]:
    return _parse_names(values, MODES, "--modes", "mode")


def modes_for(options: "BenchOptions", device: torch.device) -> list[str]:
    """The modes a run measures on ``device``: those asked for, else both on CUDA and ``eager`` elsewhere."""
    if options.modes is not None:
        return list(options.modes)
    return list(MODES) if device.type == "cuda" else ["eager"]


def mode_not_applicable(mode: str, device: torch.device) -> Optional[str]:
    """Why ``mode`` is not measured on ``device`` (None: it is)."""
    if mode == "captured" and device.type != "cuda":
        return f"captured steps are CUDA graphs: they need a CUDA device ({device.type} here)"
    return None


def parse_precisions(values: Any) -> list[str]:
    return _parse_names(values, PRECISIONS, "--precisions", "precision")


def check_clock(clock: str, device: torch.device) -> None:
    if clock == "cpu" and device.type != "cpu":
        raise ValueError(
            f"--clock cpu measures CPU time, which misses the {device.type} kernels' time: use --clock wall on {device}"
        )


def pick_device(requested: Optional[str]) -> torch.device:
    if requested:
        device = torch.device(requested)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"--device {requested}: CUDA is not available on this machine; use cpu")
        return device
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def not_applicable_reason(precision: str, device: torch.device) -> Optional[str]:
    """Why ``precision`` is not measured on ``device`` (None: it is measured):
    the device cannot run it at all (slow modes are measured)."""
    return unsupported_reason(device, parse_mode(precision))

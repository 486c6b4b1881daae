"""The precision decision: the one function that turns a request into what runs.

"Why did this run train in FP32?" is this module's answer. `decide` takes a
`PrecisionRequest` (what was asked for, where it came from, and whether the
kill switch or a ledger stage switched reduced precision off: the policy
layers of `genesis_fp16.rollout.policy` hand it over typed), the device and,
for ``auto``, a measurement of the workload (a
`genesis_fp16.precision.calibration.Calibration`, measured or read from the
host cache by `genesis_fp16.precision.measure`), and returns one
`PrecisionDecision`: the mode, where it came from (`Source`) and a one-line
reason. It reads no settings, no ledger and no profile, and measures nothing:
every caller decides through it (guarded training before the trainer is built,
the seed API's bare trainer through `genesis_fp16.precision.bare`, the bench),
and a trainer receives the decision and runs its mode's plugin.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Union

import torch

from genesis_fp16.base.settings import PrecisionMode
from genesis_fp16.base.telemetry import get_logger, log_once
from genesis_fp16.precision import capability
from genesis_fp16.precision.capability import Support
from genesis_fp16.precision.modes import runnable_mode
from genesis_fp16.precision.request import PrecisionRequest, Source

if TYPE_CHECKING:
    from genesis_fp16.precision.calibration import Calibration

__all__ = ["PrecisionDecision", "PrecisionRequest", "Source", "decide", "provisional"]


@dataclass(frozen=True)
class PrecisionDecision:
    """What a trainer trains in, where that came from and why."""

    mode: PrecisionMode
    """What runs."""
    source: Source
    reason: str
    """One line, for people."""
    requested: PrecisionMode = PrecisionMode.AUTO
    """What was asked for (``auto`` stays ``auto``; ``fp32`` when reduced precision is off)."""
    device: str = "cpu"
    calibration: Optional["Calibration"] = field(default=None, compare=False, repr=False)
    """The measurement an ``auto`` decision (or a slow-on-device warning) rests on; None otherwise."""

    @property
    def precision(self) -> str:
        return self.mode.value

    def as_dict(self) -> dict[str, Any]:
        """``precision``, ``source``, ``reason``, ``requested``, ``device`` as plain strings."""
        return {
            "precision": self.mode.value,
            "source": self.source.value,
            "reason": self.reason,
            "requested": self.requested.value,
            "device": self.device,
        }

    @classmethod
    def from_dict(cls, data: Any) -> "PrecisionDecision":
        """The decision `as_dict` wrote (a run's manifest keeps its learners'
        decisions, so a resume never decides again). Raises ValueError naming
        the field that is missing or not what `as_dict` writes."""
        if not isinstance(data, dict):
            raise ValueError(f"a precision decision must be an object, got {type(data).__name__}")
        for key in ("precision", "source", "reason", "requested", "device"):
            if not isinstance(data.get(key), str):
                raise ValueError(f"a precision decision needs the text field {key!r}; got {data.get(key)!r}")
        try:
            return cls(
                PrecisionMode(data["precision"]),
                Source(data["source"]),
                data["reason"],
                PrecisionMode(data["requested"]),
                data["device"],
            )
        except ValueError as exc:
            raise ValueError(f"a precision decision with an unknown value: {exc}") from None

    def line(self) -> str:
        """``bf16 (measured): ...``: the decision in one line."""
        return f"{self.mode.value} ({self.source.value}): {self.reason}"


def cached_from(measured: "Calibration") -> str:
    """Where a cached decision came from, in words: this process, or another one (the reason's opening names its pid
    and command)."""
    by = measured.measured_by or {}
    if by.get("pid") == os.getpid() and by.get("host") == socket.gethostname()[:255]:
        return "cached for this host and workload, measured earlier by this process"
    return "cached for this host and workload, measured by another process"


def _measured_speed(calibration: Optional["Calibration"], mode: PrecisionMode) -> Optional[float]:
    if calibration is None:
        return None
    return calibration.speed_low.get(mode.value, calibration.speed.get(mode.value))


def decide(
    precision: PrecisionRequest,
    device: Union[str, torch.device],
    *,
    measured: Optional["Calibration"] = None,
    cached: bool = False,
    unmeasured: str = "",
    when: str = "",
) -> PrecisionDecision:
    """The decision for the request ``precision`` on ``device``. Switched off
    (the kill switch, a ledger stage, ``enabled=False``): FP32, from the
    request's ``off_source``. ``auto`` takes ``measured`` (a calibration of
    this workload; ``cached`` when read from the host cache), else the flag
    rule with ``unmeasured`` as the why-not; ``when`` (e.g. ``"decided at the
    first batch"``) leads an ``auto`` decision's reason. A precision the device
    cannot run follows the request's ``on_unsupported`` (``error`` raises
    `UnsupportedPrecisionError`). ``precision.slow_on_device`` is logged only
    where a measurement says the named precision is slower than FP32."""
    device = torch.device(device)
    log = get_logger("genesis_fp16.precision.decision")
    requested = precision.requested
    if precision.off:
        return PrecisionDecision(
            PrecisionMode.FP32,
            precision.off_source or precision.source,
            f"reduced precision is off: {precision.off}",
            requested,
            str(device),
        )
    if precision.mode == PrecisionMode.AUTO:
        if not unmeasured and not precision.measure:
            unmeasured = "GENESIS_FP16_AUTO_PRECISION=rule"
        if (
            measured is not None
            and capability.device_support(device, PrecisionMode(measured.precision)) != Support.NONE
        ):
            src = Source.CACHED if cached else Source.MEASURED
            mode = PrecisionMode(measured.precision)
            reason = measured.reason + (f" ({cached_from(measured)})" if cached else "")
        else:
            mode, rule = capability.auto_precision(device)
            src = Source.RULE
            reason = f"rule (not measured{': ' + unmeasured if unmeasured else ''}): {rule}"
        if when:
            reason = f"{when}: {reason}"
        decision = PrecisionDecision(
            mode, src, reason, requested, str(device), measured if src != Source.RULE else None
        )
        log_once(
            log,
            f"auto:{device}:{src.value}:{mode.value}:{reason}",
            "info",
            "precision.auto_selected",
            device=str(device),
            precision=mode.value,
            source=src.value,
            reason=reason,
        )
        return decision
    asked = precision.mode
    mode, fallback = runnable_mode(asked, device, precision.on_unsupported)  # error: raises; fallback: logged
    if fallback is not None:
        return PrecisionDecision(mode, Source.FALLBACK, fallback, requested, str(device))
    support = capability.device_support(device, asked)
    reason = f"{asked.value} asked for by name ({precision.source.value})"
    speed = _measured_speed(measured, asked)
    if speed is not None and speed < 1.0:
        reason += f"; measured here at {speed:.2f}x fp32"
        log_once(
            log,
            f"slow:{device}:{asked.value}:{measured.key if measured else ''}",
            "warning",
            "precision.slow_on_device",
            device=str(device),
            precision=asked.value,
            speed=speed,
            reason=f"{asked.value} runs as asked; measured on this workload at {speed:.2f}x fp32 (at worst)",
        )
    elif support == Support.SLOW:
        reason += f"; the flag rule counts it as slow here (not measured): {capability.slow_reason(device, asked)}"
    return PrecisionDecision(asked, precision.source, reason, requested, str(device), measured)


def provisional(precision: PrecisionRequest, device: Union[str, torch.device]) -> PrecisionDecision:
    """The decision of a trainer whose ``auto`` is measured at its first batch
    (`genesis_fp16.precision.bare`), until that batch: the device's flag rule,
    `Source.RULE`, its reason saying it is pending. Not logged: the decision
    taken at the first batch is."""
    device = torch.device(device)
    mode, rule = capability.auto_precision(device)
    return PrecisionDecision(
        mode, Source.RULE, f"pending: measured at the first batch; until then {rule}", precision.requested, str(device)
    )

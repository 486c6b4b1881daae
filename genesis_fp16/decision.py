"""The precision decision: made once, before any trainer exists (or, for the
seed API's ``auto``, at the trainer's first batch).

"Why did this run train in FP32?" is this module's answer. `decide_precision`
turns what an agent asked for (an explicit argument, the settings, its
profile: `genesis_fp16.policy`'s layering, each value's origin a typed
`Source` in `EffectivePolicy.origins`), its rollout-ledger stage, the kill
switch, the device and, for ``auto``, a measurement of the workload (a
`genesis_fp16.calibration.Calibration`, measured or read from the host cache
by `genesis_fp16.autotune`) into one `PrecisionDecision`: the mode, where it
came from (`Source`) and a one-line reason. The trainer receives it (the
plugin of its mode) and never reads the ledger; apart from the seed API's
first batch, it never measures and never swaps its plugin.

`decide` is the same decision over a bare `FP16TrainingConfig` (the seed
API, ``FP16Trainer(model, optimizer, FP16TrainingConfig(precision="auto"))``).
There the trainer takes ``auto`` at its first batch, measured on that batch
(``GENESIS_FP16_AUTO_PRECISION=measure``, the default; ``when="decided at
the first batch"`` says so in the reason), and runs `pending_auto`'s provisional choice
(the flag rule's) until then; with ``GENESIS_FP16_AUTO_PRECISION=rule`` it is
the device's flag rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Union

import torch

from .config import FP16TrainingConfig
from .modes import Source
from .precision import capability, parse_mode, runnable_mode
from .precision.capability import Support
from .settings import AutoPrecision, PrecisionMode
from .telemetry import get_logger, log_once

if TYPE_CHECKING:
    from .calibration import Calibration
    from .policy import EffectivePolicy
    from .settings import Settings


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
        return {"precision": self.mode.value, "source": self.source.value, "reason": self.reason,
                "requested": self.requested.value, "device": self.device}

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
            return cls(PrecisionMode(data["precision"]), Source(data["source"]), data["reason"], PrecisionMode(data["requested"]),
                       data["device"])
        except ValueError as exc:
            raise ValueError(f"a precision decision with an unknown value: {exc}") from None

    def line(self) -> str:
        """``bf16 (measured): ...``: the decision in one line."""
        return f"{self.mode.value} ({self.source.value}): {self.reason}"


def _measured_speed(calibration: Optional["Calibration"], mode: PrecisionMode) -> Optional[float]:
    if calibration is None:
        return None
    return calibration.speed_low.get(mode.value, calibration.speed.get(mode.value))


def decide(
    config: FP16TrainingConfig,
    device: Union[str, torch.device],
    *,
    source: Source = Source.EXPLICIT,
    off_source: Optional[Source] = None,
    off_reason: str = "",
    measured: Optional["Calibration"] = None,
    cached: bool = False,
    unmeasured: str = "",
    when: str = "",
) -> PrecisionDecision:
    """The decision for ``config`` on ``device``. ``source`` is where a named
    precision came from; ``off_source``/``off_reason`` why reduced precision
    is off when ``config.enabled`` is False. ``auto`` takes ``measured`` (a
    calibration of this workload; ``cached`` when read from the host cache),
    else the flag rule with ``unmeasured`` as the why-not; ``when`` (e.g.
    ``"decided at the first batch"``) leads an ``auto`` decision's reason. A precision the
    device cannot run follows ``config.on_unsupported`` (``error`` raises
    `UnsupportedPrecisionError`). ``precision.slow_on_device`` is logged only
    where a measurement says the named precision is slower than FP32."""
    device = torch.device(device)
    log = get_logger("genesis_fp16.decision")
    requested = config.requested_precision
    asked = parse_mode(config.precision)
    if not config.enabled:
        why = off_reason or "enabled=False"
        return PrecisionDecision(PrecisionMode.FP32, off_source or source, f"reduced precision is off: {why}", requested, str(device))
    if asked == PrecisionMode.AUTO:
        if measured is not None and capability.device_support(device, PrecisionMode(measured.precision)) != Support.NONE:
            src = Source.CACHED if cached else Source.MEASURED
            mode = PrecisionMode(measured.precision)
            reason = measured.reason + (" (cached for this host and workload)" if cached else "")
        else:
            mode, rule = capability.auto_precision(device)
            src = Source.RULE
            reason = f"rule (not measured{': ' + unmeasured if unmeasured else ''}): {rule}"
        if when:
            reason = f"{when}: {reason}"
        decision = PrecisionDecision(mode, src, reason, requested, str(device), measured if src != Source.RULE else None)
        level = "info"
        log_once(log, f"auto:{device}:{src.value}:{mode.value}:{reason}", level, "precision.auto_selected",
                 device=str(device), precision=mode.value, source=src.value, reason=reason)
        return decision
    mode, fallback = runnable_mode(asked, device, config.on_unsupported)  # error: raises; fallback: logged
    if fallback is not None:
        return PrecisionDecision(mode, Source.FALLBACK, fallback, requested, str(device))
    support = capability.device_support(device, asked)
    reason = f"{asked.value} asked for by name ({source.value})"
    speed = _measured_speed(measured, asked)
    if speed is not None and speed < 1.0:
        reason += f"; measured here at {speed:.2f}x fp32"
        log_once(log, f"slow:{device}:{asked.value}:{measured.key if measured else ''}", "warning", "precision.slow_on_device",
                 device=str(device), precision=asked.value, speed=speed,
                 reason=f"{asked.value} runs as asked; measured on this workload at {speed:.2f}x fp32 (at worst)")
    elif support == Support.SLOW:
        reason += f"; the flag rule counts it as slow here (not measured): {capability.slow_reason(device, asked)}"
    return PrecisionDecision(asked, source, reason, requested, str(device), measured)


def pending_auto(config: FP16TrainingConfig, device: Union[str, torch.device]) -> PrecisionDecision:
    """The provisional decision of a trainer whose ``auto`` is measured at its
    first batch (`genesis_fp16.trainer.FP16Trainer`), until that batch: the
    device's flag rule, `Source.RULE`, its reason saying it is pending. Not
    logged: the decision taken at the first batch is."""
    device = torch.device(device)
    mode, rule = capability.auto_precision(device)
    return PrecisionDecision(mode, Source.RULE, f"pending: measured at the first batch; until then {rule}",
                             config.requested_precision, str(device))


def decide_precision(
    agent: str,
    device: Union[str, torch.device],
    *,
    settings: Optional["Settings"] = None,
    precision: Optional[str] = None,
    overrides: Optional[dict[str, Any]] = None,
    policy: Optional["EffectivePolicy"] = None,
    measured: Optional["Calibration"] = None,
    cached: bool = False,
    unmeasured: str = "",
) -> PrecisionDecision:
    """The one decision for ``agent`` on ``device``: the request layered by
    `genesis_fp16.policy.resolve_policy` (settings < profile < argument; then
    the ledger stage and the kill switch; pass ``policy`` when already
    resolved), then `decide`. ``measured`` is the workload's calibration
    (`genesis_fp16.autotune.measured_auto`) when ``auto`` was measured;
    without one, ``auto`` follows the flag rule and says why (``unmeasured``)."""
    from .policy import resolve_policy

    if policy is None:
        policy = resolve_policy(agent, settings, precision=precision, overrides=overrides)
    if not unmeasured and settings is not None and settings.auto_precision == AutoPrecision.RULE:
        unmeasured = "GENESIS_FP16_AUTO_PRECISION=rule"
    return decide(
        policy.config, device, source=policy.origin("precision"),
        off_source=policy.origin("enabled"), off_reason=policy.reason if policy.reason != "settings and profile" else "",
        measured=measured, cached=cached, unmeasured=unmeasured,
    )

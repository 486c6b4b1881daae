"""The precision request: what was asked for, as one typed value.

A request is parsed once, where the user speaks (a flag, an `EvolveConfig`
field, a setting, a constructor argument), and handed on unchanged under one
name (``precision``) to the one function that decides
(`genesis_fp16.precision.decision.decide`), which turns it, the device and
(for ``auto``) a measurement into a `PrecisionDecision`. The policy layers
(`genesis_fp16.rollout.policy`: settings < profile < argument, then the
ledger stage and the kill switch) hand the decision an effective request: the
mode asked for, where it came from (`Source`), and, when reduced precision is
switched off, by whom and why. Torch-free, so that commands that train
nothing (``--help``, ``rollout status``) read requests without importing torch.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Optional, TypeVar, Union

from genesis_fp16.base.settings import OnUnsupported, PrecisionMode

E = TypeVar("E", bound=Enum)


class Source(str, Enum):
    """Where a request, or the decision taken on it, came from."""

    EXPLICIT = "explicit"
    """An argument (``--precision``, ``precision=``, a config built by hand)."""
    SETTINGS = "settings"
    """The global settings (``GENESIS_FP16_PRECISION``, ``.env``)."""
    PROFILE = "profile"
    """The agent's profile."""
    LEDGER = "ledger"
    """The rollout ledger's stage (``off`` or ``rolled_back``: FP32)."""
    KILL_SWITCH = "kill_switch"
    """``ENABLE_FP16_TRAINING=false``."""
    MEASURED = "measured"
    """``auto``, measured on this workload now."""
    CACHED = "cached"
    """``auto``, a measurement of this workload on this host from the host cache."""
    RULE = "rule"
    """``auto`` by the device's flag rule (not measured)."""
    FALLBACK = "fallback"
    """The precision asked for cannot run on the device: the nearest at least as precise."""


def _parse(enum: type[E], value: Union[str, E], what: str) -> E:
    try:
        return enum(value.value if isinstance(value, enum) else str(value).lower())
    except ValueError:
        allowed = ", ".join(m.value for m in enum)
        raise ValueError(f"unknown {what} {value!r}: allowed values are {allowed}") from None


def parse_mode(value: Union[str, PrecisionMode]) -> PrecisionMode:
    return _parse(PrecisionMode, value, "precision")


def parse_on_unsupported(value: Union[str, OnUnsupported]) -> OnUnsupported:
    return _parse(OnUnsupported, value, "on_unsupported")


class PrecisionRequest(str):
    """What a trainer was asked to train in, as one typed value that is also its text: ``str(request)`` is the
    precision asked for (``"bf16"``; ``"fp32"`` while reduced precision is switched off), so a request compares
    with text, prints as text and goes into JSON as text; its attributes say the rest.

    ``mode``: ``auto`` or a mode by name. ``source``: where ``mode`` came from (an argument, the settings, the
    agent's profile). ``on_unsupported``: what a mode the device cannot run does (``fallback``, never downwards,
    or ``error``). ``measure``: whether ``auto`` may be measured (``GENESIS_FP16_AUTO_PRECISION=measure``), else
    the flag rule. ``off``: why reduced precision is switched off ("": it is not: the kill switch, a ledger stage,
    ``enabled=False``), and ``off_source`` by whom; the decision is then FP32 whatever ``mode`` says."""

    mode: PrecisionMode
    source: Source
    on_unsupported: OnUnsupported
    measure: bool
    off: str
    off_source: Optional[Source]

    def __new__(
        cls,
        mode: Union[str, PrecisionMode] = PrecisionMode.AUTO,
        source: Source = Source.EXPLICIT,
        on_unsupported: Union[str, OnUnsupported] = OnUnsupported.FALLBACK,
        measure: bool = True,
        off: str = "",
        off_source: Optional[Source] = None,
    ) -> "PrecisionRequest":
        parsed = parse_mode(mode)
        request = super().__new__(cls, (PrecisionMode.FP32 if off else parsed).value)
        request.mode, request.source, request.on_unsupported = (
            parsed,
            Source(source),
            parse_on_unsupported(on_unsupported),
        )
        request.measure, request.off, request.off_source = bool(measure), str(off), off_source
        return request

    @classmethod
    def parse(
        cls, value: Union[str, PrecisionMode, "PrecisionRequest"], source: Source = Source.EXPLICIT, **fields: Any
    ) -> "PrecisionRequest":
        """A request from what the user wrote (``"BF16"``, ``PrecisionMode.AUTO``); a request is returned as it is.
        A ValueError lists the allowed values."""
        if isinstance(value, PrecisionRequest):
            return value
        return cls(value, source, **fields)

    def _fields(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "source": self.source,
            "on_unsupported": self.on_unsupported,
            "measure": self.measure,
            "off": self.off,
            "off_source": self.off_source,
        }

    def replace(self, **changes: Any) -> "PrecisionRequest":
        """This request with ``changes`` (its fields by name)."""
        return PrecisionRequest(**{**self._fields(), **changes})

    @property
    def requested(self) -> PrecisionMode:
        """The precision asked for, ``fp32`` while reduced precision is switched off."""
        return PrecisionMode.FP32 if self.off else self.mode

    def switched_off(self, source: Source, why: str) -> "PrecisionRequest":
        """This request with reduced precision switched off by ``source`` (``why``, in words)."""
        return self.replace(off=why, off_source=source)

    def __reduce__(self) -> tuple[Any, ...]:  # copies and pickles keep the fields, not only the text
        fields = self._fields()
        return (_rebuild, (fields,))

    def __repr__(self) -> str:
        off = f", off={self.off!r}" if self.off else ""
        return f"PrecisionRequest({self.mode.value!r}, source={self.source.value!r}{off})"


def _rebuild(fields: dict[str, Any]) -> PrecisionRequest:
    return PrecisionRequest(**fields)

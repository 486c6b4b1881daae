"""A precision mode or an ``on_unsupported`` policy parsed from text, with an
error that lists the allowed values, and `Source`: where a precision decision
came from (`genesis_fp16.policy` records it per field, typed, and
`genesis_fp16.decision` reads it from there). Torch-free, so that
configuration (``config``, ``profiles``) can be read by commands that train
nothing; ``genesis_fp16.precision`` re-exports both parsers,
``genesis_fp16.decision`` re-exports `Source`."""

from __future__ import annotations

from enum import Enum
from typing import TypeVar, Union

from .settings import OnUnsupported, PrecisionMode

E = TypeVar("E", bound=Enum)


class Source(str, Enum):
    """Where a decision came from."""

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

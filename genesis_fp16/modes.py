"""A precision mode or an ``on_unsupported`` policy parsed from text, with an
error that lists the allowed values. Torch-free, so that configuration
(``config``, ``profiles``) can be read by commands that train nothing;
``genesis_fp16.precision`` re-exports both parsers."""

from __future__ import annotations

from enum import Enum
from typing import TypeVar, Union

from .settings import OnUnsupported, PrecisionMode

E = TypeVar("E", bound=Enum)


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

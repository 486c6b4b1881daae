"""A calibration record read back from the host's precision cache, checked
as untrusted input (issue 44): every field's type and range, the key against
its workload, and the verdict against what `calibration.decide` makes of the
record's own figures today. A record that fails is a `RecordError` naming
what is wrong; `genesis_fp16.precision.cache` reads such an entry as absent."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import fields
from datetime import datetime
from typing import Any, Optional

from genesis_fp16.precision.calibration import (
    CANDIDATE_ORDER,
    Calibration,
    RECORD_VERSION,
    INF_TEXT,
    verdict,
    speeds,
    workload_key,
)
from genesis_fp16.base.settings import PrecisionMode


class RecordError(ValueError):
    """A record that cannot be used, with what is wrong with it; ``stale`` for
    one of another version (not a fault: older decisions are measured again)."""

    def __init__(self, message: str, stale: bool = False) -> None:
        super().__init__(message)
        self.stale = stale


MAX_STEPS = 10**9
"""The most optimizer steps a record may claim (a larger number is not a calibration's)."""


def _show(value: Any, limit: int = 60) -> str:
    """An untrusted value for a message: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _mapping(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RecordError(f"{name} is {type(value).__name__}, expected an object")
    return value


def _text(value: Any, name: str, limit: int = 10_000) -> str:
    if not isinstance(value, str):
        raise RecordError(f"{name} is {_show(value, 40)} ({type(value).__name__}), expected text")
    if len(value) > limit:
        raise RecordError(f"{name} is {len(value)} characters long, expected text of at most {limit}")
    return value


def _figure(
    value: Any, name: str, *, optional: bool = False, infinite: bool = False, signed: bool = False
) -> Optional[float]:
    """A finite number, non-negative unless ``signed`` (``"inf"`` too where ``infinite``; None where ``optional``)."""
    if value is None and optional:
        return None
    if value == INF_TEXT and infinite:
        return math.inf
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or (value < 0 and not signed)
    ):
        expected = (
            ("a finite number" if signed else "a non-negative finite number")
            + (' or "inf"' if infinite else "")
            + (" or null" if optional else "")
        )
        raise RecordError(f"{name} is {_show(value)}, expected {expected}")
    return float(value)


def _modes(value: Any, name: str) -> dict[str, Any]:
    found = _mapping(value, name)
    allowed = {m.value for m in CANDIDATE_ORDER}
    for mode in found:
        if mode not in allowed:
            raise RecordError(f"{name} names {_show(mode)}, expected precisions among {', '.join(sorted(allowed))}")
    return found


def _integer(value: Any, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RecordError(f"{name} is {_show(value)}, expected an integer from {low} to {high}")
    return value


def _normal(value: Any) -> Any:
    """``value`` as JSON reads it back (tuples as lists), for comparing a workload with a record's."""
    return json.loads(json.dumps(value, sort_keys=True))


def parse_record(
    record: Any, *, key: Optional[str] = None, described: Optional[Mapping[str, Any]] = None
) -> Calibration:
    """The `Calibration` a record read back holds, checked as untrusted input:
    every field of its type and range; its ``key`` the hash of its own
    workload (and ``key`` when given, ``described`` when given: this
    workload); its verdict and ``passed`` what `decide`, today's rule, takes
    from its own figures; ``speed`` what its seconds give. Its reason is
    written again from the figures (a stored one is not trusted). Raises
    `RecordError` saying what is wrong (``stale`` for another version)."""
    record = _mapping(record, "the entry")
    if record.get("version") != RECORD_VERSION:
        raise RecordError(
            f"it is a record of version {_show(record.get('version'))}, this version reads {RECORD_VERSION}", stale=True
        )
    names = {f.name for f in fields(Calibration)}
    missing, extra = sorted(names - set(record)), sorted(set(record) - names)
    if missing or extra:
        raise RecordError(
            f"its fields differ from a calibration's ({'missing ' + ', '.join(missing) if missing else ''}"
            f"{'; ' if missing and extra else ''}{'unknown ' + _show(extra) if extra else ''})"
        )
    own_key = _text(record["key"], "key", 64)
    if key is not None and own_key != key:
        raise RecordError(f"it is the entry of workload {own_key!r}, filed under {key!r}")
    work = _mapping(record["workload"], "workload")
    try:
        if workload_key(work) != own_key:
            raise RecordError("its key is not the hash of its workload (an entry edited or copied from another host)")
    except (TypeError, ValueError) as exc:
        raise RecordError(f"its workload cannot be hashed ({exc})") from None
    if described is not None and _normal(work) != _normal(described):
        mine, here = _normal(work), _normal(described)
        differ = sorted(k for k in set(mine) | set(here) if mine.get(k) != here.get(k))
        raise RecordError(
            f"its workload is not this one ({', '.join(differ)} differ: another host's or another workload's entry)"
        )
    seconds = {m: _figure(v, f"seconds[{m}]") for m, v in _modes(record["seconds"], "seconds").items()}
    if PrecisionMode.FP32.value not in seconds:
        raise RecordError("seconds has no fp32 timing, which every measurement has")
    speed = {m: _figure(v, f"speed[{m}]", infinite=True) for m, v in _modes(record["speed"], "speed").items()}
    low = {m: _figure(v, f"speed_low[{m}]", infinite=True) for m, v in _modes(record["speed_low"], "speed_low").items()}
    ratios = {
        m: _figure(v, f"loss_ratio[{m}]", optional=True, infinite=True, signed=True)
        for m, v in _modes(record["loss_ratio"], "loss_ratio").items()
    }
    passed = _modes(record["passed"], "passed")
    if not all(isinstance(v, bool) for v in passed.values()):
        raise RecordError(f"passed is {_show(passed)}, expected true or false per precision")
    failed = {m: _text(v, f"failed[{m}]", 1000) for m, v in _modes(record["failed"], "failed").items()}
    for name, values in (("speed", speed), ("speed_low", low), ("loss_ratio", ratios), ("passed", passed)):
        if set(values) != set(seconds):
            raise RecordError(
                f"{name} names {_show(sorted(values))}, seconds {sorted(seconds)}: a measurement gives both for the "
                "same precisions"
            )
    if set(failed) & set(seconds):
        raise RecordError(f"failed names {sorted(set(failed) & set(seconds))}, which also have timings")
    cost_s = _figure(record["cost_s"], "cost_s")
    steps = _integer(record["steps"], "steps", 0, MAX_STEPS)
    at = _text(record["at"], "at", 64)
    try:
        datetime.fromisoformat(at)
    except ValueError:
        raise RecordError(f"at is {_show(at)}, expected an ISO 8601 time") from None
    by = _mapping(record["measured_by"], "measured_by")
    if set(by) != {"host", "pid", "command"}:
        raise RecordError(f"measured_by names {_show(sorted(by))}, expected host, pid, command")
    by = {
        "host": _text(by["host"], "measured_by.host", 255),
        "pid": _integer(by["pid"], "measured_by.pid", 0, 2**31),
        "command": _text(by["command"], "measured_by.command", 200),
    }
    load = _mapping(record["load"], "load")
    if set(load) != {"average", "cpus"}:
        raise RecordError(f"load names {_show(sorted(load))}, expected average, cpus")
    average = load["average"]
    if average is not None and (not isinstance(average, list) or len(average) != 3):
        raise RecordError(f"load.average is {_show(average)}, expected three numbers or null")
    load = {
        "average": None if average is None else [_figure(v, "load.average") for v in average],
        "cpus": None if load["cpus"] is None else _integer(load["cpus"], "load.cpus", 1, 1 << 20),
    }
    precision = _text(record["precision"], "precision", 16)
    derived, reason, derived_passed = verdict(seconds, ratios, failed, low, at, by, load)
    if precision != derived:
        raise RecordError(
            f"its verdict {precision!r} does not follow from its own figures: today's rule gives {derived!r}"
        )
    if passed != derived_passed:
        raise RecordError(
            f"its passed {passed} does not follow from its loss ratios: today's rule gives {derived_passed}"
        )
    for m, s in speeds(seconds).items():
        if not (speed[m] == s or math.isclose(speed[m], s, rel_tol=1e-9)):
            raise RecordError(f"speed[{m}] is {speed[m]!r}, its seconds give {s!r}")
        if low[m] > speed[m] * (1 + 1e-9):
            raise RecordError(f"speed_low[{m}] {low[m]!r} is above speed[{m}] {speed[m]!r}: a lower bound is not")
    return Calibration(
        key=own_key,
        workload=work,
        precision=precision,
        reason=reason,
        seconds=seconds,
        speed=speed,
        speed_low=low,
        loss_ratio=ratios,
        passed=passed,
        failed=failed,
        cost_s=cost_s or 0.0,
        steps=steps,
        at=at,
        measured_by=by,
        load=load,
    )


def from_record(record: Any) -> Optional[Calibration]:
    """The calibration a record holds, or None for one of another version or
    shape, or whose verdict does not follow from its figures (`parse_record`)."""
    try:
        return parse_record(record)
    except RecordError:
        return None

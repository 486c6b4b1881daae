"""The fields of a run manifest (``agents.runs``) and how they are checked:
the errors, the version, the field predicates. A leaf module: the config, the
search space and the manifest reader all check their records with it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional, Sequence

MANIFEST_VERSION = 4
"""4: every seed from `genesis_fp16.base.seeds.stream_seed` (a run's start states, start order and CMA-ES draws differ
from
version 3's, so a version-3 run cannot go on consistently); 3: one CMA-ES carries the population, a critic refines it;
2: raced evaluations, probe search."""
MANIFEST_CHANGES = {
    3: "the loop in which CMA-ES carries the population and a critic refines it",
    4: "seeds derived by stream name (genesis_fp16.base.seeds), which gives a run other start states and CMA-ES draws",
}
"""What each version changed, for the error that refuses an older manifest."""
UNRESUMABLE = (
    "the run cannot be resumed as it is: restore the field, or start a new run (`genesis-fp16 state prune` deletes "
    "this one)"
)
RESUME_FIELDS = ("config", "real_episodes", "state", "search", "pool", "generations", "obs_stats", "time")
"""The fields a resume reads without a default (a manifest this code writes has them all from its first write)."""


class RunError(ValueError):
    """A run cannot be resumed as asked (unknown, finished, running, other
    options, unreadable manifest); the message says what to do."""


class ManifestFieldError(RunError):
    """One field of a run manifest holds what this code cannot continue from;
    ``field`` is its path in the manifest (``pool[0].params``, ``config.seed``)."""

    def __init__(self, field: str, value: Any, expected: str) -> None:
        self.field, self.value, self.expected = field, value, expected
        super().__init__(f"field {field}: {shown(value)}; expected {expected}")

    def within(self, prefix: str) -> "ManifestFieldError":
        """The same problem, its field under ``prefix`` (``pool[3].``)."""
        return ManifestFieldError(prefix + self.field if self.field else prefix.rstrip("."), self.value, self.expected)


MISSING = object()


def shown(value: Any, limit: int = 60) -> str:
    """A field's value as an error shows it: JSON-like, cut to ``limit`` characters."""
    if value is MISSING:
        return "missing"
    try:
        text = json.dumps(value, default=repr)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_int(value: Any, least: Optional[int] = None, most: Optional[int] = None) -> bool:
    """A whole number (a JSON integer, not a bool) in [least, most]."""
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and (least is None or value >= least)
        and (most is None or value <= most)
    )


def is_number(value: Any, *, finite: bool = True) -> bool:
    """A JSON number (not a bool); ``finite``: not NaN nor infinite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and (not finite or math.isfinite(value))


def is_numbers(value: Any, *, finite: bool = True) -> bool:
    """A list of numbers (see `is_number`)."""
    return isinstance(value, list) and all(is_number(v, finite=finite) for v in value)


WHOLE_MAX = 2**53 - 1
"""The largest whole number (in size) a manifest may hold: far past any count or seed a run writes, and the largest JSON
readers keep exact. A larger one would overflow SQLite's or NumPy's 64-bit integers later, in the middle of a run."""


def check_whole_numbers(data: Any) -> None:
    """Raise `ManifestFieldError` for the first whole number anywhere in ``data`` (nested objects and lists) larger in
    size than `WHOLE_MAX`: the range every whole-number field shares, before each field's own check."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        field, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((f"{field}.{key}" if field else str(key), v) for key, v in reversed(list(value.items())))
        elif isinstance(value, list):
            stack.extend((f"{field}[{i}]", v) for i, v in reversed(list(enumerate(value))))
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > WHOLE_MAX:
            raise ManifestFieldError(
                field,
                value,
                f"a whole number from -{WHOLE_MAX} to {WHOLE_MAX} (2**53 - 1): no count or seed of a run comes near it",
            )


def check_fields(
    data: Any,
    checks: dict[str, tuple[Any, str]],
    *,
    required: Sequence[str] = (),
    known_only: bool = False,
    what: str = "an object",
) -> None:
    """Raise `ManifestFieldError` for the first field of the mapping ``data`` that fails its check
    (``checks``: name -> (predicate, what was expected)), is in ``required`` and missing, or (``known_only``)
    is not among ``checks``. An empty field name stands for ``data`` itself."""
    if not isinstance(data, dict):
        raise ManifestFieldError("", data, what)
    for name in required:
        if name not in data:
            raise ManifestFieldError(name, MISSING, checks[name][1])
    if known_only:
        for name in data:
            if name not in checks:
                raise ManifestFieldError(str(name), data[name], f"no such field (the fields are {', '.join(checks)})")
    for name, (ok, expected) in checks.items():
        if name in data and not ok(data[name]):
            raise ManifestFieldError(name, data[name], expected)


class Manifest(dict):  # type: ignore[type-arg]
    """A run manifest as read: the dict, and ``path``, the file it was read
    from (for errors that name it)."""

    path: Optional[Path] = None

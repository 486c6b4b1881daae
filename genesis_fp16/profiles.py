"""Per-agent tuning profiles (TOML), layered over the global settings.

File (default ``<state_dir>/profiles.toml``, or ``GENESIS_FP16_PROFILES_FILE``)::

    [defaults]                      # every agent, under its own table
    growth_interval = 1000

    [agents.world_model]
    precision = "bf16"
    init_scale = 1024.0
    [agents.world_model.thresholds]
    overflow_rollback = 0.25

Keys use the settings' names (``init_scale``, not the trainer's
``loss_scale``). A bad key or value fails with the agent, the key and what is
allowed. Precedence: settings < ``[defaults]`` < ``[agents.NAME]`` < explicit
argument (see :mod:`genesis_fp16.policy`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional, Union

from .settings import OnUnsupported, PrecisionMode, Settings, read_utf8

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

# guard thresholds and their defaults (docs/ROLLBACK_PLAN.md explains each)
THRESHOLD_DEFAULTS: dict[str, float | int] = {
    "failed_fraction": 0.5,  # P0: more than this fraction of steps skipped
    "overflow_rollback": 0.30,  # P1: overflow rate above this rolls back
    "overflow_warn": 0.10,  # P2: overflow rate above this warns
    "val_loss_ratio": 1.20,  # P1: val loss above this multiple of the FP32 reference rolls back
    "throughput_ratio": 0.80,  # P2: throughput below this fraction of FP32 warns
    "min_steps": 10,  # rates are judged only after this many optimizer steps
}

# profile key -> FP16TrainingConfig field
TRAINER_KEYS = {
    "enabled": "enabled",
    "precision": "precision",
    "on_unsupported": "on_unsupported",
    "init_scale": "loss_scale",
    "growth_factor": "growth_factor",
    "backoff_factor": "backoff_factor",
    "growth_interval": "growth_interval",
    "max_grad_norm": "max_grad_norm",
    "grad_accumulation_steps": "grad_accumulation_steps",
    "nonfinite_streak_threshold": "nonfinite_streak_threshold",
}
SECTION_KEYS = ("defaults", "agents")


class ProfileError(ValueError):
    """An invalid profile file: names the file, the agent, the key and what is allowed."""


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _integer(value: Any) -> Optional[int]:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _check(pred: Callable[[Any], Any], allowed: str) -> Callable[[Any], tuple[bool, Any, str]]:
    def check(value: Any) -> tuple[bool, Any, str]:
        result = pred(value)
        return (result is not None, result, allowed)

    return check


def _enum(enum: Any) -> Callable[[Any], tuple[bool, Any, str]]:
    allowed = ", ".join(m.value for m in enum)
    return _check(lambda v: v.lower() if isinstance(v, str) and v.lower() in {m.value for m in enum} else None, allowed)


def _grad_norm(value: Any) -> tuple[bool, Any, str]:
    allowed = "a number > 0, or \"none\" to disable clipping"
    if isinstance(value, str) and value.strip().lower() in {"none", "off", "null"}:
        return True, None, allowed
    num = _number(value)
    return (num is not None and num > 0, num, allowed)


def _bounded(lo: float, hi: Optional[float], *, lo_open: bool = True, hi_open: bool = True, integer: bool = False):
    parts = [f"{'>' if lo_open else '>='} {lo:g}"]
    if hi is not None:
        parts.append(f"{'<' if hi_open else '<='} {hi:g}")
    allowed = f"{'an integer' if integer else 'a number'} {' and '.join(parts)}"

    def pred(value: Any) -> Any:
        num = _integer(value) if integer else _number(value)
        if num is None:
            return None
        if (num <= lo) if lo_open else (num < lo):
            return None
        if hi is not None and ((num >= hi) if hi_open else (num > hi)):
            return None
        return num

    return _check(pred, allowed)


_BOOL = _check(lambda v: v if isinstance(v, bool) else None, "true or false")

TRAINER_VALIDATORS = {
    "enabled": _BOOL,
    "precision": _enum(PrecisionMode),
    "on_unsupported": _enum(OnUnsupported),
    "init_scale": _bounded(0, None),
    "growth_factor": _bounded(1, None),
    "backoff_factor": _bounded(0, 1),
    "growth_interval": _bounded(1, None, lo_open=False, integer=True),
    "max_grad_norm": _grad_norm,
    "grad_accumulation_steps": _bounded(1, None, lo_open=False, integer=True),
    "nonfinite_streak_threshold": _bounded(1, None, lo_open=False, integer=True),
}
THRESHOLD_VALIDATORS = {
    "failed_fraction": _bounded(0, 1, hi_open=False),
    "overflow_rollback": _bounded(0, 1, hi_open=False),
    "overflow_warn": _bounded(0, 1, hi_open=False),
    "val_loss_ratio": _bounded(1, None, lo_open=False),
    "throughput_ratio": _bounded(0, 1, hi_open=False),
    "min_steps": _bounded(1, None, lo_open=False, integer=True),
}


@dataclass
class Profile:
    """One agent's layer: profile keys (settings names) and guard thresholds."""

    agent: str
    values: dict[str, Any] = field(default_factory=dict)
    thresholds: dict[str, Any] = field(default_factory=dict)


def _where(source: Union[str, Path], agent: Optional[str]) -> str:
    section = "[defaults]" if agent is None else f"agent {agent!r}"
    return f"{source}: {section}"


def validate_table(
    table: Any, source: Union[str, Path], agent: Optional[str], inherited: Optional[dict[str, Any]] = None
) -> Profile:
    """Validate one ``[defaults]`` or ``[agents.NAME]`` table; ``inherited`` are
    the ``[defaults.thresholds]`` an agent's table is layered over."""
    where = _where(source, agent)
    if not isinstance(table, dict):
        raise ProfileError(f"{where}: expected a table of keys, got {type(table).__name__}")
    values: dict[str, Any] = {}
    thresholds: dict[str, Any] = {}
    for key, value in table.items():
        if key == "thresholds":
            if not isinstance(value, dict):
                raise ProfileError(f"{where}: key 'thresholds' must be a table, e.g. [agents.NAME.thresholds]")
            for tkey, tvalue in value.items():
                if tkey not in THRESHOLD_VALIDATORS:
                    raise ProfileError(
                        f"{where}: unknown threshold {tkey!r}; allowed thresholds are {', '.join(THRESHOLD_VALIDATORS)}"
                    )
                ok, parsed, allowed = THRESHOLD_VALIDATORS[tkey](tvalue)
                if not ok:
                    raise ProfileError(f"{where}: thresholds.{tkey} = {tvalue!r} is invalid; allowed values are {allowed}")
                thresholds[tkey] = parsed
            continue
        if key not in TRAINER_VALIDATORS:
            raise ProfileError(
                f"{where}: unknown key {key!r}; allowed keys are {', '.join(TRAINER_VALIDATORS)}, thresholds"
            )
        ok, parsed, allowed = TRAINER_VALIDATORS[key](value)
        if not ok:
            raise ProfileError(f"{where}: {key} = {value!r} is invalid; allowed values are {allowed}")
        values[key] = parsed
    inherited = inherited or {}
    merged = {**THRESHOLD_DEFAULTS, **inherited, **thresholds}
    if merged["overflow_warn"] > merged["overflow_rollback"]:
        def shown(key: str) -> str:
            origin = "" if key in thresholds or key not in inherited else ", from [defaults]"
            return f"{merged[key]}{origin}"

        raise ProfileError(
            f"{where}: thresholds.overflow_warn ({shown('overflow_warn')}) must not exceed "
            f"thresholds.overflow_rollback ({shown('overflow_rollback')})"
        )
    return Profile(agent or "*", values, thresholds)


@dataclass
class ProfileFile:
    path: Optional[Path]
    defaults: Profile
    agents: dict[str, Profile]

    def layer(self, agent: str) -> Profile:
        """``[defaults]`` under ``[agents.NAME]``."""
        own = self.agents.get(agent, Profile(agent))
        return Profile(
            agent,
            {**self.defaults.values, **own.values},
            {**self.defaults.thresholds, **own.thresholds},
        )

    def source_of(self, agent: str, key: str) -> str:
        section = f"agents.{agent}" if key in self.agents.get(agent, Profile(agent)).values else "defaults"
        return f"{self.path}[{section}]"


def parse_profiles(data: Any, source: Union[str, Path] = "<profiles>") -> ProfileFile:
    if not isinstance(data, dict):
        raise ProfileError(f"{source}: expected a TOML document with [defaults] and [agents.NAME] tables")
    unknown = [k for k in data if k not in SECTION_KEYS]
    if unknown:
        raise ProfileError(
            f"{source}: unknown top-level key(s) {', '.join(map(repr, unknown))}; "
            "allowed are [defaults] and [agents.NAME] tables"
        )
    defaults = validate_table(data.get("defaults", {}), source, None)
    agents_table = data.get("agents", {})
    if not isinstance(agents_table, dict):
        raise ProfileError(f"{source}: 'agents' must hold tables, one per agent: [agents.NAME]")
    agents = {name: validate_table(table, source, name, defaults.thresholds) for name, table in agents_table.items()}
    return ProfileFile(Path(source) if source != "<profiles>" else None, defaults, agents)


def _read_toml(path: Path) -> dict[str, Any]:
    """The file's TOML; not UTF-8 or not TOML is a ProfileError naming the file and line."""
    try:
        return tomllib.loads(read_utf8(path, "profile file", ProfileError))
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML ({exc})") from None


_CACHE: dict[Path, tuple[float, int, ProfileFile]] = {}


def load_profiles(path: Union[str, Path]) -> ProfileFile:
    """Read and validate a profile file (cached until the file changes)."""
    path = Path(path)
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise ProfileError(f"{path}: profile file does not exist") from None
    cached = _CACHE.get(path)
    if cached and cached[0] == stat.st_mtime and cached[1] == stat.st_size:
        return cached[2]
    parsed = parse_profiles(_read_toml(path), path)
    _CACHE[path] = (stat.st_mtime, stat.st_size, parsed)
    return parsed


def profiles_for(settings: Settings) -> Optional[ProfileFile]:
    """The settings' profile file, or None when there is none. An explicitly
    configured file that does not exist is an error, not an empty profile."""
    path = settings.effective_profiles_file
    if not Path(path).is_file():
        if settings.profiles_file is not None:
            raise ProfileError(
                f"GENESIS_FP16_PROFILES_FILE={str(path)!r}: file not found; create it "
                "(see configs/profiles.example.toml) or unset the variable"
            )
        return None
    return load_profiles(path)


def profile_layer(agent: str, settings: Settings) -> dict[str, Any]:
    """Trainer-config values and guard thresholds from ``agent``'s profile.

    Returns ``{"trainer": {config field: value}, "thresholds": {...}, "source": path}``
    (empty dicts and source None without a profile file).
    """
    pf = profiles_for(settings)
    if pf is None:
        return {"trainer": {}, "thresholds": {}, "source": None, "sources": {}}
    layer = pf.layer(agent)
    trainer = {TRAINER_KEYS[k]: v for k, v in layer.values.items()}
    sources = {TRAINER_KEYS[k]: pf.source_of(agent, k) for k in layer.values}
    return {"trainer": trainer, "thresholds": dict(layer.thresholds), "source": str(pf.path), "sources": sources}


def thresholds_for(agent: str, settings: Settings) -> dict[str, Any]:
    """Guard thresholds for ``agent``: defaults overlaid by its profile."""
    return {**THRESHOLD_DEFAULTS, **profile_layer(agent, settings)["thresholds"]}


def to_toml_document(pf_data: dict[str, Any]) -> str:
    """Serialise a profiles document (plain dicts) as TOML; ``None`` grad norm becomes "none"."""
    import tomli_w

    def clean(table: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in table.items():
            if isinstance(value, dict):
                out[key] = clean(value)
            elif value is None:
                out[key] = "none"
            else:
                out[key] = value
        return out

    return tomli_w.dumps(clean(pf_data))


def write_profiles(path: Union[str, Path], data: dict[str, Any], *, backup: bool = True) -> dict[str, Optional[Path]]:
    """Validate ``data`` and write it to ``path`` atomically; the old file is
    first copied (atomically) to ``<name>.bak.<UTC timestamp>``."""
    from .checkpoint import atomic_write_bytes, atomic_write_text

    path = Path(path)
    text = to_toml_document(data)
    parse_profiles(tomllib.loads(text), path)  # never write a file that would not load
    backup_path: Optional[Path] = None
    if backup and path.is_file():
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
        backup_path = path.with_name(f"{path.name}.bak.{stamp}")
        atomic_write_bytes(backup_path, path.read_bytes())
    atomic_write_text(path, text)
    _CACHE.pop(path, None)
    return {"path": path, "backup": backup_path}


def raw_document(path: Union[str, Path]) -> dict[str, Any]:
    """The file's TOML as plain dicts (empty when the file does not exist)."""
    path = Path(path)
    if not path.is_file():
        return {}
    return _read_toml(path)

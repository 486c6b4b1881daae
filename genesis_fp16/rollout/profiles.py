"""Per-agent tuning profiles (TOML), layered over the global settings.

File (default ``<state_dir>/profiles.toml``, or ``GENESIS_FP16_PROFILES_FILE``)::

    [defaults]                      # every agent, under its own table
    growth_interval = 1000

    [agents.world_model]
    precision = "bf16"
    init_scale = 1024.0
    [agents.world_model.thresholds]
    overflow_rollback = 0.25

Keys use the settings' names, which are the trainer config's too
(``init_scale``, as torch names it): a table is validated by `ProfileTable` (the settings'
`PrecisionConfig` plus ``enabled``), its
``thresholds`` by `GuardThresholds`. A bad key or value fails with the
agent, the key and what is allowed. Precedence: settings < ``[defaults]`` <
``[agents.NAME]`` < explicit argument (see `genesis_fp16.rollout.policy`).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, field_validator

from genesis_fp16.precision.quality import CANARY_LOSS_RATIO, LOSS_FLOOR
from genesis_fp16.base.names import AgentNameError, check_agent_name
from genesis_fp16.base.settings import PrecisionConfig, Settings, allowed_values, no_bool, read_toml
from genesis_fp16.base.storage import FileStamp, file_stamp

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]


class GuardThresholds(BaseModel):
    """The rollback guard's thresholds (docs/ROLLBACK_PLAN.md explains each)."""

    model_config = ConfigDict(extra="forbid")

    failed_fraction: float = Field(0.5, gt=0, le=1, description="P0: more than this fraction of steps skipped")
    overflow_rollback: float = Field(0.30, gt=0, le=1, description="P1: overflow rate above this rolls back")
    overflow_warn: float = Field(0.10, gt=0, le=1, description="P2: overflow rate above this warns")
    # 1.20: FP32's own seed-to-seed val-loss ratio, pooled over the workloads measured,
    # crosses it about one time in 20 (docs/ROLLBACK_PLAN.md): an alarm, not yet a rollback
    val_loss_ratio: float = Field(
        1.20,
        ge=1,
        allow_inf_nan=False,
        description="P1 (stage shadow): a shadow whose val loss is above this multiple of FP32's alarms; confirmed "
        "alarms roll back",
    )
    canary_val_loss_ratio: float = Field(  # the FP32 check's limit, as the measurement of auto takes it
        CANARY_LOSS_RATIO,
        ge=1,
        allow_inf_nan=False,
        description="P1: a canary whose val loss is above this multiple of FP32's alarms; a shadow above it rolls "
        "back alone",
    )
    val_loss_floor: float = Field(  # the FP32 check's floor (genesis_fp16.precision.quality.LOSS_FLOOR)
        LOSS_FLOOR,
        ge=0,
        allow_inf_nan=False,
        description="val-loss ratios are taken over max(FP32 val loss, this): tiny losses do not alarm on a ratio "
        "alone",
    )
    throughput_ratio: float = Field(0.80, gt=0, le=1, description="P2: throughput below this fraction of FP32 warns")
    min_steps: int = Field(10, ge=1, le=2**31 - 1, description="rates are judged only after this many optimizer steps")
    canary_every: int = Field(
        5, ge=0, le=2**31 - 1, description="stage on: an FP32 canary every Nth training call (0: never)"
    )
    # the confirmation windows are kept in the rollout ledger: bounded, like the list they hold
    canary_confirm: int = Field(
        2, ge=1, le=1000, description="canary alarms among the last canary_window that roll back"
    )
    canary_window: int = Field(3, ge=1, le=1000, description="how many recent canaries the confirmation counts over")
    canary_kl: float = Field(
        0.1,
        gt=0,
        allow_inf_nan=False,
        description="PPO canary: KL(FP32 || reduced) of the held batch's policy above this alarms",
    )
    canary_logp_delta: float = Field(
        1.0,
        gt=0,
        allow_inf_nan=False,
        description="PPO canary: max |log-prob delta| on the held batch above this alarms",
    )
    canary_value_delta: float = Field(
        0.1,
        gt=0,
        allow_inf_nan=False,
        description="PPO canary: max |value delta| / max(1, max |FP32 value|) above this alarms",
    )

    _no_bool = field_validator("*", mode="before")(no_bool)

    def __getitem__(self, name: str) -> Any:
        """``thresholds["name"]``: read access by a name held as a string (a
        profile key); code that knows the name uses the attribute."""
        if name not in type(self).model_fields:
            raise KeyError(f"unknown threshold {name!r}; allowed are {', '.join(type(self).model_fields)}")
        return getattr(self, name)


class ProfileTable(PrecisionConfig):
    """The trainer keys of one ``[defaults]`` or ``[agents.NAME]`` table."""

    enabled: StrictBool = Field(True, description="false trains this agent in FP32")


THRESHOLD_DEFAULTS: dict[str, float | int] = GuardThresholds().model_dump()
# profile keys in the order error messages list them
PROFILE_KEYS = ("enabled", *PrecisionConfig.model_fields)
SECTION_KEYS = ("defaults", "agents")


class ProfileError(ValueError):
    """An invalid profile file: names the file, the agent, the key and what is allowed."""


def _validated(
    model: type[BaseModel], table: dict[str, Any], where: str, kind: str, names: list[str]
) -> dict[str, Any]:
    """The keys ``table`` sets, validated by ``model``; a ProfileError (one
    line) names every bad key and what it allows."""
    try:
        parsed = model.model_validate(table)
    except ValidationError as err:
        prefix = "thresholds." if kind == "threshold" else ""
        problems = []
        for item in err.errors():
            key = str(item["loc"][0])
            if item["type"] == "extra_forbidden":
                close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                problems.append(f"unknown {kind} {key!r}; allowed {kind}s are {', '.join(names)}{hint}")
            else:
                allowed = allowed_values(model, key)
                problems.append(f"{prefix}{key} = {item['input']!r} is invalid; allowed values are {allowed}")
        raise ProfileError(f"{where}: " + "; ".join(problems)) from None
    return parsed.model_dump(mode="json", include=parsed.model_fields_set)


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
    values = dict(table)
    thresholds = values.pop("thresholds", {})
    if not isinstance(thresholds, dict):
        raise ProfileError(f"{where}: key 'thresholds' must be a table, e.g. [agents.NAME.thresholds]")
    nested = [key for key, value in values.items() if isinstance(value, dict)]
    if nested and agent is not None:  # [agents.world_model.Pendulum-v1]: TOML split the name at its dot
        raise ProfileError(
            f"{where}: table {nested[0]!r} inside it; an agent name with a dot is quoted in TOML: "
            f'[agents."{agent}.{nested[0]}"]'
        )
    values = _validated(ProfileTable, values, where, "key", [*PROFILE_KEYS, "thresholds"])
    thresholds = _validated(GuardThresholds, thresholds, where, "threshold", list(GuardThresholds.model_fields))
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
    if merged["canary_confirm"] > merged["canary_window"]:
        raise ProfileError(
            f"{where}: thresholds.canary_confirm ({merged['canary_confirm']}) must not exceed "
            f"thresholds.canary_window ({merged['canary_window']}): a rollback needs that many alarms among that many "
            "canaries"
        )
    return Profile(agent or "*", values, thresholds)


@dataclass
class ProfileFile:
    path: Optional[Path]
    defaults: Profile
    agents: dict[str, Profile]

    def lineage(self, agent: str) -> list[str]:
        """The tables that apply to ``agent``, least specific first: a dotted
        name inherits its family's (``world_model.Pendulum-v1`` is layered over
        ``world_model``), so one table configures every task's world model."""
        parts = agent.split(".")
        names = [".".join(parts[: i + 1]) for i in range(len(parts))]
        return [name for name in names if name in self.agents]

    def layer(self, agent: str) -> Profile:
        """``[defaults]`` under ``[agents.FAMILY]`` under ``[agents.NAME]``."""
        values, thresholds = dict(self.defaults.values), dict(self.defaults.thresholds)
        for name in self.lineage(agent):
            values.update(self.agents[name].values)
            thresholds.update(self.agents[name].thresholds)
        return Profile(agent, values, thresholds)

    def source_of(self, agent: str, key: str) -> str:
        setting = [name for name in self.lineage(agent) if key in self.agents[name].values]
        if not setting:
            return f"{self.path}[defaults]"
        name = setting[-1]  # the most specific table that sets it; a dotted name is quoted, as in the file
        return f'{self.path}[agents."{name}"]' if "." in name else f"{self.path}[agents.{name}]"


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
    for name in agents_table:
        try:
            check_agent_name(name)
        except AgentNameError as exc:
            raise ProfileError(f"{source}: [agents] table: {exc}") from None
    agents = {name: validate_table(table, source, name, defaults.thresholds) for name, table in agents_table.items()}
    return ProfileFile(Path(source) if source != "<profiles>" else None, defaults, agents)


def _read_toml(path: Path) -> dict[str, Any]:
    """The file's TOML; not UTF-8 or not TOML is a ProfileError naming the file and line."""
    return read_toml(path, "profile file", ProfileError)


_CACHE: dict[Path, tuple[FileStamp, ProfileFile]] = {}


def load_profiles(path: Union[str, Path]) -> ProfileFile:
    """Read and validate a profile file (cached until the file changes)."""
    path = Path(path)
    stamp = file_stamp(path)
    if stamp is None:
        raise ProfileError(f"{path}: profile file does not exist")
    cached = _CACHE.get(path)
    if cached and cached[0] == stamp:
        return cached[1]
    parsed = parse_profiles(_read_toml(path), path)
    _CACHE[path] = (stamp, parsed)
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
    check_agent_name(agent)
    pf = profiles_for(settings)
    if pf is None:
        return {"trainer": {}, "thresholds": {}, "source": None, "sources": {}}
    layer = pf.layer(agent)
    trainer = dict(layer.values)
    sources = {k: pf.source_of(agent, k) for k in layer.values}
    return {"trainer": trainer, "thresholds": dict(layer.thresholds), "source": str(pf.path), "sources": sources}


def thresholds_for(agent: str, settings: Settings) -> dict[str, Any]:
    """Guard thresholds for ``agent`` as a dict (for display): defaults overlaid by its profile."""
    return guard_thresholds(agent, settings).model_dump()


def guard_thresholds(agent: str, settings: Settings, overrides: Optional[dict[str, Any]] = None) -> GuardThresholds:
    """Guard thresholds for ``agent``: defaults, its profile, then ``overrides``
    (validated as a profile's are: a bad value is a ProfileError naming it)."""
    layer = {**profile_layer(agent, settings)["thresholds"], **(overrides or {})}
    where = f"thresholds for agent {agent!r}"
    _validated(GuardThresholds, layer, where, "threshold", list(GuardThresholds.model_fields))
    return GuardThresholds.model_validate(layer)


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
    from genesis_fp16.base.storage import atomic_write_bytes, atomic_write_text

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

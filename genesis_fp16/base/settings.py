"""One settings tree for the whole project.

Sources, highest precedence first (pydantic-settings order):
init arguments > environment > ``.env`` file > TOML file (``GENESIS_FP16_CONFIG_FILE``,
default ``genesis_fp16.toml`` in the working directory when it exists).

This is the only module that reads the environment; everything else takes a
``Settings`` object.

What the sources would silently skip or crash on is refused first, with the
file and line (`genesis_fp16.base.setting_names`): a ``.env`` or TOML file that is
not UTF-8, an unparseable ``.env`` line, malformed TOML, a ``GENESIS_FP16_*``
name (environment, ``.env``) or TOML key that is no setting, a near miss of a
variable outside the prefix, and anything that would leave the kill switch
unread: a name that looks like a switch for FP16/BF16 training
(``DISABLE_FP16_TRAINING``, ``ENABLE_FP16``) and an empty
``ENABLE_FP16_TRAINING``; the closest valid name is suggested. Every number has an upper bound the trainer
runs with (a loss scale within FP32's range, an interval torch can count).
"""

from __future__ import annotations

import os
import re
from enum import Enum
from pathlib import Path
from typing import Any, Optional

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from genesis_fp16.base.vocabulary import AutoPrecision, OnUnsupported, PrecisionMode  # noqa: F401  (the settings' words)
from genesis_fp16.base.setting_names import (
    KILL_SWITCH,
    Problem,
    SettingsError,
    dotenv_entries,
    empty_switch_problem,
    name_problem,
    read_toml,
    read_utf8,  # noqa: F401 - re-exported: profiles imports it from here
    toml_key_problems,
)

ENV_PREFIX = "GENESIS_FP16_"
CONFIG_FILE_ENV = "GENESIS_FP16_CONFIG_FILE"
DEFAULT_CONFIG_FILE = "genesis_fp16.toml"
DOTENV_FILE = ".env"

# Upper bounds the code runs with, so a value that loads also trains.
FP32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max: GradScaler keeps its scale in FP32
INT32_MAX = 2**31 - 1  # GradScaler counts clean steps in an int32 tensor: a longer interval is never reached
INT64_MAX = 2**63 - 1  # the largest integer torch, SQLite (the ledger) and TOML (profiles) hold


class LogFormat(str, Enum):
    """How events are written to stderr."""

    CONSOLE = "console"
    JSON = "json"


class LogLevel(str, Enum):
    """The lowest level of the events written or shown (upper case, as logging names them)."""

    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"

    @classmethod
    def _missing_(cls, value: object) -> Optional["LogLevel"]:
        # any case is accepted: "debug" is DEBUG
        return cls.__members__.get(value.upper()) if isinstance(value, str) else None


class DistributedWrap(str, Enum):
    """How trainers wrap their model under torchrun."""

    NONE = "none"
    DDP = "ddp"
    FSDP = "fsdp"


DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:[0-9]+)?")
"""What ``GENESIS_FP16_DEVICE`` accepts: auto, cpu, cuda or cuda:N."""
DEVICE_CHOICES = "auto, cpu, cuda or cuda:N (N: a CUDA device index, 0 for the first GPU)"


def no_bool(value: Any) -> Any:
    """A before-validator for number fields: pydantic would read True as 1,
    but a number written as true/false is a mistake."""
    if isinstance(value, bool):
        raise ValueError("expected a number, got a boolean")
    return value


class PrecisionConfig(BaseModel):
    """The precision and gradient-scaler knobs, named as torch names them.

    ``Settings`` inherits these fields (``GENESIS_FP16_<NAME>``); a profile
    table is validated by it (``extra="forbid"``: an unknown key is an error);
    the policy merges its layers as dicts validated by it."""

    model_config = ConfigDict(extra="forbid", validate_default=True)

    precision: PrecisionMode = Field(PrecisionMode.AUTO, description="|".join(mode.value for mode in PrecisionMode))
    on_unsupported: OnUnsupported = Field(
        OnUnsupported.FALLBACK,
        description="What to do when the device cannot run the asked precision: fallback (log, use the nearest "
        "precision at least as precise as asked: tf32 -> fp32 on a CPU) or error.",
    )
    init_scale: float = Field(
        65536.0,
        gt=0,
        le=FP32_MAX,
        allow_inf_nan=False,
        description="GradScaler initial loss scale (at most FP32's largest value, 3.4e38).",
    )
    growth_factor: float = Field(
        2.0, gt=1.0, le=FP32_MAX, allow_inf_nan=False, description="GradScaler growth factor (at most 3.4e38)."
    )
    backoff_factor: float = Field(0.5, gt=0.0, lt=1.0, description="GradScaler backoff factor.")
    growth_interval: int = Field(
        2000,
        ge=1,
        le=INT32_MAX,
        description="Clean steps before the scale grows (at most 2147483647: torch counts them in an int32).",
    )
    max_grad_norm: Optional[float] = Field(
        1.0,
        gt=0,
        le=FP32_MAX,
        allow_inf_nan=False,
        description="Gradient clipping norm (at most 3.4e38); 'none' disables clipping.",
    )
    grad_accumulation_steps: int = Field(
        1, ge=1, le=INT64_MAX, description="Micro-steps per optimizer step (at most 2**63-1)."
    )
    nonfinite_streak_threshold: int = Field(
        3,
        ge=1,
        le=INT64_MAX,
        description="Consecutive non-finite losses that raise a trainer.nonfinite_streak event (at most 2**63-1).",
    )

    @field_validator("precision", "on_unsupported", mode="before")
    @classmethod
    def _lower_case(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator(
        "init_scale",
        "growth_factor",
        "backoff_factor",
        "growth_interval",
        "max_grad_norm",
        "grad_accumulation_steps",
        "nonfinite_streak_threshold",
        mode="before",
    )
    @classmethod
    def _no_bool_numbers(cls, value: Any) -> Any:
        return no_bool(value)

    @field_validator("max_grad_norm", mode="before")
    @classmethod
    def _none_disables(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() in {"", "none", "null", "off"}:
            return None
        return value

    def scaler_kwargs(self) -> dict[str, float | int]:
        """Scaler options exactly as ``torch.amp.GradScaler`` names them."""
        return {
            "init_scale": self.init_scale,
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
        }


class Settings(PrecisionConfig, BaseSettings):
    """Global genesis-fp16 settings. Every field maps to ``GENESIS_FP16_<NAME>``
    except the kill switch, which is read from ``ENABLE_FP16_TRAINING``. The
    precision fields are inherited from `PrecisionConfig`
    (`precision_config` gives them as one)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_file=DOTENV_FILE,
        env_file_encoding="utf-8",
        extra="ignore",
        populate_by_name=True,
        validate_default=True,
        env_ignore_empty=True,
    )

    enable_fp16_training: bool = Field(
        True,
        validation_alias=AliasChoices(KILL_SWITCH, "enable_fp16_training"),
        description="Global switch for reduced precision. false is the kill switch: every agent trains in FP32.",
    )
    state_dir: Path = Field(Path(".genesis_fp16"), description="Where ledgers, event logs and checkpoints go.")
    profiles_file: Optional[Path] = Field(
        None, description="Per-agent tuning profiles (TOML). Default: <state_dir>/profiles.toml when it exists."
    )
    ray_address: Optional[str] = Field(
        None,
        description="Ray cluster for `evolve --backend ray`: 'auto' (the cluster this node joined) or HOST:PORT of "
        "the head; "
        "unset: a local Ray with --workers CPUs. Read only by runs on the Ray backend.",
    )
    torch_threads: int = Field(
        1,
        ge=0,
        le=4096,
        description="torch CPU threads (torch.set_num_threads) that the agents and the world model's training apply; "
        "0 keeps torch's default (one per core). 1 is fastest for their small models (docs/EMBEDDING.md).",
    )
    device: str = Field(
        "auto",
        description="Where the world model trains and imagines: auto (the first CUDA GPU when torch sees one, else "
        "the CPU), "
        "cpu, cuda or cuda:N. A device that is not there follows on_unsupported (error, or fall back to the CPU with "
        "a logged reason).",
    )
    auto_precision: AutoPrecision = Field(
        AutoPrecision.MEASURE,
        description="How precision=auto decides: measure (a short calibration of each precision the device runs, on "
        "copies of the model and optimizer, the first time a trainer meets a workload; cached in the rollout ledger, "
        "`genesis-fp16 doctor` lists the decisions) or rule (CPU flags and device type only).",
    )
    # -- issue 37 (precision decided once): the host-level cache of measured auto decisions --
    precision_cache: Path = Field(
        default_factory=lambda: Path.home() / ".cache" / "genesis-fp16" / "precision.json",
        description="Where precision=auto keeps its measured decisions per host and workload (a JSON file every "
        "state dir shares, so a fresh state dir reuses them); `genesis-fp16 doctor --recalibrate` forgets them.",
    )
    distributed: DistributedWrap = Field(
        DistributedWrap.NONE, description="none|ddp|fsdp: how trainers wrap models under torchrun."
    )
    log_format: LogFormat = Field(LogFormat.CONSOLE, description="console (people) or json (machines) on stderr.")
    log_level: LogLevel = Field(
        LogLevel.INFO, description="DEBUG|INFO|WARNING|ERROR: the lowest level written to <state_dir>/events.jsonl."
    )
    console_log_level: LogLevel = Field(
        LogLevel.WARNING,
        description="DEBUG|INFO|WARNING|ERROR: the lowest level shown on stderr (`genesis-fp16 -v` shows INFO for one "
        "command).",
    )
    events_max_bytes: int = Field(
        10 * 1024 * 1024,
        ge=0,
        le=INT64_MAX,
        description="Size in bytes at which events.jsonl is rotated to events.jsonl.1; 0 disables rotation (at most "
        "2**63-1).",
    )
    # each rotation renames every kept file in turn: a bound keeps it quick
    events_keep: int = Field(
        3,
        ge=1,
        le=1000,
        description="Rotated event logs kept, at most 1000 (events.jsonl.1 is the newest); older ones are deleted.",
    )
    tensorboard_dir: Optional[Path] = Field(
        None,
        description="Where `evolve` and `ppo` write TensorBoard scalars from their events (the tensorboard extra); "
        "unset: none are written (--tensorboard DIR for one command).",
    )

    @field_validator("auto_precision", mode="before")
    @classmethod
    def _auto_lower_case(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("device", mode="before")
    @classmethod
    def _device_name(cls, value: Any) -> Any:
        if not isinstance(value, str):
            raise ValueError(f"expected {DEVICE_CHOICES}")
        name = value.strip().lower()
        if not DEVICE_PATTERN.fullmatch(name):
            raise ValueError(f"expected {DEVICE_CHOICES}")
        return name

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_path = config_file_path()
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings, dotenv_settings]
        if os.path.lexists(toml_path):  # read as untrusted input: a FIFO or a directory there is named, never waited on
            # what pydantic-settings' TomlConfigSettingsSource is, with the file read by `read_toml`
            sources.append(InitSettingsSource(settings_cls, read_toml(toml_path, "the settings file")))
        elif CONFIG_FILE_ENV in os.environ:
            raise SettingsError(
                f"{CONFIG_FILE_ENV}={str(toml_path)!r}: file not found; point it at an existing TOML file or unset it"
            )
        return tuple(sources)

    # -- derived paths -------------------------------------------------
    @property
    def events_path(self) -> Path:
        """`<state_dir>/events.jsonl`, the structured event log (`genesis_fp16.base.telemetry.read_events` reads it)."""
        return self.state_dir / "events.jsonl"

    @property
    def effective_profiles_file(self) -> Path:
        return self.profiles_file if self.profiles_file is not None else self.state_dir / "profiles.toml"

    @property
    def precision_config(self) -> PrecisionConfig:
        """The precision fields alone, as a `PrecisionConfig`."""
        return PrecisionConfig.model_validate(self.model_dump(include=set(PrecisionConfig.model_fields)))


def env_name(field: str) -> str:
    """The environment variable a field is read from."""
    if field == "enable_fp16_training":
        return KILL_SWITCH
    return ENV_PREFIX + field.upper()


def allowed_values(model: type[BaseModel], field: str) -> str:
    """What ``field`` of ``model`` accepts, in words, from its type and bounds
    (error messages of settings, trainer configs and profiles)."""
    if field == "device" and model is Settings:
        return DEVICE_CHOICES
    info = model.model_fields[field]
    annotation = info.annotation
    for candidate in getattr(annotation, "__args__", (annotation,)):
        if isinstance(candidate, type) and issubclass(candidate, Enum):
            return ", ".join(str(m.value) for m in candidate)
    if annotation is bool:
        strict = any(getattr(meta, "strict", False) for meta in info.metadata)
        return "true or false" if strict else "true, false (also 1/0, yes/no, on/off)"
    bounds = []
    for meta in info.metadata:
        for attr, sym in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
            if getattr(meta, attr, None) is not None:
                bounds.append(f"{sym} {str(getattr(meta, attr)).replace('e+', 'e')}")  # 3.4e38, as Python reads it
    kind = getattr(annotation, "__name__", str(annotation)).replace("Optional", "")
    number = "an integer" if annotation is int else "a finite number"
    text = f"{number} {' and '.join(bounds)}" if bounds else f"a value of type {kind}"
    if field == "max_grad_norm":
        text += ", or 'none' to disable clipping"

    return text


def format_validation_error(err: ValidationError) -> str:
    lines = []
    for item in err.errors():
        loc = item.get("loc") or ("?",)
        field = str(loc[0])
        if field not in Settings.model_fields:
            # aliases come back as the alias name
            field = {KILL_SWITCH: "enable_fp16_training"}.get(field, field)
        name = env_name(field) if field in Settings.model_fields else field
        allowed = allowed_values(Settings, field) if field in Settings.model_fields else item.get("msg", "")
        lines.append(f"invalid setting {name}={item.get('input')!r}: allowed values are {allowed}")
    return "; ".join(lines)


def config_file_path() -> Path:
    """The TOML settings file: ``GENESIS_FP16_CONFIG_FILE`` or ``genesis_fp16.toml``."""
    return Path(os.environ.get(CONFIG_FILE_ENV, DEFAULT_CONFIG_FILE))


def valid_env_names() -> list[str]:
    """Every variable the settings read (``genesis-fp16 doctor`` shows them)."""
    return sorted({env_name(f) for f in Settings.model_fields} | {CONFIG_FILE_ENV})


def _problems() -> list[Problem]:
    """Every name in the environment, ``.env`` and the TOML file that is meant
    as a setting but is none, and an empty kill switch. Raises SettingsError
    for a file that cannot be read at all."""
    valid = tuple(valid_env_names())
    problems = []
    for name, value in sorted(os.environ.items()):
        where = "in the environment"
        problems.append(name_problem(name, where, valid, ENV_PREFIX) or empty_switch_problem(name, value, where))
    dotenv = Path(DOTENV_FILE)
    # read as untrusted input (`read_utf8`): a FIFO or a device is named (pydantic-settings would wait on a FIFO);
    # a directory (a virtualenv called .env) or a dangling link is no .env file, as for pydantic-settings
    if os.path.exists(dotenv) and not dotenv.is_dir():
        for name, value, line in dotenv_entries(dotenv):
            where = "in the .env file"
            problem = name_problem(name, where, valid, ENV_PREFIX) or empty_switch_problem(name, value, where)
            problems.append(problem._replace(message=f"{dotenv}:{line}: {problem.message}") if problem else None)
    toml_path = config_file_path()
    if os.path.lexists(toml_path):
        problems.extend(toml_key_problems(toml_path, list(Settings.model_fields)))
    return [p for p in problems if p is not None]


def unknown_settings() -> list[str]:
    """One message per name in the environment or ``.env`` meant as a setting
    but none (see `genesis_fp16.base.setting_names`), per TOML key that is no
    setting, and for an empty ``ENABLE_FP16_TRAINING``. Raises SettingsError
    for a file that cannot be read at all."""
    return [p.message for p in _problems()]


def load_settings(*, check_names: bool = True, **overrides: Any) -> Settings:
    """Build settings from all sources; raise ``SettingsError`` with one clear
    message. ``check_names=False`` lets an unknown name pass (``doctor``,
    which lists them), but never one that would leave reduced precision on
    silently (a switch-like name that is not ``ENABLE_FP16_TRAINING``, an
    empty ``ENABLE_FP16_TRAINING``)."""
    refused = [p.message for p in _problems() if check_names or p.kill_switch]
    if refused:
        raise SettingsError(refused[0])
    try:
        return Settings(**overrides)
    except ValidationError as err:
        raise SettingsError(format_validation_error(err)) from None


def describe_settings() -> list[dict[str, Any]]:
    """Every setting with its variable, default and meaning (for docs and `.env.example`)."""
    rows = []
    for name, info in Settings.model_fields.items():
        default = info.default
        if isinstance(default, Enum):
            default = default.value
        rows.append({"field": name, "env": env_name(name), "default": default, "description": info.description})
    return rows

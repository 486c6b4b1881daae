"""The trainer's configuration.

``FP16TrainingConfig`` is a plain dataclass (its field names and defaults are
public API); its precision fields are validated by
`genesis_fp16.settings.PrecisionConfig`, the same model that checks
settings and profiles. The one name that differs is the trainer's
``loss_scale``, which is PrecisionConfig's (and torch's) ``init_scale``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Optional

from pydantic import ValidationError

from .modes import parse_mode
from .settings import PrecisionConfig, PrecisionMode, allowed_values

# FP16TrainingConfig field -> PrecisionConfig field, where the names differ: the one
# rename between the two, used by the policy and the profiles through the two functions below
_PRECISION_NAME = {"loss_scale": "init_scale"}
_TRAINER_NAME = {v: k for k, v in _PRECISION_NAME.items()}


def precision_name(trainer_field: str) -> str:
    """The PrecisionConfig field a trainer-config field is checked as."""
    return _PRECISION_NAME.get(trainer_field, trainer_field)


def trainer_name(precision_field: str) -> str:
    """The trainer-config field a PrecisionConfig field is stored in."""
    return _TRAINER_NAME.get(precision_field, precision_field)


# the trainer-config fields PrecisionConfig validates, in trainer names
PRECISION_FIELDS = tuple(trainer_name(name) for name in PrecisionConfig.model_fields)


def validate_precision(values: dict[str, Any]) -> PrecisionConfig:
    """``values`` (PrecisionConfig names) as a PrecisionConfig; a ValueError
    naming every bad field by its trainer-config name, its value and what is
    allowed."""
    try:
        return PrecisionConfig.model_validate(values)
    except ValidationError as err:
        problems = []
        for item in err.errors():
            field = str(item["loc"][0]) if item["loc"] else "?"
            if field in PrecisionConfig.model_fields:
                allowed = allowed_values(PrecisionConfig, field)
                problems.append(f"{trainer_name(field)}={item['input']!r}: allowed values are {allowed}")
            else:
                problems.append(f"{trainer_name(field)}: {item['msg']}")
        raise ValueError("invalid FP16TrainingConfig: " + "; ".join(problems)) from None


def _bool(name: str, value: Any) -> Optional[str]:
    return None if isinstance(value, bool) else f"{name}={value!r}: expected True or False"


def _device(name: str, value: Any) -> Optional[str]:
    return None if value is None or isinstance(value, str) else f"{name}={value!r}: expected a device name such as 'cpu' or 'cuda:0', or None"


# the fields PrecisionConfig does not check, each with its own check
_OTHER_FIELDS = {"enabled": _bool, "check_finite_loss": _bool, "device": _device}


@dataclass
class FP16TrainingConfig:
    """Trainer configuration.

    The precision fields (``precision``, ``on_unsupported``, ``loss_scale``,
    ``growth_factor``, ``backoff_factor``, ``growth_interval``,
    ``max_grad_norm``, ``grad_accumulation_steps``,
    ``nonfinite_streak_threshold``) are `genesis_fp16.settings.PrecisionConfig`'s,
    described and checked there; ``loss_scale`` is its ``init_scale``
    (`precision_name`). Construction validates them and stores them normalised
    (``precision="FP16"`` becomes ``"fp16"``, ``loss_scale=1024`` becomes
    ``1024.0``); `precision_config` gives them as one. The others are the
    trainer's own:

    enabled: False trains in FP32 whatever ``precision`` says.
    device: where the model lives; None infers it from the model's parameters.
    check_finite_loss: test each loss for NaN/inf before backward (one host sync per step).
    """

    enabled: bool = True
    loss_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    precision: str = "auto"
    max_grad_norm: Optional[float] = 1.0
    grad_accumulation_steps: int = 1
    on_unsupported: str = "fallback"
    device: Optional[str] = None
    nonfinite_streak_threshold: int = 3
    check_finite_loss: bool = True

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming each bad field; store the validated
        precision values. The other fields are checked by type, not coerced:
        ``enabled="false"`` is a non-empty string, and truthy, so taking it
        would train in reduced precision when FP32 was meant."""
        problems = [problem for name, check in _OTHER_FIELDS.items() if (problem := check(name, getattr(self, name)))]
        if problems:
            raise ValueError("invalid FP16TrainingConfig: " + "; ".join(problems))
        for name, value in self.precision_config:
            setattr(self, trainer_name(name), value.value if isinstance(value, Enum) else value)

    @property
    def precision_config(self) -> PrecisionConfig:
        """The precision fields as a `PrecisionConfig` (its names: ``init_scale``
        for ``loss_scale``); the precision plugins take their scaler's options from it."""
        return validate_precision({precision_name(f): getattr(self, f) for f in PRECISION_FIELDS})

    @property
    def requested_precision(self) -> PrecisionMode:
        return parse_mode(self.precision) if self.enabled else PrecisionMode.FP32

    @classmethod
    def from_precision_config(cls, config: PrecisionConfig, **fields: Any) -> "FP16TrainingConfig":
        """A trainer config with ``config``'s precision fields; ``fields`` sets
        the others (``enabled``, ``device``, ``check_finite_loss``)."""
        return cls(**{**{trainer_name(name): value for name, value in config}, **fields})

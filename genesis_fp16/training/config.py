"""The trainer's configuration.

``FP16TrainingConfig`` is a plain dataclass (its field names and defaults are
public API). Its precision fields are `genesis_fp16.base.settings.PrecisionConfig`'s,
under the same names (the scaler's as ``torch.amp.GradScaler`` names them:
``init_scale``, ``growth_interval``, ...), validated by that model, the one
that checks settings and profiles too; the others are the trainer's own. What
it asks for as a precision is `FP16TrainingConfig.request`, one typed value.
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass
from enum import Enum
from typing import Any, Optional

from pydantic import ValidationError

from genesis_fp16.base.settings import PrecisionConfig, allowed_values
from genesis_fp16.precision.request import PrecisionRequest, Source

PRECISION_FIELDS = tuple(PrecisionConfig.model_fields)
"""The trainer-config fields `PrecisionConfig` validates (the same names in both)."""


def validate_precision(values: dict[str, Any]) -> PrecisionConfig:
    """``values`` as a PrecisionConfig; a ValueError naming every bad field, its value and what is allowed."""
    try:
        return PrecisionConfig.model_validate(values)
    except ValidationError as err:
        problems = []
        for item in err.errors():
            field = str(item["loc"][0]) if item["loc"] else "?"
            if field in PrecisionConfig.model_fields:
                allowed = allowed_values(PrecisionConfig, field)
                problems.append(f"{field}={item['input']!r}: allowed values are {allowed}")
            else:
                problems.append(f"{field}: {item['msg']}")
        raise ValueError("invalid FP16TrainingConfig: " + "; ".join(problems)) from None


def _bool(name: str, value: Any) -> Optional[str]:
    return None if isinstance(value, bool) else f"{name}={value!r}: expected True or False"


def _device(name: str, value: Any) -> Optional[str]:
    return (
        None
        if value is None or isinstance(value, str)
        else f"{name}={value!r}: expected a device name such as 'cpu' or 'cuda:0', or None"
    )


# the fields PrecisionConfig does not check, each with its own check
_OTHER_FIELDS = {"enabled": _bool, "check_finite_loss": _bool, "device": _device, "capture": _bool}


@dataclass
class FP16TrainingConfig:
    """Trainer configuration.

    The precision fields (``precision``, ``on_unsupported``, ``init_scale``,
    ``growth_factor``, ``backoff_factor``, ``growth_interval``,
    ``max_grad_norm``, ``grad_accumulation_steps``,
    ``nonfinite_streak_threshold``) are `genesis_fp16.base.settings.PrecisionConfig`'s,
    described and checked there. Construction validates them and stores them
    normalised (``precision="FP16"`` becomes ``"fp16"``, ``init_scale=1024``
    becomes ``1024.0``); `precision_config` gives them as one. The others are
    the trainer's own:

    enabled: False trains in FP32 whatever ``precision`` says.
    device: where the model lives; None infers it from the model's parameters.
    check_finite_loss: test each loss for NaN/inf before backward (one host sync per step).
    capture: on CUDA, a training window's step runs as one CUDA graph per batch shape
    (`genesis_fp16.training.capture`); False runs the window's steps eagerly.
    """

    enabled: bool = True
    init_scale: float = 65536.0
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
    capture: bool = True
    loss_scale: InitVar[Optional[float]] = None
    """Refused with the field's name: the scaler's initial scale is ``init_scale`` (torch's name)."""

    def __post_init__(self, loss_scale: Optional[float] = None) -> None:
        if loss_scale is not None:
            raise ValueError(
                f"invalid FP16TrainingConfig: loss_scale={loss_scale!r}: the initial loss scale is "
                f"init_scale (as torch.amp.GradScaler names it); pass init_scale={loss_scale!r}"
            )
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
            setattr(self, name, value.value if isinstance(value, Enum) else value)

    @property
    def precision_config(self) -> PrecisionConfig:
        """The precision fields as a `PrecisionConfig`; the precision plugins take their scaler's options from it."""
        return validate_precision({f: getattr(self, f) for f in PRECISION_FIELDS})

    @property
    def request(self) -> PrecisionRequest:
        """What this config asks for, as the one typed request (a constructor argument: `Source.EXPLICIT`),
        switched off by ``enabled=False``."""
        request = PrecisionRequest(self.precision, Source.EXPLICIT, self.on_unsupported)
        return request if self.enabled else request.switched_off(Source.EXPLICIT, "enabled=False")

    @classmethod
    def from_precision_config(cls, config: PrecisionConfig, **fields: Any) -> "FP16TrainingConfig":
        """A trainer config with ``config``'s precision fields; ``fields`` sets
        the others (``enabled``, ``device``, ``check_finite_loss``, ``capture``)."""
        return cls(**{**dict(config), **fields})

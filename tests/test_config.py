"""PrecisionConfig: one typed set of precision knobs, inherited by Settings."""

from __future__ import annotations

import dataclasses

import re

import pytest
from pydantic import ValidationError

from genesis_fp16.base.settings import OnUnsupported, PrecisionConfig, PrecisionMode, Settings, load_settings


def test_settings_inherits_the_precision_fields_once():
    assert issubclass(Settings, PrecisionConfig)
    for name, info in PrecisionConfig.model_fields.items():
        assert Settings.model_fields[name].description == info.description


def test_precision_config_from_flat_environment_names(monkeypatch):
    monkeypatch.setenv("GENESIS_FP16_PRECISION", "bf16")
    monkeypatch.setenv("GENESIS_FP16_INIT_SCALE", "1024")
    monkeypatch.setenv("GENESIS_FP16_MAX_GRAD_NORM", "none")
    monkeypatch.setenv("GENESIS_FP16_ON_UNSUPPORTED", "error")
    cfg = load_settings().precision_config
    assert type(cfg) is PrecisionConfig
    assert cfg == PrecisionConfig(precision="bf16", init_scale=1024.0, max_grad_norm=None, on_unsupported="error")
    assert cfg.precision is PrecisionMode.BF16 and cfg.on_unsupported is OnUnsupported.ERROR


def test_precision_config_refuses_unknown_keys_and_bad_values():
    with pytest.raises(ValidationError, match="loss_scale"):
        PrecisionConfig.model_validate({"loss_scale": 8.0})
    with pytest.raises(ValidationError, match="growth_interval"):
        PrecisionConfig(growth_interval=0)
    with pytest.raises(ValidationError, match="boolean"):
        PrecisionConfig(init_scale=True)  # would otherwise be read as 1.0


def test_precision_config_spellings():
    assert PrecisionConfig(precision="FP16").precision is PrecisionMode.FP16
    assert PrecisionConfig(max_grad_norm="off").max_grad_norm is None
    assert PrecisionConfig().scaler_kwargs() == load_settings().scaler_kwargs()


# -- FP16TrainingConfig: the trainer's dataclass, validated by PrecisionConfig ----


def test_training_config_is_one_object_on_every_import_path():
    from genesis_fp16 import FP16TrainingConfig as top
    from genesis_fp16.training.config import FP16TrainingConfig
    from genesis_fp16.training.trainer import FP16TrainingConfig as from_trainer
    from infrastructure.training import FP16TrainingConfig as infra

    assert top is FP16TrainingConfig is from_trainer is infra


def test_training_config_defaults_match_precision_config():
    from genesis_fp16.training.config import FP16TrainingConfig

    cfg = FP16TrainingConfig()
    assert cfg.init_scale == 65536.0 and cfg.precision == "auto" and cfg.on_unsupported == "fallback"
    assert cfg.enabled is True and cfg.device is None and cfg.check_finite_loss is True
    assert cfg.precision_config == PrecisionConfig()


def test_training_config_names_every_bad_field_in_one_error():
    from genesis_fp16.training.config import FP16TrainingConfig

    with pytest.raises(ValueError) as err:
        FP16TrainingConfig(init_scale=0.0, growth_interval=0, precision="fp8")
    message = str(err.value)
    assert message.startswith("invalid FP16TrainingConfig: ") and "\n" not in message
    assert "init_scale=0.0: allowed values are a finite number > 0" in message  # torch's name, the settings' too
    assert "growth_interval=0: allowed values are an integer >= 1" in message
    assert "precision='fp8': allowed values are auto, fp16, bf16, fp32" in message
    with pytest.raises(ValueError, match="invalid FP16TrainingConfig: growth_interval=True"):
        FP16TrainingConfig(growth_interval=True)


def test_training_config_stores_validated_values():
    from genesis_fp16.training.config import FP16TrainingConfig

    cfg = FP16TrainingConfig(
        precision=PrecisionMode.BF16, on_unsupported="ERROR", init_scale=1024, max_grad_norm="none"
    )
    assert cfg.precision == "bf16" and type(cfg.precision) is str and cfg.on_unsupported == "error"
    assert cfg.init_scale == 1024.0 and type(cfg.init_scale) is float and cfg.max_grad_norm is None
    assert cfg.precision_config.init_scale == 1024.0 and cfg.precision_config.scaler_kwargs()["init_scale"] == 1024.0


def test_training_config_from_precision_config():
    from genesis_fp16.training.config import FP16TrainingConfig

    pc = PrecisionConfig(precision="fp16", init_scale=256.0, growth_interval=7)
    cfg = FP16TrainingConfig.from_precision_config(pc, enabled=False, device="cpu")
    assert cfg.init_scale == 256.0 and cfg.growth_interval == 7 and cfg.precision == "fp16"
    assert cfg.enabled is False and cfg.device == "cpu" and cfg.precision_config == pc


@pytest.mark.parametrize(
    "field, value",
    [
        ("init_scale", 1e300),
        ("growth_factor", 1e39),
        ("growth_interval", 2**31),
        ("max_grad_norm", 1e39),
        ("grad_accumulation_steps", 2**63),
        ("nonfinite_streak_threshold", 2**63),
    ],
)
def test_trainer_config_has_the_settings_upper_bounds(field, value):
    from genesis_fp16.training.config import FP16TrainingConfig

    with pytest.raises(ValueError, match=f"invalid FP16TrainingConfig: {field}=.*<="):
        FP16TrainingConfig(**{field: value})


@pytest.mark.parametrize(
    "field, value",
    [
        ("enabled", "false"),
        ("enabled", "0"),
        ("enabled", 0),
        ("enabled", None),
        ("check_finite_loss", "no"),
        ("device", 0),
        ("device", ["cpu"]),
    ],
)
def test_training_config_refuses_values_of_the_wrong_type(field, value):
    """The fields PrecisionConfig does not check are checked by type:
    ``enabled="false"`` is a non-empty string, truthy: taken as it is, it
    trained in reduced precision where FP32 was meant."""
    from genesis_fp16.training.config import FP16TrainingConfig

    with pytest.raises(ValueError, match=re.escape(f"invalid FP16TrainingConfig: {field}={value!r}: expected")):
        FP16TrainingConfig(**{field: value})


def test_training_config_keeps_bools_and_device_names():
    from genesis_fp16.training.config import FP16TrainingConfig

    config = FP16TrainingConfig(enabled=False, check_finite_loss=False, device="cpu")
    assert (config.enabled, config.check_finite_loss, config.device) == (False, False, "cpu")
    assert config.request.requested.value == "fp32"


def test_loss_scale_is_refused_with_the_name_of_the_field():
    """The trainer's config names its fields as the settings and torch do: no rename between the two."""
    from genesis_fp16.training.config import FP16TrainingConfig

    with pytest.raises(
        ValueError, match=r"loss_scale=1024.0: the initial loss scale is init_scale .*pass init_scale=1024.0"
    ):
        FP16TrainingConfig(loss_scale=1024.0)
    assert set(PrecisionConfig.model_fields) <= {f.name for f in dataclasses.fields(FP16TrainingConfig)}

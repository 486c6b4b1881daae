"""PrecisionConfig: one typed set of precision knobs, inherited by Settings."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from genesis_fp16.settings import OnUnsupported, PrecisionConfig, PrecisionMode, Settings, load_settings


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

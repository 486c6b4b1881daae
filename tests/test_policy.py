"""Policy precedence: settings < profile < explicit argument; the ledger over
profile and argument; the kill switch over everything."""

from __future__ import annotations

import pytest
import torch

from genesis_fp16.precision.request import Source
from genesis_fp16.rollout.policy import resolve_policy
from genesis_fp16.training.registry import trainer_for
from genesis_fp16.rollout.ledger import RolloutLedger
from genesis_fp16.base.settings import load_settings


def _profile(state_dir, text):
    (state_dir / "profiles.toml").write_text(text, encoding="utf-8")


def test_settings_layer(state_dir, monkeypatch):
    monkeypatch.setenv("GENESIS_FP16_PRECISION", "fp16")
    monkeypatch.setenv("GENESIS_FP16_GROWTH_INTERVAL", "300")
    pol = resolve_policy("wm")
    assert pol.config.precision == "fp16" and pol.config.growth_interval == 300
    assert pol.sources["precision"] == "settings" and pol.stage is None


def test_profile_over_settings(state_dir, monkeypatch):
    monkeypatch.setenv("GENESIS_FP16_PRECISION", "fp16")
    monkeypatch.setenv("GENESIS_FP16_INIT_SCALE", "4096")
    _profile(state_dir, '[agents.wm]\nprecision = "bf16"\n')
    pol = resolve_policy("wm")
    assert pol.config.precision == "bf16" and pol.sources["precision"].startswith("profile:")
    assert pol.config.init_scale == 4096.0 and pol.sources["init_scale"] == "settings"
    assert (
        pol.origin("precision") == Source.PROFILE and pol.origin("init_scale") == Source.SETTINGS
    )  # typed, as decided
    assert resolve_policy("other").config.precision == "fp16"  # other agents keep the global value


def test_argument_over_profile(state_dir):
    _profile(state_dir, '[agents.wm]\nprecision = "bf16"\ngrowth_interval = 50\n')
    pol = resolve_policy("wm", precision="fp16", overrides={"growth_interval": 7})
    assert pol.config.precision == "fp16" and pol.sources["precision"] == "argument"
    assert pol.config.growth_interval == 7 and pol.sources["growth_interval"] == "argument"
    assert pol.origin("precision") == pol.origin("growth_interval") == Source.EXPLICIT


def test_explicit_precision_enables_over_profile_disable(state_dir):
    _profile(state_dir, "[agents.wm]\nenabled = false\n")
    assert resolve_policy("wm").precision == "fp32"
    assert resolve_policy("wm", precision="bf16").precision == "bf16"


@pytest.mark.parametrize("stage", ["rolled_back", "off"])
def test_ledger_over_profile_and_argument(state_dir, stage):
    _profile(state_dir, '[agents.wm]\nprecision = "bf16"\nenabled = true\n')
    ledger = RolloutLedger.from_settings(load_settings())
    ledger.enable("wm")
    ledger.rollback("wm", "test") if stage == "rolled_back" else ledger.disable("wm")
    pol = resolve_policy("wm", precision="fp16")
    assert pol.precision == "fp32" and pol.stage == stage
    assert pol.sources["enabled"] == f"ledger:{stage}" and stage in pol.reason


def test_ledger_on_enables_unless_argument_disables(state_dir):
    _profile(state_dir, '[agents.wm]\nenabled = false\nprecision = "bf16"\n')
    RolloutLedger.from_settings(load_settings()).enable("wm", shadow=True)
    pol = resolve_policy("wm")
    assert pol.precision == "bf16" and pol.sources["enabled"] == "ledger:shadow" and pol.shadow
    pol = resolve_policy("wm", overrides={"enabled": False})
    assert pol.precision == "fp32" and not pol.shadow


def test_kill_switch_over_everything(state_dir, monkeypatch):
    _profile(state_dir, '[agents.wm]\nenabled = true\nprecision = "bf16"\n')
    RolloutLedger.from_settings(load_settings()).enable("wm")
    monkeypatch.setenv("ENABLE_FP16_TRAINING", "false")
    pol = resolve_policy("wm", precision="fp16", overrides={"enabled": True})
    assert pol.precision == "fp32" and pol.stage == "on"
    assert pol.sources["enabled"] == "kill switch (ENABLE_FP16_TRAINING=false)"
    assert pol.sources["precision"] == pol.sources["enabled"]


def test_thresholds_defaults_and_profile(state_dir):
    _profile(state_dir, "[agents.wm.thresholds]\nval_loss_ratio = 1.5\n")
    th = resolve_policy("wm").thresholds
    assert th["val_loss_ratio"] == 1.5 and th["overflow_rollback"] == 0.30


def test_trainer_for_follows_the_policy(state_dir):
    _profile(state_dir, '[agents.wm]\nprecision = "fp16"\ninit_scale = 512.0\n')
    model = torch.nn.Linear(2, 1)
    trainer = trainer_for("wm", model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert trainer.precision.name == "fp16" and trainer.current_scale == 512.0 and trainer.name == "wm"
    RolloutLedger.from_settings(load_settings()).rollback("wm", "test")
    trainer = trainer_for("wm", model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert trainer.precision.name == "fp32" and not trainer.scaler.is_enabled()


def test_bad_explicit_arguments_name_the_agent(state_dir):
    with pytest.raises(
        ValueError, match=r"agent 'wm': invalid FP16TrainingConfig: growth_interval=0.*growth_interval from argument"
    ):
        resolve_policy("wm", overrides={"growth_interval": 0})
    with pytest.raises(
        ValueError, match=r"agent 'wm': unknown trainer option\(s\) scale in overrides; allowed are enabled, init_scale"
    ):
        resolve_policy("wm", overrides={"scale": 2.0})
    with pytest.raises(ValueError, match="agent 'wm'.*precision"):
        resolve_policy("wm", precision="fp8")


def test_layers_merge_into_one_precision_config(state_dir, monkeypatch):
    from genesis_fp16.base.settings import PrecisionConfig

    monkeypatch.setenv("GENESIS_FP16_GROWTH_FACTOR", "4")
    _profile(state_dir, '[defaults]\ngrowth_interval = 50\n[agents.wm]\nprecision = "BF16"\ninit_scale = 256\n')
    pol = resolve_policy("wm", overrides={"init_scale": 128, "device": "cpu"})
    expected = PrecisionConfig(growth_factor=4.0, growth_interval=50, precision="bf16", init_scale=128.0)
    assert pol.config.precision_config == expected
    assert pol.config.precision == "bf16" and pol.config.device == "cpu" and pol.config.enabled
    assert [pol.sources[k] for k in ("growth_factor", "init_scale", "device")] == ["settings", "argument", "argument"]
    assert pol.sources["growth_interval"].endswith("[defaults]") and pol.sources["precision"].endswith("[agents.wm]")

"""The precision decision (genesis_fp16/precision/decision.py): one function turns the
request (one typed value: argument, settings or profile, switched off by the
ledger stage or the kill switch), the device and a measurement into one typed
decision (mode, source, reason), before any trainer exists; a bare trainer
(the seed API) decides through it too, under the kill switch. The capability
checks are patched, so every path runs on any machine."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle

import pytest
import torch

from genesis_fp16 import FP16Trainer, FP16TrainingConfig
from genesis_fp16.precision import request as modes
from genesis_fp16.precision.decision import PrecisionDecision, Source, decide
from genesis_fp16.precision.request import PrecisionRequest
from genesis_fp16.rollout.policy import resolve_policy
from genesis_fp16.base.errors import UnsupportedPrecisionError
from genesis_fp16.precision import capability as C
from genesis_fp16.precision.capability import Support
from genesis_fp16.training.registry import resolve_trainer
from genesis_fp16.rollout.ledger import RolloutLedger
from genesis_fp16.base.settings import PrecisionMode, load_settings

from conftest import CPU_KINDS


def _profile(state_dir, text):
    (state_dir / "profiles.toml").write_text(text, encoding="utf-8")


def _decide(**kw) -> PrecisionDecision:
    return decide(resolve_policy("wm", load_settings(), **kw).precision, "cpu")


def test_each_source_is_named(state_dir, monkeypatch):
    monkeypatch.setattr(C, "cpu_flags", lambda: CPU_KINDS["amx"])
    assert _decide(precision="fp16").source == Source.EXPLICIT
    monkeypatch.setenv("GENESIS_FP16_PRECISION", "fp16")
    assert _decide().source == Source.SETTINGS and _decide().mode == PrecisionMode.FP16
    _profile(state_dir, '[agents.wm]\nprecision = "bf16"\n')
    profiled = _decide()
    assert profiled.source == Source.PROFILE and profiled.mode == PrecisionMode.BF16
    monkeypatch.delenv("GENESIS_FP16_PRECISION")
    _profile(state_dir, "")
    rule = _decide()
    assert rule.source == Source.RULE and rule.mode == PrecisionMode.BF16 and "rule (not measured" in rule.reason
    RolloutLedger.from_settings(load_settings()).disable("wm")
    off = _decide(precision="bf16")
    assert off.source == Source.LEDGER and off.mode == PrecisionMode.FP32 and "stage is off" in off.reason
    monkeypatch.setenv("ENABLE_FP16_TRAINING", "false")
    killed = _decide(precision="bf16")
    assert (
        killed.source == Source.KILL_SWITCH
        and killed.mode == PrecisionMode.FP32
        and "ENABLE_FP16_TRAINING" in killed.reason
    )


def test_the_decision_reads_the_policys_typed_origin_not_its_words(state_dir, monkeypatch):
    """issue 45, item 4: the request reaches the decision as one typed value (`EffectivePolicy.origins`), not as the
    words `profiles show` prints, parsed back."""
    assert modes.Source is Source  # torch-free, so that the policy can hold it
    policy = resolve_policy("wm", load_settings(), precision="fp16")
    assert policy.origin("precision") == Source.EXPLICIT and policy.origin("init_scale") == Source.SETTINGS
    assert policy.as_dict()["origins"] == {"precision": "explicit", "enabled": "explicit"}
    policy.sources["precision"] = "kill switch (words for people only)"
    assert decide(policy.precision, "cpu").source == Source.EXPLICIT
    monkeypatch.setenv("ENABLE_FP16_TRAINING", "false")
    killed = resolve_policy("wm", load_settings(), precision="bf16")
    assert killed.origin("enabled") == killed.origin("precision") == Source.KILL_SWITCH
    RolloutLedger.from_settings(load_settings()).disable("wm")
    monkeypatch.delenv("ENABLE_FP16_TRAINING")
    assert resolve_policy("wm", load_settings(), precision="bf16").origin("precision") == Source.LEDGER


def test_a_precision_the_device_cannot_run_falls_back_upwards_or_raises(monkeypatch):
    monkeypatch.setattr(C, "device_support", lambda d, m: Support.NONE if m == PrecisionMode.BF16 else Support.NATIVE)
    fell = decide(FP16TrainingConfig(precision="bf16").request, "cpu")
    assert fell.source == Source.FALLBACK and fell.mode == PrecisionMode.FP32 and fell.requested == PrecisionMode.BF16
    with pytest.raises(UnsupportedPrecisionError, match="bf16"):
        decide(FP16TrainingConfig(precision="bf16", on_unsupported="error").request, "cpu")


def test_the_decision_is_frozen_plain_data_and_one_line():
    decision = decide(PrecisionRequest.parse("fp32"), "cpu")
    with pytest.raises(dataclasses.FrozenInstanceError):
        decision.mode = PrecisionMode.BF16  # type: ignore[misc]
    assert decision.as_dict() == {
        "precision": "fp32",
        "source": "explicit",
        "reason": decision.reason,
        "requested": "fp32",
        "device": "cpu",
    }
    assert decision.line().startswith("fp32 (explicit): ")


def test_the_registry_decides_before_the_trainer_and_the_trainer_keeps_it(state_dir, monkeypatch):
    monkeypatch.setattr(C, "cpu_flags", lambda: CPU_KINDS["amx"])
    model = torch.nn.Linear(4, 2)
    built = resolve_trainer("wm", model, torch.optim.SGD(model.parameters(), 0.1))
    assert built.trainer.decision is built.decision and built.decision.source == Source.RULE
    assert built.trainer.precision.name == built.decision.mode.value == built.policy.running == "bf16"
    assert built.trainer.get_stats()["decision"]["source"] == "rule"


def test_the_seed_api_decides_auto_by_the_device_rule_under_the_rule_setting(monkeypatch):
    # conftest sets GENESIS_FP16_AUTO_PRECISION=rule; under measure (the default) the seed API measures at its first
    # batch (tests/test_auto_first_batch.py)
    monkeypatch.setattr(C, "cpu_flags", lambda: CPU_KINDS["avx2"])
    model = torch.nn.Linear(4, 2)
    trainer = FP16Trainer(model, torch.optim.SGD(model.parameters(), 0.1), FP16TrainingConfig(precision="auto"))
    assert trainer.precision.name == "fp32" and trainer.decision.source == Source.RULE and trainer.auto_reason


def test_the_request_is_one_typed_value_that_reads_as_its_text():
    request = PrecisionRequest.parse("BF16", Source.PROFILE)
    assert request == "bf16" and str(request) == "bf16" and json.dumps(request) == '"bf16"'
    assert request.mode == PrecisionMode.BF16 and request.source == Source.PROFILE and request.measure
    assert PrecisionRequest.parse(request) is request  # handed on unchanged
    off = request.switched_off(Source.KILL_SWITCH, "kill switch ENABLE_FP16_TRAINING=false")
    assert off == "fp32" and off.mode == PrecisionMode.BF16 and off.requested == PrecisionMode.FP32
    for again in (copy.deepcopy(off), pickle.loads(pickle.dumps(off))):
        assert again == off and again.off_source == Source.KILL_SWITCH and again.mode == PrecisionMode.BF16
    with pytest.raises(ValueError, match="allowed values are auto, fp16"):
        PrecisionRequest.parse("half")


@pytest.mark.parametrize("asked", ["bf16", "fp16", "auto"])
def test_the_kill_switch_beats_a_bare_trainers_request(monkeypatch, asked):
    """issue 53: ``ENABLE_FP16_TRAINING=false`` makes a bare FP16Trainer asked for bf16, fp16 or auto train in FP32,
    the kill switch the decision's source (it used to honour GENESIS_FP16_AUTO_PRECISION but not the switch)."""
    monkeypatch.setattr(C, "cpu_flags", lambda: CPU_KINDS["amx"])
    monkeypatch.setenv("GENESIS_FP16_AUTO_PRECISION", "measure")
    monkeypatch.setenv("ENABLE_FP16_TRAINING", "false")
    model = torch.nn.Linear(4, 2)
    trainer = FP16Trainer(model, torch.optim.SGD(model.parameters(), 0.1), FP16TrainingConfig(precision=asked))
    assert trainer.precision.name == "fp32" and not trainer.auto_pending
    assert trainer.decision.source == Source.KILL_SWITCH and "ENABLE_FP16_TRAINING=false" in trainer.decision.reason
    trainer.backward_and_step(trainer.training_step(torch.randn(8, 4), lambda m, x: m(x).pow(2).mean()))
    assert trainer.precision.name == "fp32" and trainer.get_stats()["decision"]["source"] == "kill_switch"
    monkeypatch.setenv("ENABLE_FP16_TRAINING", "true")
    named = FP16Trainer(model, torch.optim.SGD(model.parameters(), 0.1), FP16TrainingConfig(precision="bf16"))
    assert named.precision.name == "bf16" and named.decision.source == Source.EXPLICIT

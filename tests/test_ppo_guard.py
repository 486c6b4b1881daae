"""PPO's rollback guard: a NaN storm in an update writes rolled_back, restores
the last good checkpoint and goes on in FP32; the policy canary on a held batch."""

from __future__ import annotations

import math

import pytest
import torch

from agents.ppo.ppo import PPO
from genesis_fp16.rollout.ledger import RolloutLedger
from genesis_fp16.base.telemetry import read_events
from tests.test_ppo_ppo import tiny


@pytest.fixture(autouse=True)
def _restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_nan_storm_in_a_ppo_update_writes_rolled_back(monkeypatch, state_dir):
    ppo = PPO(tiny(precision="bf16", total_steps=96, seed=1))  # 3 iterations of 4 optimizer steps
    original = ppo._loss

    def stormy(net, mb):
        loss, diagnostics = original(net, mb)
        return (loss * float("nan"), diagnostics) if ppo.iteration == 1 else (loss, diagnostics)  # the 2nd iteration

    monkeypatch.setattr(ppo, "_loss", stormy)
    ppo.train()
    ppo.close()
    ledger = RolloutLedger(state_dir / "rollout.sqlite")
    assert ledger.stage("ppo") == "rolled_back"
    assert ledger.history("ppo")[-1]["severity"] == "P0" and "non-finite" in ledger.history("ppo")[-1]["reason"]
    assert ppo.trainer.precision.name == "fp32" and len(ppo.guard.rollbacks) == 1
    assert ppo.guard.guard.trainer is ppo.trainer  # the guard watches the new trainer
    assert ppo.history[-1]["iteration"] == 3 and math.isfinite(ppo.history[-1]["pg_loss"])
    assert all(torch.isfinite(p).all() for p in ppo.net.parameters())
    events = read_events(state_dir / "events.jsonl")
    restored = [e for e in events if e.get("event") == "ppo.rolled_back"]
    assert restored and restored[0]["checkpoint"] and restored[0]["precision"] == "fp32"


def test_fp32_ppo_writes_no_checkpoints_and_no_rollback(state_dir):
    ppo = PPO(tiny(total_steps=64))
    ppo.train()
    ppo.close()
    assert not (state_dir / "ppo").exists() and ppo.guard.rollbacks == []


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_policy_canary_on_a_held_batch(monkeypatch, state_dir, env_id):
    profiles = state_dir / "profiles.toml"
    profiles.write_text("[agents.ppo.thresholds]\ncanary_every = 1\n", encoding="utf-8")
    monkeypatch.setenv("GENESIS_FP16_PROFILES_FILE", str(profiles))
    ppo = PPO(tiny(env_id, precision="bf16", total_steps=96))
    ppo.train()
    ppo.close()
    assert len(ppo.guard.canaries) == 3 and ppo.guard.held["obs"].shape[0] == 32
    for gap in ppo.guard.canaries:  # a healthy BF16 forward: far under the alarms
        assert 0 <= gap["kl"] < 0.01 and gap["max_logp_delta"] < 0.2 and gap["max_value_delta"] < 0.05
    checks = RolloutLedger(state_dir / "rollout.sqlite").quality_checks("ppo", kind="policy_canary")
    assert [c["alarm"] for c in checks] == [False, False, False]
    assert ppo.trainer.precision.name == "bf16"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_policy_canary_on_cuda_holds_its_batch_on_the_gpu(monkeypatch, state_dir, precision):
    """Continuous actions on CUDA with the canary every iteration: the held batch on the GPU, the canary runs. (FP16 may
    also roll back to FP32 for overflow in its first steps at the initial scale, as it did on an H200: the guard's
    job.)"""
    profiles = state_dir / "profiles.toml"
    profiles.write_text("[agents.ppo.thresholds]\ncanary_every = 1\n", encoding="utf-8")
    monkeypatch.setenv("GENESIS_FP16_PROFILES_FILE", str(profiles))
    ppo = PPO(tiny("Pendulum-v1", precision=precision, total_steps=96, device="cuda"))
    ppo.train()
    ppo.close()
    assert ppo.guard.held["obs"].device.type == "cuda" and ppo.global_step == 96
    assert len(ppo.guard.canaries) == 3 or (
        precision == "fp16" and ppo.guard.rollbacks and len(ppo.guard.canaries) >= 1
    )
    for gap in ppo.guard.canaries:
        assert 0 <= gap["kl"] < 0.01 and gap["max_logp_delta"] < 0.2 and gap["max_value_delta"] < 0.05


def test_a_confirmed_policy_canary_alarm_rolls_back(monkeypatch, state_dir):
    profiles = state_dir / "profiles.toml"
    profiles.write_text("[agents.ppo.thresholds]\ncanary_every = 1\n", encoding="utf-8")
    monkeypatch.setenv("GENESIS_FP16_PROFILES_FILE", str(profiles))
    ppo = PPO(tiny(precision="bf16", total_steps=96))
    forward = ppo.net.forward

    def skewed(obs):  # the fault: under autocast the actor's logits are skewed (finite, no overflow)
        out, value = forward(obs)
        return (out + 2.0 * torch.arange(out.shape[-1]) if torch.is_autocast_enabled("cpu") else out), value

    monkeypatch.setattr(ppo.net, "forward", skewed)
    ppo.train()
    ppo.close()
    assert ppo.guard.rollbacks and "policy canary" in ppo.guard.rollbacks[0]
    assert RolloutLedger(state_dir / "rollout.sqlite").stage("ppo") == "rolled_back"
    assert ppo.trainer.precision.name == "fp32"

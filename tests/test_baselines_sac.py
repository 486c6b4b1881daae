"""benchmarks.baselines.sac: how many env steps SAC runs, a clear error without
stable-baselines3, and a tiny run where it is installed."""

from __future__ import annotations

import sys

import pytest

from benchmarks.baselines import BaselineConfig, run_sac, sac_steps
from genesis_fp16.base.extras import MissingExtraError


def test_sac_steps_asked_and_capped():
    cfg = BaselineConfig(budget=10)
    assert sac_steps(cfg, 200, None, None) == (2000, 2000)  # the episode budget at full length
    assert sac_steps(BaselineConfig(budget=10, budget_steps=700), 200, None, 500) == (700, 500)
    assert sac_steps(cfg, 200, 11_200, 100_000) == (11_200, 11_200)  # the loop's env steps
    with pytest.raises(ValueError, match="max_steps=0"):
        sac_steps(cfg, 200, 100, 0)


def test_sac_without_stable_baselines3_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "stable_baselines3", None)  # an import of it now raises ImportError
    with pytest.raises(MissingExtraError, match="the SAC baseline needs stable_baselines3.*genesis-fp16\\[bench\\]"):
        run_sac(BaselineConfig(budget=1))


def test_sac_tiny_run_on_pendulum(one_thread):
    pytest.importorskip("stable_baselines3")
    cfg = BaselineConfig(env_id="Pendulum-v1", budget=3, episode_steps=60, check_every=2, seed=1)
    report = run_sac(cfg, total_steps=180, max_steps=150)
    assert (
        report["env_steps"] == 150 and report["real_episodes"] == 2
    )  # 150 steps: two 60-step episodes and part of a third
    assert report["settings"]["capped"] and report["settings"]["steps_asked"] == 180
    assert "capped at 150 of the 180 env steps asked" in report["stop_detail"]
    assert [c["real_episodes"] for c in report["generations"]] == [2] and report["generations"][0]["env_steps"] == 120
    assert report["heldout_return"] is not None and report["heldout_episodes"] == 20

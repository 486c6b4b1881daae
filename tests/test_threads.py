"""GENESIS_FP16_TORCH_THREADS: the agents and the world model's training apply
it for their own work and give the count back afterwards."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from genesis_fp16.training.guarded import UNGUARDED
from genesis_fp16.base.settings import load_settings
from genesis_fp16.base.threads import torch_threads
from infrastructure.trajectory import Trajectory
from infrastructure.world_model import WorldModel


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_the_block_runs_with_the_count_and_restores_it(two_threads):
    with torch_threads(1):
        assert torch.get_num_threads() == 1
        with torch_threads(1):  # nested: the outer count survives both
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with torch_threads(0):  # 0 leaves torch's count alone
        assert torch.get_num_threads() == 2
    with pytest.raises(ValueError, match="expected 0"):
        with torch_threads(-1):
            pass


def test_restored_after_an_error(two_threads):
    with pytest.raises(RuntimeError):
        with torch_threads(1):
            raise RuntimeError("boom")
    assert torch.get_num_threads() == 2


def test_setting_is_read_from_the_environment(monkeypatch):
    assert load_settings().torch_threads == 1
    monkeypatch.setenv("GENESIS_FP16_TORCH_THREADS", "0")
    assert load_settings().torch_threads == 0
    monkeypatch.setenv("GENESIS_FP16_TORCH_THREADS", "-2")
    with pytest.raises(Exception, match="GENESIS_FP16_TORCH_THREADS"):
        load_settings()


def _trajs() -> list[Trajectory]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(3):
        obs = rng.normal(size=(21, 3)).astype(np.float32)
        out.append(
            Trajectory(
                obs=obs[:-1],
                action=rng.normal(size=(20, 1)),
                reward=rng.normal(size=20),
                next_obs=obs[1:],
                done=np.zeros(20, dtype=bool),
            )
        )
    return out


@pytest.mark.parametrize("setting,expected", [("1", 1), ("0", 2)])
async def test_world_model_training_thread_applies_the_setting(monkeypatch, two_threads, setting, expected):
    monkeypatch.setenv("GENESIS_FP16_TORCH_THREADS", setting)
    wm = WorldModel(3, 1, agent="threads_test", guard=UNGUARDED, settings=load_settings(), seed=0)
    seen: list[tuple[int, str]] = []
    real = wm._train_sync

    def spy(*args, **kwargs):
        seen.append((torch.get_num_threads(), threading.current_thread().name))
        return real(*args, **kwargs)

    monkeypatch.setattr(wm, "_train_sync", spy)
    await wm.train(3, trajectories=_trajs(), save=False)
    assert seen and seen[0][0] == expected and seen[0][1] != threading.main_thread().name
    assert torch.get_num_threads() == 2

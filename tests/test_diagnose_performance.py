"""scripts/diagnose_performance.py runs its env and inference stages against
the current PPO (its inference stage calls the rollout's own act)."""

from __future__ import annotations

import pytest
from scripts_loader import load_script

pytestmark = pytest.mark.usefixtures("one_thread")


def _script():
    return load_script("diagnose_performance")


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_inference_stage_times_the_rollouts_act(env_id, state_dir):
    results = _script().bench_inference(env_id, repeats=1, steps=20)
    assert set(results) == {"inference.batched", "inference.chunk4", "inference.per_env"}
    assert all(r["value"] > 0 and len(r["samples"]) == 1 for r in results.values())


def test_env_stage_times_every_vector_env(state_dir):
    results = _script().bench_env("CartPole-v1", repeats=1, steps=20)
    assert set(results) == {"env.sync", "env.sync_gymnasium", "env.async"} and all(
        r["value"] > 0 for r in results.values()
    )

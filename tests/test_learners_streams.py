"""`Learners.learn` draws its replay rows, its exploration noise and the model env's member and Gaussian draws from
three named streams of the run's seed (issue 53, item 5): one number seeding all three made them the same stream."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

import agents.learners as learners_module
import infrastructure.model_env as model_env_module
from agents.evolve_config import EvolveConfig
from agents.learners import EXPLORATION_NOISE, Learners
from agents.search_space import ObsStats
from agents.tasks import get_task
from genesis_fp16.base.seeds import stream_seed, torch_generator
from infrastructure.trajectory import Trajectory
from infrastructure.transitions import Transitions

TASK = get_task("Pendulum-v1").resolve()
SEED, ROLLOUTS = 3, 16


class _Time:
    def measure(self, _name: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


class _Buffer:
    def __init__(self, trajectory: Trajectory) -> None:
        self.trajectory = trajectory

    def count(self, _agent: str) -> dict[str, int]:
        return {"transitions": len(self.trajectory.obs)}

    async def asample(self, _agent: str) -> list[Trajectory]:
        return [self.trajectory]


class _Learner:
    """The world model's and the critic's part in `learn`: train, and report."""

    async def train(self, *_a: Any, **_kw: Any) -> dict[str, Any]:
        return {}


def _learners() -> Learners:
    rng = np.random.default_rng(0)  # the test's data, not a stream of the project
    obs = rng.normal(size=(40, TASK.policy.obs_dim)).astype(np.float32)
    action = rng.uniform(-2, 2, size=(40, TASK.policy.act_dim))
    trajectory = Trajectory(
        obs=obs, action=action, reward=rng.normal(size=40), next_obs=obs + 0.1, done=np.zeros(40, dtype=bool)
    )
    cfg = EvolveConfig(seed=SEED, model_rollouts=ROLLOUTS, rollout_horizon=2, actor_rounds=0, workers=1)
    fakes: dict[str, Any] = {
        "settings": None,
        "buffer": _Buffer(trajectory),
        "state": SimpleNamespace(time=_Time()),
        "world_model": _Learner(),
        "critic": _Learner(),
    }
    return Learners(cfg, TASK, data_agent="data", run_id="run", **fakes)


async def test_rows_exploration_and_model_env_draw_from_three_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    streams: list[tuple[str, tuple[int, ...]]] = []
    rollouts: list[dict[str, Any]] = []

    def spy_generator(seed: int, stream: str, *index: int) -> torch.Generator:
        assert seed == SEED
        streams.append((stream, index))
        return torch_generator(seed, stream, *index)

    def fake_rollouts(
        _model: Any, policy: Any, start: torch.Tensor, _horizon: int, **kw: Any
    ) -> tuple[Transitions, dict]:
        first, again = policy(start), policy(start)  # two steps' noise: the exploration stream goes on
        rollouts.append({"start": start.clone(), "seed": kw["seed"], "actions": (first, again)})
        n = len(start)
        return Transitions(start, first, torch.zeros(n), start, torch.zeros(n)), {}

    monkeypatch.setattr(learners_module, "torch_generator", spy_generator)
    monkeypatch.setattr(model_env_module, "branched_rollouts", fake_rollouts)
    learners = _learners()
    space = ObsStats(TASK.policy.obs_dim).space(TASK.policy)
    z = np.zeros(TASK.n_params)
    for generation in (4, 5):
        await learners.learn(z, space, generation, new_steps=10)
    assert streams == [
        ("learners.rows", (4,)),
        ("learners.exploration", (4,)),
        ("learners.rows", (5,)),
        ("learners.exploration", (5,)),
    ]
    assert [r["seed"] for r in rollouts] == [stream_seed(SEED, "learners.model_env", g) for g in (4, 5)]
    seeds = {
        stream_seed(SEED, name, g)
        for name in ("learners.rows", "learners.exploration", "learners.model_env")
        for g in (4, 5)
    }
    assert len(seeds) == 6  # three uses, two generations: six unrelated streams

    # what was drawn: the replay rows from the rows stream, the noise from the exploration stream
    real = Transitions.from_trajectories([learners.buffer.trajectory])
    for generation, rollout in zip((4, 5), rollouts):
        rows = torch.randint(len(real), (ROLLOUTS,), generator=torch_generator(SEED, "learners.rows", generation))
        assert torch.equal(rollout["start"], real.obs[rows])
        mean = learners._mean_policy(z, space)(rollout["start"])
        noise = torch_generator(SEED, "learners.exploration", generation)
        half = (torch.tensor(TASK.policy.action_high) - torch.tensor(TASK.policy.action_low)) / 2
        for actions in rollout["actions"]:
            step = torch.randn(actions.shape, generator=noise)
            low, high = min(TASK.policy.action_low), max(TASK.policy.action_high)
            expected = torch.clamp(mean + EXPLORATION_NOISE * half * step, low, high)
            torch.testing.assert_close(actions, expected)
    assert not torch.equal(rollouts[0]["actions"][0], rollouts[0]["actions"][1])


def test_noise_needs_its_stream() -> None:
    learners = _learners()
    space = ObsStats(TASK.policy.obs_dim).space(TASK.policy)
    with pytest.raises(ValueError, match="noise without a generator"):
        learners._mean_policy(np.zeros(TASK.n_params), space, EXPLORATION_NOISE)

"""One typed run state (issue 46): `RunState` holds everything a generation
and a resume need, serialises to the manifest and back, and a resume builds it
once from the manifest and constructs the agent with it; the manifest I/O is
a `RunRecorder` the agent holds, not a base class."""

from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np
import pytest

from agents import runs
from agents.evolve_config import Candidate, EvolveConfig
from agents.manifest_check import STOP_REASONS, check_manifest
from agents.run_record import RunRecorder
from agents.run_state import RunState, Spent, StopReason
from agents.se_darwin_agent import SEDarwinAgent
from agents.tasks import get_task
from genesis_fp16.base.settings import load_settings
from loop_fakes import FakeEvaluator

pytestmark = pytest.mark.usefixtures("one_thread")

# nothing learned: the loop's state without the learners' cost
PLAIN = dict(popsize=6, use_world_model=False, use_critic=False, refined=0, target=-1.0, workers=1, budget=18)


def _resolved():
    return EvolveConfig(**PLAIN).resolve(get_task("Pendulum-v1"))


def test_the_state_round_trips_through_the_manifest() -> None:
    config, task = _resolved()
    state = RunState.new(config, task)
    asked = state.search.ask()
    state.search.tell([-float(np.linalg.norm(x)) for x in asked])
    state.pool = [
        Candidate(f"g0-{k}-cma", x, "cma", 0, real_return=-1.0, real_episodes=1, starts=[k], returns=[-1.0])
        for k, x in enumerate(asked)
    ]
    state.obs_stats.update(np.ones((4, task.policy.obs_dim)))
    state.generation, state.candidates_run, state.generations = (
        0,
        len(asked),
        [{"generation": 0, "real_episodes": 6, "env_steps": 1200}],
    )
    state.spent = Spent(
        real_episodes=6, env_steps=1200, failures=[{"candidate": "x", "generation": 0, "episodes": 1, "error": "e"}]
    )
    state.actor, state.snapshots["critic_checkpoint"] = np.arange(task.n_params, dtype=float), "critic-g0000.pt"
    state.decisions, state.time.seconds["real_episodes"], state.stop = (
        {"critic_checkpoint": {"mode": "fp32"}},
        1.5,
        StopReason.BUDGET,
    )
    manifest = runs.Manifest({"run_id": "r", "status": "running", **state.as_manifest(), "config": asdict(config)})
    check_manifest(json.loads(json.dumps(manifest)))  # what `agents.runs.read_manifest` accepts
    again = RunState.from_manifest(manifest, task)
    assert again.as_manifest() == state.as_manifest()
    np.testing.assert_array_equal(again.search.mean, state.search.mean)  # CMA-ES replayed, not just its record copied
    assert again.stop is StopReason.BUDGET and again.spent == state.spent and again.has_data()
    assert {s.value for s in StopReason} == set(STOP_REASONS)


def test_the_manifest_copy_never_shares_a_list_the_run_grows() -> None:
    config, task = _resolved()
    state = RunState.new(config, task)
    written = state.as_manifest()
    state.spent.failures.append({"candidate": "x"})
    state.search.tell([0.0] * len(state.search.ask()))
    assert written["failures"] == [] and written["search"]["told"] == []


def test_a_state_field_this_version_does_not_know_is_a_run_error() -> None:
    config, task = _resolved()
    manifest = RunState.new(config, task).as_manifest()
    manifest["state"]["surprise"] = 1
    with pytest.raises(runs.RunError, match=r"unknown fields \['surprise'\]; the run cannot be resumed"):
        RunState.from_manifest(manifest, task)


def test_the_agent_holds_its_recorder_and_one_state(state_dir) -> None:
    config, task = _resolved()
    agent = SEDarwinAgent(config, task=task, settings=load_settings(), evaluator=FakeEvaluator(task))
    assert SEDarwinAgent.__mro__ == (
        SEDarwinAgent,
        object,
    )  # composition: no base class declaring what the agent must provide
    assert isinstance(agent.recorder, RunRecorder) and agent.manifest_path == agent.recorder.manifest_path
    # the learners, the real episodes and the agent's views read the one state, never copies of it
    assert (
        agent.learners.state is agent.state and agent.real.spent is agent.state.spent and agent.time is agent.state.time
    )
    assert agent.search is agent.state.search and agent.pool is agent.state.pool


async def test_a_resume_builds_the_state_once_and_the_agent_with_it(state_dir, monkeypatch) -> None:
    config, task = _resolved()
    settings = load_settings()

    def stop_after_first(record):
        if record["generation"] == 0:
            raise KeyboardInterrupt

    first = SEDarwinAgent(
        config, task=task, settings=settings, evaluator=FakeEvaluator(task), on_generation=stop_after_first
    )
    with pytest.raises(KeyboardInterrupt):
        await first.evolve()

    def fresh(*args, **kwargs):
        raise AssertionError("a resume built a fresh state")

    monkeypatch.setattr(
        RunState, "new", fresh
    )  # a resume reads the state from the manifest; nothing is built and overwritten
    agent = SEDarwinAgent.resume(
        first.run_id, settings=settings, task=get_task("Pendulum-v1"), evaluator=FakeEvaluator(task)
    )
    assert agent.generation == 0 and agent.real_episodes == 6 and len(agent.pool) == 6 and agent.search.generations == 1
    assert agent.state.as_manifest() == {
        k: v for k, v in runs.read_manifest(state_dir, first.run_id).items() if k in agent.state.as_manifest()
    }
    report = await agent.evolve()
    assert report["real_episodes"] == 18 and report["stop_reason"] == "budget"
    finished = runs.read_manifest(state_dir, first.run_id)
    assert (
        finished["status"] == "finished"
        and finished["state"]["stop"] == "budget"
        and agent.state.stop is StopReason.BUDGET
    )

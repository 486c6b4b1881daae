"""Raced real evaluations and what the loop does around them, on a fake
evaluator and a fake world model (tests/loop_fakes.py): the stages and the
rule, every episode charged, a hopeless candidate stopped early, the target
confirmed on the validation start states (charged, required), the env-step
budget, the imagined-vs-real audit and time shares in the report, the
manifest round trip, and the same report for the same seed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agents.evaluation import Evaluation, EvaluationEnvError, EvaluationTimeout
from agents.evolve_config import DEFAULT_HORIZON, Candidate
from agents.racing import can_still_win, race, race_order, stage_sizes, upper_bound
from agents.runs import RunError, manifest_path, read_manifest, write_manifest
from agents.se_darwin_agent import EvolveConfig, SEDarwinAgent
from agents.tasks import get_task
from genesis_fp16.settings import load_settings
from loop_fakes import STEPS, FakeEvaluator, FakeWorldModel, distance_return

pytestmark = pytest.mark.usefixtures("one_thread")

PENDULUM = get_task("Pendulum-v1").resolve()
STARTS = PENDULUM.start_states(0)


def config(**kw) -> EvolveConfig:
    base = dict(budget=60, init_candidates=4, wm_steps=1, refine_iters=2, revision_iters=2, revision_samples=8, popsize=6,
                imagine_starts=4, workers=1, horizon=50, trust_spearman=None)
    base.update(kw)
    return EvolveConfig(**base)


def agent_with_fakes(cfg: EvolveConfig, *, score=distance_return, model: bool = True, **kw) -> SEDarwinAgent:
    return SEDarwinAgent(cfg, settings=load_settings(), evaluator=FakeEvaluator(PENDULUM, score=score),
                         world_model=FakeWorldModel() if model else None, **kw)


def charged_episodes(agent: SEDarwinAgent, heldout: bool = True) -> int:
    """Every episode the fake evaluator ran, the held-out evaluation's aside."""
    return sum(agent.evaluator.calls) - (len(STARTS.heldout) if heldout else 0)


# -- the stages and the rule -------------------------------------------------------------


def test_stages_double_and_end_with_every_training_state():
    assert stage_sizes(16, True) == [2, 4, 8, 16] and stage_sizes(16, False) == [16]
    assert stage_sizes(5, True) == [2, 4, 5] and stage_sizes(2, True) == [2] and stage_sizes(1, True) == [1]
    order = race_order(16, 3)
    assert sorted(order) == list(range(16)) and order == race_order(16, 3) != race_order(16, 4)


def test_the_rule_on_known_numbers():
    incumbent = {0: -100.0, 1: -105.0}
    # paired: d = [-400, -405], mean -402.5, sd 3.54, t90(1) 3.078: -402.5 + 3.078 * 3.54 / sqrt(2) = -394.8 < 0
    assert upper_bound([-400.0, -405.0]) == pytest.approx(-402.5 + 3.078 * math.sqrt(12.5) / math.sqrt(2))
    assert not can_still_win({0: -500.0, 1: -510.0}, incumbent, target=-300.0)
    assert can_still_win({0: -120.0, 1: -40.0}, incumbent, target=-300.0)  # worse on one, better on the other: wide bound
    # below the incumbent for sure, but the target (below the incumbent's mean) is still within reach
    assert not can_still_win({0: -200.0, 1: -201.0}, incumbent, target=-150.0)
    assert can_still_win({0: -200.0, 1: -250.0}, {0: -100.0, 1: -100.0}, target=-300.0)
    assert can_still_win({0: -1e9}, incumbent, target=0.0)  # one state: nothing to judge by
    assert can_still_win({0: -1e9, 1: -1e9}, None, target=0.0)  # no incumbent: nothing to lose to


async def test_race_stops_a_hopeless_candidate_and_charges_its_episodes():
    calls = []

    async def evaluate(params, states):
        calls.append(len(states))
        return Evaluation(returns=[float(params[0])] * len(states), episodes=[{}] * len(states))

    order = race_order(16, 0)
    incumbent = {i: -100.0 + i for i in range(16)}
    hopeless = await race(evaluate, np.array([-1000.0]), STARTS.train, order, [2, 4, 8, 16], incumbent=incumbent, target=0.0)
    assert calls == [2] and hopeless.episodes == 2 and hopeless.starts == order[:2] and hopeless.error is None
    calls.clear()
    better = await race(evaluate, np.array([-50.0]), STARTS.train, order, [2, 4, 8, 16], incumbent=incumbent, target=0.0)
    assert calls == [2, 2, 4, 8] and better.episodes == 16 and better.starts == order
    calls.clear()
    alone = await race(evaluate, np.array([-1000.0]), STARTS.train, order, [2, 4, 8, 16], incumbent=None, target=0.0)
    assert calls == [16] and alone.episodes == 16  # nothing to beat yet: evaluated on every state at once

    async def fails_later(params, states):
        calls.append(len(states))
        if len(calls) == 2:
            raise EvaluationTimeout("did not finish")
        return Evaluation(returns=[0.0] * len(states), episodes=[{}] * len(states))

    calls.clear()
    lost = await race(fails_later, np.array([0.0]), STARTS.train, order, [2, 4, 8, 16], incumbent=incumbent, target=0.0)
    assert lost.episodes == 4 and lost.evaluation is None and isinstance(lost.error, EvaluationTimeout)  # both stages charged


# -- the loop with racing ----------------------------------------------------------------


async def test_every_episode_is_charged_and_hopeless_candidates_stop_early(state_dir):
    agent = agent_with_fakes(config(target=10.0))  # never reached: the budget stops the run
    report = await agent.evolve()
    assert report["stop_reason"] == "budget" and report["budget_exhausted"] == "episodes"
    assert report["real_episodes"] == charged_episodes(agent) <= 60 < report["real_episodes"] + 16
    evaluated = [e for g in report["generations"] for e in g["evaluated"]]
    assert sum(e["episodes"] for e in evaluated) == report["real_episodes"]
    stopped = [e for e in evaluated if e["operator"] != "seed" and not e["full"]]
    assert stopped and all(e["episodes"] in (2, 4, 8) for e in stopped)  # raced and stopped before the 16 states
    pool = {c.id: c for c in agent.pool}
    for e in stopped:  # scored by the partial mean, kept in the pool with its per-start returns
        cand = pool[e["id"]]
        assert cand.real_episodes == len(cand.starts) == len(cand.returns) == e["episodes"]
        assert cand.real_return == pytest.approx(np.mean(cand.returns)) and cand.starts == agent.real.order[: e["episodes"]]
    best = report["best_candidate"]["id"]
    assert pool[best].full  # a full evaluation outranks any partial one
    # the search's statistics hold every committed observation, and only those
    assert agent.obs_stats.count == report["real_episodes"] * STEPS


async def test_racing_applies_without_a_world_model_and_can_be_switched_off(state_dir):
    raced = await agent_with_fakes(config(target=10.0, use_world_model=False), model=False).evolve()
    assert raced["mode"] == "no_world_model" and raced["imagination"]["candidates"] == 0
    episodes = [e["episodes"] for g in raced["generations"][1:] for e in g["evaluated"]]
    assert any(n < 16 for n in episodes)
    plain = await agent_with_fakes(config(target=10.0, use_world_model=False, racing=False), model=False).evolve()
    assert all(e["episodes"] == 16 for g in plain["generations"][1:] for e in g["evaluated"])


def validation_penalty(penalty: float):
    """0 on the training start states, ``-penalty`` on the validation ones."""
    validation = {tuple(row) for row in STARTS.validation}

    def score(params, state):
        return -penalty if tuple(state) in validation else 0.0

    return score


async def test_the_target_is_confirmed_on_the_validation_states(state_dir):
    agent = agent_with_fakes(config(target=-500.0), score=validation_penalty(0.0))
    report = await agent.evolve()
    # generation 0's probe met the target on its one episode; generation 1 evaluated it on every
    # training start state, then on the 8 validation ones: charged, and the run stops only then
    assert report["stop_reason"] == "target" and report["target_reached"]
    assert report["episodes_to_target"] == report["real_episodes"] == 4 + 16 + 8 == charged_episodes(agent)
    assert report["validation_return"] == 0.0 and report["validation_start_states"] == 8
    assert [c["confirmed"] for c in report["confirmations"]] == [True]
    assert "confirmed on the 8 validation start states (mean 0.0)" in report["stop_detail"]
    assert agent.obs_stats.count == (4 + 16) * STEPS  # the validation episodes stay out of the search


async def test_a_target_the_validation_states_refute_does_not_stop_the_run(state_dir):
    agent = agent_with_fakes(config(target=-500.0), score=validation_penalty(1000.0))
    report = await agent.evolve()
    assert not report["target_reached"] and report["stop_reason"] == "budget"
    tries = report["confirmations"]
    assert len(tries) >= 2 and not any(c["confirmed"] for c in tries) and all(c["validation_return"] == -1000.0 for c in tries)
    assert report["real_episodes"] == charged_episodes(agent)  # the validation episodes are charged too
    assert "not confirmed on the 8 validation start states" in report["stop_detail"]
    assert agent.world_model.train_calls == len(report["generations"])  # the model goes on learning after a refuted target
    assert [g["confirmations"] for g in report["generations"]][1][0]["confirmed"] is False


async def test_a_target_with_no_budget_left_to_confirm_it_stops_unconfirmed(state_dir):
    report = await agent_with_fakes(config(target=-500.0, budget=20), score=validation_penalty(0.0)).evolve()
    assert not report["target_reached"] and report["stop_reason"] == "budget" and report["real_episodes"] == 20
    assert report["unconfirmed"] is not None and report["confirmations"] == []
    assert "no room to confirm it on the 8 validation start states" in report["stop_detail"]


async def test_the_env_step_budget_stops_the_run(state_dir):
    # fake episodes are 5 steps long, but each may run 200 (Pendulum's episode): a full evaluation may take 3200
    agent = agent_with_fakes(config(target=10.0, budget=200, budget_steps=3400))
    report = await agent.evolve()
    assert report["stop_reason"] == "budget" and report["budget_exhausted"] == "env_steps" and report["budget_steps"] == 3400
    assert report["env_steps"] == report["real_episodes"] * STEPS and report["env_steps"] + 16 * 200 > 3400 >= report["env_steps"]
    assert report["real_episodes"] < 200
    assert report["stop_detail"].startswith(f"budget spent: {report['env_steps']} of 3400 real env steps used")
    with pytest.raises(ValueError, match=r"budget_steps=3000: expected at least 3200 real env steps"):
        config(budget_steps=3000).resolve()
    with pytest.raises(ValueError, match=r"budget_steps=0: expected >= 1"):
        config(budget_steps=0).validate()


def test_the_new_options_are_checked():
    with pytest.raises(ValueError) as err:
        config(kappa=float("nan"), particles=0, imagine_starts=0).validate()
    assert all(s in str(err.value) for s in ("kappa=nan: expected a finite number >= 0", "particles=0: expected >= 1",
                                               "imagine_starts=0: expected >= 1"))
    with pytest.raises(ValueError, match=r"horizon=201: expected at most the episode length \(200 steps\)"):
        config(horizon=201).resolve()
    assert EvolveConfig().racing and EvolveConfig().eval_top_k == 3 and EvolveConfig().kappa == 1.0 and EvolveConfig().imagine_starts == 8


def test_the_default_horizon_is_capped_on_long_episodes_and_the_episode_on_pendulum():
    assert DEFAULT_HORIZON == 200
    # Pendulum-v1's 200-step episodes are imagined whole, as before the cap
    assert config(horizon=None).resolve()[0].horizon == PENDULUM.episode_steps == 200
    assert config(horizon=None, episode_steps=120).resolve()[0].horizon == 120  # an episode shorter than the cap: the episode
    assert config(horizon=None, episode_steps=1000).resolve()[0].horizon == DEFAULT_HORIZON  # a long episode: the cap
    assert config(horizon=300, episode_steps=1000).resolve()[0].horizon == 300  # an explicit horizon wins
    # a registered long-episode task (the report's config is the resolved one: it records the horizon used)
    swimmer, task = EvolveConfig(env_id="Swimmer-v5").resolve()
    assert task.episode_steps == 1000 and swimmer.horizon == DEFAULT_HORIZON


async def test_the_search_imagines_the_capped_horizon_and_extrapolates_to_the_episode(state_dir):
    agent = agent_with_fakes(config(target=10.0, horizon=None, episode_steps=400))
    await agent.evolve()
    assert {c["horizon"] for c in agent.world_model.calls} == {DEFAULT_HORIZON}
    assert {c["episode_steps"] for c in agent.world_model.calls} == {400}


async def test_a_failed_stage_charges_the_whole_race(state_dir):
    def fail_on(params, states):
        return EvaluationEnvError("env raised in step") if len(states) == 4 else None  # a race's third stage (states 5-8)

    agent = SEDarwinAgent(config(target=10.0), settings=load_settings(), world_model=FakeWorldModel(),
                          evaluator=FakeEvaluator(PENDULUM, fail_on=fail_on))
    report = await agent.evolve()
    failed = report["failed_candidates"]
    assert failed and all(f["episodes"] == 2 + 2 + 4 for f in failed)  # the stages before it are charged too
    evaluated = sum(e["episodes"] for g in report["generations"] for e in g["evaluated"])
    assert evaluated + sum(f["episodes"] for f in failed) == report["real_episodes"] == charged_episodes(agent)


# -- what the report says of the model ---------------------------------------------------


async def test_the_report_says_how_good_the_model_is_and_where_the_time_went(state_dir):
    agent = agent_with_fakes(config(target=10.0, kappa=2.0, particles=3, horizon=50))
    report = await agent.evolve()
    imagination = report["imagination"]
    assert set(imagination) == {"spearman", "calibration", "rel_error", "candidates", "truncated"}
    records = [r for g in report["generations"] if g["imagination"] for r in g["imagination"]["records"]]
    assert imagination["candidates"] == len(records) >= 3
    # the fake imagines -100 |params| +- 50; real returns lose at most 10 pi more: always inside
    assert imagination["calibration"] == 1.0 and imagination["truncated"] == 0.0
    assert imagination["spearman"] > 0.9 and imagination["rel_error"] < 0.2
    train_obs = PENDULUM.task.exact_states.observe(STARTS.train).astype(np.float32)
    for r in records:
        cand = next(c for c in agent.pool if c.id == r["id"])
        assert r["states"] == len(cand.starts) and r["real_mean"] == pytest.approx(np.mean(cand.returns))
        # like for like: the audit imagined it on exactly the training start states it was run on, in that order
        assert any(c["P"] == 1 and np.array_equal(c["obs"], train_obs[cand.starts]) for c in agent.world_model.calls)
    search = agent.world_model.calls[0]
    assert search["kappa"] == 2.0 and search["particles"] == 3 and search["horizon"] == 50 and search["episode_steps"] == 200
    assert search["S"] == 4  # imagine_starts
    share = report["time_share"]
    assert set(share) == {"model_train", "imagine", "search", "real_episodes", "other", "model_share"}
    assert all(share[k] >= 0 for k in share) and 0 < share["model_share"] < 1
    assert all(set(g["time"]) == {"model_train", "imagine", "search", "real_episodes"} for g in report["generations"])


# -- resume and determinism --------------------------------------------------------------

VOLATILE = {"wall_s", "run_id", "replay_db", "run_manifest", "resumed", "resumed_from", "generations", "time_share"}
VOLATILE_GENERATION = {"elapsed_s", "wm_wall_s", "time"}


def comparable(report: dict) -> dict:
    data = {k: v for k, v in report.items() if k not in VOLATILE}
    data["generations"] = [{k: v for k, v in g.items() if k not in VOLATILE_GENERATION} for g in report["generations"]]
    return data


async def test_same_seed_same_report(state_dir):
    first = await agent_with_fakes(config(target=10.0)).evolve()
    second = await agent_with_fakes(config(target=10.0)).evolve()
    assert first["run_id"] != second["run_id"] and comparable(first) == comparable(second)


def interrupt_after(generation: int):
    def on_generation(record):
        if record["generation"] == generation:
            raise KeyboardInterrupt

    return on_generation


async def test_resume_keeps_racing_statistics_and_confirmations(tmp_path):
    cfg = config(target=-500.0, budget=100)
    score = validation_penalty(1000.0)  # refuted confirmations: they must survive the resume
    expected = await SEDarwinAgent(cfg, settings=load_settings(state_dir=tmp_path / "whole"), world_model=FakeWorldModel(),
                                   evaluator=FakeEvaluator(PENDULUM, score=score)).evolve()
    settings = load_settings(state_dir=tmp_path / "cut")
    first = SEDarwinAgent(cfg, settings=settings, world_model=FakeWorldModel(), evaluator=FakeEvaluator(PENDULUM, score=score),
                          on_generation=interrupt_after(2))
    with pytest.raises(KeyboardInterrupt):
        await first.evolve()
    manifest = read_manifest(settings.state_dir, first.run_id)
    assert manifest["version"] == 2 and manifest["obs_stats"]["count"] == first.obs_stats.count > 0
    assert manifest["confirmations"] and set(manifest["time"]) == {"model_train", "imagine", "search", "real_episodes"}
    raced = [c for c in manifest["pool"] if c["starts"]]
    assert raced and all(len(c["starts"]) == len(c["returns"]) == c["real_episodes"] for c in raced)
    agent = SEDarwinAgent.resume(first.run_id, settings=settings, world_model=FakeWorldModel(), evaluator=FakeEvaluator(PENDULUM, score=score))
    np.testing.assert_array_equal(agent.obs_stats.mean, first.obs_stats.mean)
    assert [c.as_dict() for c in agent.pool] == [c.as_dict() for c in first.pool]
    report = await agent.evolve()
    assert report["resumed"] and comparable(report) == comparable(expected)
    assert report["time_share"]["real_episodes"] >= manifest["time"]["real_episodes"]  # the earlier session's time carried over


async def test_a_manifest_from_before_racing_is_one_clear_error(state_dir):
    settings = load_settings()
    first = agent_with_fakes(config(target=10.0), on_generation=interrupt_after(0))
    with pytest.raises(KeyboardInterrupt):
        await first.evolve()
    manifest = read_manifest(state_dir, first.run_id)
    manifest.pop("format"), manifest.pop("version")
    path = manifest_path(state_dir, first.run_id)
    write_manifest(state_dir, manifest)
    path.write_text(path.read_text().replace('"version": 2', '"version": 1'))
    with pytest.raises(RunError, match=r"manifest is version 1, written before raced evaluations .* start a new run"):
        SEDarwinAgent.resume(first.run_id, settings=settings, world_model=FakeWorldModel(), evaluator=FakeEvaluator(PENDULUM))


def test_candidates_without_per_start_returns_still_load():
    old = {"id": "c", "params": [0.0, 1.0], "operator": "seed", "generation": 0, "imagined": None, "real_return": -5.0,
           "real_episodes": 1, "full": False}
    cand = Candidate.from_dict(old)
    assert cand.starts == [] and cand.returns == [] and cand.confirmed is None and cand.start_returns() == {}

"""SE-Darwin: each operator, real evaluations with a timeout, a tiny loop end
to end (events, replay buffer, report), the plain CMA-ES baseline, and an
interrupted loop keeping its committed generations."""

from __future__ import annotations

import dataclasses
import functools
import sys
import time

import numpy as np
import pytest

from agents import pendulum_task
from agents.evaluation import EvaluationMemoryError, EvaluationTimeout, Evaluator
from agents.se_darwin_agent import (
    Candidate,
    EvolveConfig,
    SEDarwinAgent,
    pool_failing,
    recombination,
    refinement,
    revision,
    run_cma_baseline,
)
from genesis_fp16 import telemetry
from genesis_fp16.settings import load_settings
from infrastructure.replay_buffer import ReplayBuffer
from loss_faults import loss_fault, nan_storm

OPTIMUM = np.linspace(-1.0, 1.0, pendulum_task.N_PARAMS)


def synthetic_imagine(params: np.ndarray) -> np.ndarray:
    """A stand-in world model: imagined return peaks at OPTIMUM."""
    return -((np.asarray(params) - OPTIMUM) ** 2).sum(axis=1)


pytestmark = pytest.mark.usefixtures("one_thread")


def _cand(ret: float, full: bool = True, params=None) -> Candidate:
    return Candidate("c", np.zeros(pendulum_task.N_PARAMS) if params is None else params, "seed", 0, real_return=ret, full=full)


def test_revision_only_where_the_pool_is_failing():
    rng = np.random.default_rng(0)
    failing = [_cand(-900.0), _cand(-250.0, full=False)]  # a single-episode score does not count as meeting the target
    assert pool_failing(failing, -300.0)
    out = revision(failing, rng, target=-300.0, n_params=pendulum_task.N_PARAMS, imagine=synthetic_imagine, samples=32, iters=15, popsize=8, sigma=0.3)
    assert len(out) == 1 and out[0].shape == (pendulum_task.N_PARAMS,)
    random_scores = synthetic_imagine(rng.normal(0.0, 0.5, size=(64, pendulum_task.N_PARAMS)))
    assert synthetic_imagine(out[0][None])[0] > np.max(random_scores)  # searched, not just sampled
    assert revision([_cand(-250.0)], rng, target=-300.0, n_params=pendulum_task.N_PARAMS, imagine=synthetic_imagine) == []
    blind = revision(failing, rng, target=-300.0, n_params=pendulum_task.N_PARAMS, imagine=None)  # without a model: one fresh random policy
    assert len(blind) == 1 and not np.allclose(blind[0], 0.0)


def test_recombination_blends_two_parents():
    rng = np.random.default_rng(1)
    a, b = np.zeros(pendulum_task.N_PARAMS), np.arange(pendulum_task.N_PARAMS, dtype=float)
    children = recombination(a, b, rng, n=5)
    assert len(children) == 5
    for child in children:
        w = child[1] / b[1]
        assert 0.2 <= w <= 0.8
        np.testing.assert_allclose(child, a + w * (b - a))  # on the segment between the parents
    assert len({round(c[1], 6) for c in children}) == 5


def test_refinement_improves_imagined_return():
    rng = np.random.default_rng(2)
    x0 = OPTIMUM + 0.5
    refined = refinement(x0, rng, imagine=synthetic_imagine, sigma=0.3, iters=25, popsize=10, seed=3)[0]
    before, after = synthetic_imagine(x0[None])[0], synthetic_imagine(refined[None])[0]
    assert after > before * 0.5, f"CMA-ES in the model should at least halve the gap: {before:.2f} -> {after:.2f}"
    step = refinement(x0, rng, imagine=None, sigma=0.3)[0]  # without a model: one Gaussian step
    assert 0.1 < np.std(step - x0) < 0.6


def test_evaluation_timeout_does_not_hang_the_loop():
    evaluator = Evaluator(workers=1, timeout_s=1.0)
    params = np.zeros(pendulum_task.N_PARAMS)
    good = evaluator.spec
    # an env that takes 60 s to make (picklable: the worker is a spawned process)
    evaluator.spec = dataclasses.replace(good, env_factory=functools.partial(time.sleep, 60))
    started = time.perf_counter()
    with pytest.raises(EvaluationTimeout, match="did not finish within 1 s"):
        evaluator.evaluate(params, [[0.0, 0.0]])
    assert time.perf_counter() - started < 20
    evaluator.spec = good
    evaluator.timeout_s = 60.0  # a fresh pool's start-up under load is not what is checked here
    res = evaluator.evaluate(params, [[0.0, 0.0], [1.0, 0.0]])  # a fresh pool takes over
    evaluator.close()
    assert len(res.returns) == 2 and all(np.isfinite(res.returns))
    assert res.episodes[0]["obs"].shape == (pendulum_task.EPISODE_STEPS, 3)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS with /proc/self/status: Linux")
def test_evaluation_workers_have_a_memory_limit():
    with Evaluator(workers=1, timeout_s=60, memory_limit_mb=256) as evaluator:
        pool = evaluator._get_pool()
        # a runaway allocation fails inside the worker, not on the machine
        with pytest.raises(MemoryError):
            pool.submit(bytearray, 512 * 1024 * 1024).result(timeout=60)
        res = evaluator.evaluate(np.zeros(pendulum_task.N_PARAMS), [[0.0, 0.0]])  # real episodes fit
        # an episode over the limit is an EvaluationMemoryError the loop can charge and skip
        good = evaluator.spec  # an env that allocates 512 MiB when made, in the worker
        evaluator.spec = dataclasses.replace(good, env_factory=functools.partial(bytearray, 512 * 1024 * 1024))
        with pytest.raises(EvaluationMemoryError, match="memory limit"):
            evaluator.evaluate(np.zeros(pendulum_task.N_PARAMS), [[0.0, 0.0], [1.0, 0.0]])
        evaluator.spec = good
        again = evaluator.evaluate(np.zeros(pendulum_task.N_PARAMS), [[0.0, 0.0]])
    assert np.isfinite(res.returns[0]) and again.returns == res.returns
    with pytest.raises(ValueError, match="memory_limit_mb=0"):
        Evaluator(memory_limit_mb=0)


def test_real_evaluation_matches_in_process_episodes():
    params = pendulum_task.random_params(np.random.default_rng(4), 1)[0]
    states = pendulum_task.start_states(0).train[:3]
    with Evaluator(workers=2, timeout_s=60) as evaluator:
        res = evaluator.evaluate(params, states)
    local = pendulum_task.run_episodes(params, states)
    np.testing.assert_allclose(res.returns, local["returns"], rtol=1e-6)


def tiny_config(**kw) -> EvolveConfig:
    base = dict(
        budget=24, init_candidates=8, wm_steps=40, refine_iters=2, revision_iters=2, revision_samples=8,
        popsize=6, horizon=20, imagine_starts=4, workers=1, eval_timeout_s=60,
        trust_spearman=None,  # the model's proposals get every generation (probe generations: test_probe_search.py)
    )
    base.update(kw)
    return EvolveConfig(**base)


async def test_tiny_loop_end_to_end(state_dir):
    settings = load_settings()
    seen = []
    agent = SEDarwinAgent(tiny_config(), settings=settings, on_generation=seen.append)
    report = await agent.evolve()
    for key in ("real_episodes", "heldout_return", "train_return", "target_reached", "precision", "wall_s", "generations"):
        assert key in report
    assert report["real_episodes"] == 24 <= report["budget"]  # 8 probes + one full evaluation
    assert report["precision"] == agent.world_model.precision
    assert [g["generation"] for g in report["generations"]] == [0, 1] == [g["generation"] for g in seen]
    assert all(g["wm_val_loss"] is not None and np.isfinite(g["wm_val_loss"]) for g in report["generations"])
    assert report["generations"][1]["evaluated"][0]["operator"] in {"refinement", "revision", "recombination"}
    assert report["generations"][1]["evaluated"][0]["imagined"] is not None  # the model ranked it
    counts = ReplayBuffer(settings=settings).count(agent.data_agent)
    assert counts == {"trajectories": 24, "transitions": 24 * pendulum_task.EPISODE_STEPS, "generations": 2}
    events = [e for e in telemetry.read_events(settings.events_path) if e.get("event") == "evolve.generation"]
    assert [e["generation"] for e in events] == [0, 1]
    assert all("wm_val_loss" in e and "real_episodes" in e and "precision" in e for e in events)


async def test_loop_without_world_model(state_dir):
    agent = SEDarwinAgent(tiny_config(use_world_model=False), settings=load_settings())
    assert agent.world_model is None
    report = await agent.evolve()
    assert report["mode"] == "no_world_model" and report["precision"] == "none"
    assert report["generations"][1]["evaluated"][0]["imagined"] is None


async def test_cma_baseline_same_keys_and_budget(state_dir):
    report = await run_cma_baseline(tiny_config(budget=40))
    assert report["mode"] == "cma" and report["real_episodes"] == 32 and not report["target_reached"]
    for key in ("real_episodes", "heldout_return", "train_return", "target_reached", "precision", "wall_s", "generations"):
        assert key in report


class InterruptingEvaluator(Evaluator):
    """Raises KeyboardInterrupt on the first full evaluation (generation 1)."""

    def evaluate(self, params, states, **kw):
        if len(states) > 1:
            raise KeyboardInterrupt
        return super().evaluate(params, states, **kw)


async def test_interrupt_keeps_committed_generations(state_dir):
    settings = load_settings()
    agent = SEDarwinAgent(tiny_config(), settings=settings, evaluator=InterruptingEvaluator(workers=1, timeout_s=60))
    with pytest.raises(KeyboardInterrupt):
        await agent.evolve()
    counts = ReplayBuffer(settings=settings).count(agent.data_agent)
    assert counts["generations"] == 1 and counts["trajectories"] == 8


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="CartPole-v1.*action space Discrete.*flat Box"):
        EvolveConfig(env_id="CartPole-v1").resolve()
    with pytest.raises(ValueError, match="budget=5.*16 real episodes"):
        EvolveConfig(budget=5, init_candidates=4).resolve()


def test_precision_option_uses_the_precision_vocabulary():
    from genesis_fp16.settings import PrecisionMode

    for mode in PrecisionMode:  # every mode the trainer knows, and nothing hard-coded here
        EvolveConfig(precision=mode.value).validate()
    EvolveConfig(precision=None).validate()  # settings and the profile decide
    with pytest.raises(ValueError) as err:
        EvolveConfig(precision="fp8").validate()
    assert "precision='fp8'" in str(err.value)
    assert ", ".join(m.value for m in PrecisionMode) in str(err.value)  # the allowed values, listed from the enum


def test_seed_generation_cannot_overspend_the_budget():
    # generation 0 spends one real episode per initial candidate, before any budget check in the loop
    with pytest.raises(ValueError, match="init_candidates=20"):
        EvolveConfig(budget=16, init_candidates=20).validate()
    EvolveConfig(budget=16, init_candidates=16).validate()


class InProcessEvaluator(Evaluator):
    """Real episodes in this process (the same numbers as the workers give,
    see test_real_evaluation_matches_in_process_episodes), without their start-up."""

    def evaluate_many(self, jobs, **kw):
        from agents.evaluation import Evaluation

        out = []
        for params, states in jobs:
            res = pendulum_task.run_episodes(params, states)
            out.append(Evaluation(returns=res["returns"], episodes=res["episodes"]))
        return out


RUN_SPECIFIC = ("run_id", "run_manifest", "wall_s", "elapsed_s", "wm_wall_s", "time_share", "time")  # names, paths and times of the run


def _comparable(report: dict) -> dict:
    """A report without what names or times the run."""
    out = {k: v for k, v in report.items() if k not in RUN_SPECIFIC}
    out["generations"] = [{k: v for k, v in g.items() if k not in RUN_SPECIFIC} for g in report["generations"]]
    return out


async def test_same_seed_same_report_in_a_used_state_dir(state_dir):
    """The second run in one state dir finds the first run's rows in the
    replay database (other row ids) and its entries in the ledger; with the
    same seed it must still give the same report."""
    settings = load_settings()
    reports = []
    for _ in range(2):
        agent = SEDarwinAgent(tiny_config(), settings=settings, evaluator=InProcessEvaluator(workers=1))
        reports.append(await agent.evolve())
    first, second = reports
    assert first["run_id"] != second["run_id"]
    assert ReplayBuffer(settings=settings).count()["trajectories"] == 2 * 24  # both runs' data is in the file
    assert [g["wm_val_loss"] for g in first["generations"]] == [g["wm_val_loss"] for g in second["generations"]]
    assert (first["heldout_return"], first["train_return"]) == (second["heldout_return"], second["train_return"])
    assert _comparable(first) == _comparable(second)


class NormScoredEvaluator(Evaluator):
    """Real Pendulum episodes (for the replay buffer), scored -|params| so a
    test can place the target; a full evaluation scores ``full_offset`` lower."""

    def __init__(self, full_offset: float = 0.0) -> None:
        super().__init__(workers=1)
        self.full_offset = full_offset

    def evaluate_many(self, jobs, **kw):
        from agents.evaluation import Evaluation

        out = []
        for params, states in jobs:
            res = pendulum_task.run_episodes([float(v) for v in params], [list(map(float, s)) for s in states])
            score = -float(np.linalg.norm(params)) - (self.full_offset if len(states) > 1 else 0.0)
            out.append(Evaluation(returns=[score] * len(states), episodes=res["episodes"]))
        return out


def best_probe_score(seed: int = 0, n: int = 8) -> float:
    params = pendulum_task.random_params(np.random.default_rng(seed), n)
    return max(-float(np.linalg.norm(p)) for p in params)


async def test_probe_meeting_the_target_is_promoted_to_a_full_evaluation(state_dir):
    target = best_probe_score()  # exactly one generation-0 probe meets it on its single episode
    agent = SEDarwinAgent(tiny_config(budget=40, target=target), settings=load_settings(), evaluator=NormScoredEvaluator())
    report = await agent.evolve()
    gen1 = report["generations"][1]["evaluated"]
    assert [e["operator"] for e in gen1] == ["seed"] and gen1[0]["id"].startswith("g0-")  # verified, nothing proposed
    # the full evaluation met the target, and the 8 validation start states confirmed it (charged too)
    assert report["target_reached"] and report["episodes_to_target"] == 8 + 16 + 8
    assert report["confirmations"] == [{"candidate": gen1[0]["id"], "generation": 1, "train_return": report["train_return"],
                                        "validation_return": report["validation_return"], "episodes": 8, "confirmed": True}]
    assert len(agent.pool) == 8 and len({c.id for c in agent.pool}) == 8  # promoted in place, not added twice


async def test_promoted_probe_that_fails_in_full_is_not_promoted_again(state_dir):
    agent = SEDarwinAgent(
        tiny_config(budget=40, target=best_probe_score()), settings=load_settings(), evaluator=NormScoredEvaluator(full_offset=1000.0)
    )
    report = await agent.evolve()
    ops = [[e["operator"] for e in g["evaluated"]] for g in report["generations"][1:]]
    assert ops[0] == ["seed"] and ops[1][0] in {"refinement", "revision", "recombination"}
    # the budget stops the run once another full evaluation (16 episodes) no longer fits
    assert not report["target_reached"] and report["real_episodes"] + 16 > 40 >= report["real_episodes"]


async def test_each_task_has_its_own_world_model_agent(state_dir):
    """`world_model.<task id>` by default: a rollback of one task's world model
    leaves another task's world model in its stage (and precision)."""
    from genesis_fp16.guard import RollbackGuard
    from genesis_fp16.rollout import RolloutLedger
    from infrastructure.world_model import WorldModel
    from tests.test_world_model import _linear_trajs

    names = [EvolveConfig(env_id=env, budget=100).resolve()[0].wm_agent for env in ("Pendulum-v1", "MountainCarContinuous-v0")]
    assert names == ["world_model.Pendulum-v1", "world_model.MountainCarContinuous-v0"]
    assert EvolveConfig(wm_agent="mine").resolve()[0].wm_agent == "mine"
    settings = load_settings()
    ledger = RolloutLedger.from_settings(settings)
    models = {}
    for name in names:
        ledger.enable(name, actor="test")
        models[name] = WorldModel(3, 1, agent=name, settings=settings, precision="bf16", checkpoint_dir=state_dir / "wm" / name)
    trajs = _linear_trajs(3, 50)
    for model in models.values():
        await model.train(20, trajectories=trajs)
    with loss_fault(models[names[0]], nan_storm(5, 20)):
        hit = await models[names[0]].train(20, trajectories=trajs)
    assert hit.rolled_back and isinstance(models[names[0]].guard, RollbackGuard)
    assert ledger.stage(names[0]) == "rolled_back" and ledger.stage(names[1]) == "on"
    assert (await models[names[1]].train(20, trajectories=trajs)).precision == "bf16"
    assert (state_dir / "wm" / names[0] / f"{names[0]}.pt").exists()  # the name is a checkpoint file name too


class InProcessTaskEvaluator(Evaluator):
    """A task's real episodes in this process, without the workers' start-up."""

    def evaluate_many(self, jobs, **kw):
        from agents.evaluation import Evaluation
        from agents.tasks import run_episodes

        out = []
        for params, states in jobs:
            res = run_episodes(self.spec, [float(v) for v in params], [list(map(float, s)) for s in states])
            out.append(Evaluation(returns=res["returns"], episodes=res["episodes"]))
        return out


async def test_a_return_of_zero_meets_a_target_of_zero(state_dir):
    """Every episode of Still returns exactly 0.0: with one training start
    state each generation-0 probe is a full evaluation that meets the target."""
    from agents.tasks import Task

    import task_envs

    task = Task(env_id="Still", env_factory=task_envs.still, target=0.0, n_train=1, n_heldout=1, n_validation=8)
    config = EvolveConfig(budget=12, init_candidates=4, use_world_model=False, workers=1)
    agent = SEDarwinAgent(config, task=task, settings=load_settings(), evaluator=InProcessTaskEvaluator(task.resolve(), workers=1))
    report = await agent.evolve()
    assert report["target_reached"] and report["stop_reason"] == "target"
    # met in generation 0 and confirmed on the 8 validation start states; nothing proposed
    assert report["episodes_to_target"] == 4 + 8 and len(report["generations"]) == 1
    assert report["train_return"] == 0.0
    outcomes = [t.outcome for t in ReplayBuffer(settings=load_settings()).sample(agent.data_agent)]
    assert outcomes == ["target"] * 4


def _full(name: str, params, ret: float) -> Candidate:
    return Candidate(name, np.asarray(params, dtype=float), "seed", 0, real_return=ret, full=True)


def test_a_return_of_zero_ranks_as_zero():
    """Recombination blends the two best full evaluations: 0.0 and -0.5, not -0.5 and -1."""
    from agents.operators import propose

    pool = [_full("a", [0.0, 1.0], 0.0), _full("b", [1.0, 1.0], -0.5), _full("c", [5.0, 5.0], -1.0)]
    assert pool[0].meets(0.0) and not pool_failing(pool, 0.0)
    cfg = EvolveConfig(use_world_model=False, recombinations=3)
    cands = propose(pool, np.random.default_rng(0), cfg, 1, None, n_params=2)
    blends = [c.params for c in cands if c.operator == "recombination"]
    assert len(blends) == 3
    assert all(b[1] == 1.0 and 0.0 < b[0] < 1.0 for b in blends)  # on the segment from a to b


def test_an_imagined_return_of_zero_ranks_as_zero():
    """Ranked by imagined return: the blends (imagined 0.0) before the refinement (imagined -1)."""
    from agents.operators import propose

    def imagine(params: np.ndarray) -> np.ndarray:
        on_segment = (params[:, 1] == 1.0) & (params[:, 0] > 0.0) & (params[:, 0] < 1.0)
        return np.where(on_segment, 0.0, -1.0)

    pool = [_full("a", [0.0, 1.0], 0.0), _full("b", [1.0, 1.0], -0.5)]
    cfg = EvolveConfig(recombinations=3, refine_iters=2, popsize=6)
    cands = propose(pool, np.random.default_rng(0), cfg, 1, imagine, n_params=2)
    assert [c.operator for c in cands] == ["recombination"] * 3 + ["refinement"]
    assert [c.imagined for c in cands] == [0.0, 0.0, 0.0, -1.0]

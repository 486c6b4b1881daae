"""The new evolution loop's parts (issue 38), fast and with fixed seeds: the
one CMA-ES driver (injection, replay), the refinement by gradient, the floor
(refined=0 is plain one-episode CMA-ES), the injection of refined copies,
verification of a candidate that met the target, and determinism with the
critic on."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from structlog.testing import capture_logs

from agents.cma_search import TOLD_FAILED, CMASearch
from agents.evolve_config import EvolveConfig
from agents.refine import ZPolicy, objective, refine
from agents.search_space import ObsStats, SearchSpace
from agents.se_darwin_agent import SEDarwinAgent
from agents.tasks import get_task
from agents.evaluation import Evaluation
from agents.verify import start_order
from genesis_fp16.base.settings import load_settings
import loop_fakes
from loop_fakes import FakeEvaluator

pytestmark = pytest.mark.usefixtures("one_thread")

TASK = get_task("Pendulum-v1").resolve()


# -- (a) the CMA-ES driver ---------------------------------------------------------------------
def test_failed_candidates_are_told_as_failures_and_bad_settings_raise():
    search = CMASearch(np.zeros(5), 0.5, seed=3, popsize=6)
    search.tell(list(-np.linalg.norm(search.ask(), axis=1)))
    search.ask()
    search.tell([0.0, -np.inf, float("nan"), -1.0, -2.0, -3.0])
    assert search.told[-1]["extras"] == 0 and search.told[-1]["f"][1] == TOLD_FAILED == search.told[-1]["f"][2]
    with pytest.raises(ValueError, match="6 asked points"):
        search.ask()
        search.tell([0.0])
    with pytest.raises(ValueError, match="sigma0"):
        CMASearch(np.zeros(5), 0.0, seed=0)


def _driven(seed: int = 5, generations: int = 4) -> CMASearch:
    search = CMASearch(np.zeros(4), 0.3, seed=seed, popsize=6)
    for g in range(generations):
        xs = search.ask()
        extras = [(search.mean + 0.1, 0.0)] if g % 2 else []  # the best: it joins
        search.tell(list(-np.sum((xs - 1.0) ** 2, axis=1)), extras)
    return search


def test_replay_rebuilds_the_same_search():
    search = _driven()
    assert [t["extras"] for t in search.told] == [0, 1, 0, 1]
    again = CMASearch.replay(copy.deepcopy(search.record()))
    np.testing.assert_array_equal(again.mean, search.mean)
    assert again.sigma == search.sigma and again.generations == search.generations == 4
    np.testing.assert_array_equal(again.ask(), search.ask())  # and it goes on alike
    # same seed, same search; another seed, another one
    np.testing.assert_array_equal(_driven().mean, _driven().mean)
    assert not np.allclose(_driven(seed=6).mean, _driven().mean)


def test_replay_with_extras_over_ten_generations_is_the_live_search():
    """A resumed run replays the manifest's record (through JSON). Each
    generation offers extras near, at and far off the distribution (refined
    copies can be far), some winning, some not."""
    for trial in range(24):
        rng = np.random.default_rng(trial)
        search = CMASearch(rng.normal(size=12), 0.5, seed=trial)
        for g in range(10):
            xs = search.ask()
            extras = [
                (search.mean + rng.normal(size=12) * rng.choice([0.01, 1.0, 10.0]), float(rng.normal(-10.0, 10.0)))
                for _ in range(int(rng.integers(0, 3)))
            ]
            search.tell(list(-np.sum(xs**2, axis=1)), extras)
        again = CMASearch.replay(json.loads(json.dumps(search.record())))
        np.testing.assert_array_equal(again.mean, search.mean, err_msg=f"trial {trial}")
        assert again.sigma == search.sigma, trial
        np.testing.assert_array_equal(again.ask(), search.ask(), err_msg=f"trial {trial}")


def test_a_record_of_the_older_injecting_loop_is_refused_by_name():
    record = copy.deepcopy(_driven().record())
    record["told"][1]["injected"] = 1
    with pytest.raises(ValueError, match="injected points into the population"):
        CMASearch.replay(record)


def test_replay_of_an_edited_record_raises():
    record = copy.deepcopy(_driven().record())
    record["told"][2]["x"][4][1] += 0.01  # a CMA-ES sample that the seed does not draw
    with pytest.raises(ValueError, match="generation 2 does not replay"):
        CMASearch.replay(record)
    record = copy.deepcopy(_driven().record())
    record["seed"] = 99
    with pytest.raises(ValueError, match="generation 0 does not replay"):
        CMASearch.replay(record)


# -- (b) the refinement --------------------------------------------------------------------------
def test_refinement_climbs_a_known_quadratic():
    """value(s, a) = -(a - a*)^2: the policy's action should move to a*, and J
    rises across the snapshots of one ascent."""
    spec = TASK.policy
    space = SearchSpace.identity(spec)
    target = 0.7

    def value(obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return -((act - target) ** 2).sum(dim=-1)

    states = torch.tensor(np.random.default_rng(0).uniform(-1.0, 1.0, (64, spec.obs_dim)), dtype=torch.float32)
    z0 = np.random.default_rng(1).normal(0.0, 0.3, spec.n_params)
    snapshots = [1, 4, 16, 64, 256]
    zs = refine(z0, states, space, value=value, snapshots=snapshots, lr=0.01, seed=2)
    assert len(zs) == len(snapshots)
    policy = ZPolicy(space)
    with torch.no_grad():
        js = [
            float(
                objective(
                    torch.tensor(z[None], dtype=torch.float32),
                    states,
                    policy,
                    value=value,
                    model=None,
                    horizon=0,
                    gamma=0.99,
                )[0]
            )
            for z in [z0, *zs]
        ]
    assert all(b > a for a, b in zip(js, js[1:])), js  # monotone along the ascent
    assert js[-1] > 0.2 * js[0]  # most of the gap closed
    again = refine(z0, states, space, value=value, snapshots=snapshots, lr=0.01, seed=2)
    for a, b in zip(zs, again):
        np.testing.assert_array_equal(a, b)  # same seed, same copies
    with pytest.raises(ValueError, match="needs a critic"):
        refine(z0, states, space, value=None, snapshots=[1])


# -- (c) the floor equals plain CMA-ES -----------------------------------------------------------
class RecordingEvaluator(FakeEvaluator):
    """A FakeEvaluator that keeps every (params, start state) it ran, in order."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.runs: list[tuple[np.ndarray, np.ndarray]] = []

    def evaluate(self, params, states, **kw) -> Evaluation:
        self.runs += [(np.asarray(params, dtype=float), np.asarray(s, dtype=float)) for s in states]
        return super().evaluate(params, states, **kw)


async def test_the_floor_is_plain_cma_es(state_dir):
    seed, popsize, sigma0, gens = 4, 6, 0.5, 5
    cfg = EvolveConfig(
        budget=popsize * gens,
        target=-1.0,
        seed=seed,
        popsize=popsize,
        sigma0=sigma0,
        refined=0,
        use_critic=False,
        use_world_model=False,
        workers=1,
    )
    evaluator = RecordingEvaluator(TASK)
    agent = SEDarwinAgent(cfg, settings=load_settings(), evaluator=evaluator)
    report = await agent.evolve()
    assert report["mode"] == "cma" and len(report["generations"]) == gens

    # by hand: CMA-ES from zeros in normalised coordinates, one episode per candidate on order[c mod n]
    starts = agent.starts.train
    order = start_order(len(starts), seed)
    search, stats = (
        CMASearch(np.zeros(TASK.n_params), sigma0, seed=seed, popsize=popsize),
        ObsStats(TASK.policy.obs_dim),
    )
    scale = np.asarray(TASK.policy.obs_scale, dtype=np.float64)
    expected, c = [], 0
    for _ in range(gens):
        raw = stats.space(TASK.policy).to_raw(search.ask())
        returns, episodes = [], []
        for params in raw:
            state = starts[order[c % len(starts)]]
            ret, episode = evaluator._episode(params, state)
            expected.append((params, state))
            returns.append(ret)
            episodes.append(episode)
            c += 1
        search.tell(returns)
        for episode in episodes:
            stats.update(np.asarray(episode["obs"], dtype=np.float64) * scale)

    assert len(agent.pool) == len(expected) == popsize * gens
    for cand, (params, state) in zip(agent.pool, expected):
        np.testing.assert_allclose(cand.params, params, rtol=0, atol=1e-12)
        assert (
            cand.operator == "cma"
            and cand.real_episodes == 1
            and cand.starts == [order[agent.pool.index(cand) % len(starts)]]
        )
    # the episodes the loop ran: the same candidates on the same start states (then the CMA-ES mean, the held-out
    # states)
    for (params, state), (run_params, run_state) in zip(expected, evaluator.runs):
        np.testing.assert_allclose(run_params, params, rtol=0, atol=1e-12)
        np.testing.assert_array_equal(run_state, state)
    np.testing.assert_allclose(agent.search.mean, search.mean, rtol=0, atol=1e-12)
    assert agent.search.sigma == pytest.approx(search.sigma, rel=1e-12)


# -- (d) refined copies are injected first and told like the others --------------------------------
def tiny_critic():
    from infrastructure.critic import Critic

    spec = TASK.policy
    return Critic(
        spec.obs_dim,
        spec.act_dim,
        action_low=spec.action_low,
        action_high=spec.action_high,
        agent="critic.Pendulum-v1",
        settings=load_settings(),
        precision="fp32",
        hidden=16,
        layers=1,
        batch_size=32,
        seed=0,
    )


def critic_config(**kw) -> EvolveConfig:
    base = dict(
        budget=24,
        target=-1.0,
        popsize=6,
        refined=2,
        use_world_model=False,
        refine_steps=8,
        critic_updates=0.05,
        workers=1,
    )
    return EvolveConfig(**{**base, **kw})


async def test_refined_copies_run_beside_the_population_and_join_it_only_when_they_win(state_dir):
    from agents.extras import refined_count, won_lately

    agent = SEDarwinAgent(
        critic_config(budget=40), settings=load_settings(), evaluator=FakeEvaluator(TASK), critic=tiny_critic()
    )
    refined_out: list[list[np.ndarray]] = []
    inner = agent.learners.refine

    async def recording(*a, **kw):
        out = await inner(*a, **kw)
        refined_out.append([z for z, _ in out])
        return out

    agent.learners.refine = recording
    report = await agent.evolve()
    gens = report["generations"]
    told_gens = agent.search.generations  # the last population, cut by the budget, is not told
    assert len(gens) >= 4 and told_gens in (len(gens), len(gens) - 1) and agent.search.popsize == 6
    assert [c["operator"] for c in gens[0]["candidates"]] == ["cma"] * 6  # no data, no critic yet: nothing refined
    assert [c["operator"] for c in gens[1]["candidates"]] == ["refined:actor", "refined:mean:8"] + [
        "cma"
    ] * 6  # extras first
    for g in range(1, told_gens):
        cands, told = gens[g]["candidates"], agent.search.told[g]
        extras = [c for c in cands if c["operator"] != "cma"]
        assert len(extras) == refined_count(gens[:g], 2, report["config"]["episode_steps"])  # as the records decide
        own = [c["real_return"] for c in cands if c["operator"] == "cma"]
        assert len(own) == 6 and told["extras"] == sum(bool(c["joined"]) for c in extras)
        # an extra joins when it beats the population's best or, once extras have won lately, when it ranks among
        # CMA-ES's parents (and, here, each such one does)
        parents_bar, trusted = sorted(own, reverse=True)[2], won_lately(gens[:g])
        for c in extras:
            assert c["joined"] == (c["real_return"] >= parents_bar if trusted else c["real_return"] > max(own))
        # what pycma was told: the own samples' returns, the joined extras' in the worst ones' places (minimised:
        # negated)
        expected = sorted([-r for r in own])
        joined = sorted(-c["real_return"] for c in extras if c["joined"])
        assert sorted(told["f"]) == sorted(expected[: 6 - len(joined)] + joined)
    assert sum(len(z) for z in refined_out) == sum(c["operator"] != "cma" for g in gens for c in g["candidates"])
    assert report["mode"] == "no_model" and set(report["learners"]) == {"critic"}
    assert all(g["critic_val_loss"] is not None for g in gens[:-1])


# -- (f) same seed, same report with the critic on ------------------------------------------------
RUN_SPECIFIC = (*loop_fakes.RUN_SPECIFIC, *loop_fakes.RUN_SPECIFIC_GENERATION)


def _comparable(report: dict) -> dict:
    out = {k: v for k, v in report.items() if k not in RUN_SPECIFIC}
    out["generations"] = [{k: v for k, v in g.items() if k not in RUN_SPECIFIC} for g in report["generations"]]
    return out


async def test_same_seed_same_report_with_the_critic(state_dir):
    reports = []
    for _ in range(2):
        agent = SEDarwinAgent(
            critic_config(seed=7), settings=load_settings(), evaluator=FakeEvaluator(TASK)
        )  # the loop's own critic
        reports.append(await agent.evolve())
    first, second = reports
    assert first["run_id"] != second["run_id"]
    assert any(c["operator"].startswith("refined:") for g in first["generations"] for c in g["candidates"])
    assert [g["critic_val_loss"] for g in first["generations"]] == [g["critic_val_loss"] for g in second["generations"]]
    assert _comparable(first) == _comparable(second)


def test_docs_options_table_is_made_from_the_config():
    """docs/EVOLUTION.md's options table is `options_table()`: one row per EvolveConfig field, its default and
    docstring."""
    from pathlib import Path

    from agents.evolve_config import options_table

    table = options_table()
    doc = (Path(__file__).resolve().parent.parent / "docs" / "EVOLUTION.md").read_text(encoding="utf-8")
    assert table in doc, "docs/EVOLUTION.md's options table is stale: paste agents.evolve_config.options_table() there"
    assert (
        "| `actor_rounds` | `--actor-rounds` | `8` |" in table
        and "| `use_critic` | `--critic` / `--no-critic` | `True` |" in table
    )


def test_the_refined_extras_follow_how_often_they_beat_the_population_and_fall_to_none():
    from agents.extras import FIRST_EXTRAS, refined_count

    def record(extras, cma_best=-2.0):  # the extras' returns; the population's best one-episode return
        return {
            "cma_best": cma_best,
            "candidates": [{"operator": "refined:mean:8", "real_return": r, "joined": True} for r in extras]
            + [{"operator": "cma", "real_return": cma_best, "joined": None}],
        }

    plain, losing, winning = record([]), record([-5.0, -3.0]), record([-1.0, -9.0])
    assert refined_count([], 4) == FIRST_EXTRAS == 2 and refined_count([plain] * 5, 4) == 2  # none judged yet
    assert refined_count([], 1) == 1 and refined_count([winning], 0) == 0
    assert (
        refined_count([losing], 4) == 0 and refined_count([losing, plain, plain], 4) == 0
    )  # lost within the window: none
    assert refined_count([losing, plain, plain, plain], 4) == 1  # none ran for a whole window: a probe of one
    assert (
        refined_count([winning], 4) == 2
        and refined_count([winning, winning], 4) == 4
        and refined_count([winning] * 3, 3) == 3
    )
    assert refined_count([winning, plain, plain, plain], 4) == 1  # the win left the window
    # joining CMA-ES's update (ranking among its parents) is not winning: only beating the population's best is
    assert refined_count([record([-2.5, -2.0])], 4) == 0 and refined_count([record([-1.0], cma_best=None)], 4) == 0


def test_extras_are_probes_once_the_last_judged_ones_lost_and_none_won_lately():
    from agents.extras import WINDOW, probing

    def record(extras, cma_best=-2.0):  # the extras' returns; the population's best (None: it never ran)
        return {
            "cma_best": cma_best,
            "candidates": [{"operator": "refined:actor", "real_return": r} for r in extras]
            + ([{"operator": "cma", "real_return": cma_best}] if cma_best is not None else []),
        }

    plain, lost, won, unjudged = record([]), record([-5.0]), record([-1.0]), record([-1.0], cma_best=None)
    assert not probing([]) and not probing([plain, plain])  # no extra ran yet: the first ones are not probes
    assert not probing([plain, unjudged])  # extras whose population never ran (a met target, the budget) are not
    assert probing([plain, lost]) and probing([plain, lost, unjudged]) and probing([lost] + [plain] * 5)
    assert not probing([lost, won]) and not probing([won, lost])  # a win within the window
    assert probing([won] + [plain] * (WINDOW - 1) + [lost]) and not probing([lost, won] + [plain] * WINDOW)


def test_extras_that_lose_are_probed_each_generation_unless_they_held_a_plateau():
    from agents.extras import refined_count

    def record(extras, own=(-2.0, -4.0), steps=(200, 200)):  # the extras' and the population's returns, their steps
        return {
            "cma_best": max(own),
            "candidates": [{"operator": "refined:actor", "real_return": r, "steps": steps[0]} for r in extras]
            + [{"operator": "cma", "real_return": r, "steps": steps[1]} for r in own],
        }

    plain = record([])
    lost_alike = record([-5.0, -3.0])  # episodes as long as the population's: the learners keep a probe going
    stood = record([-5.0, -3.0], steps=(1000, 60))  # longer episodes than the population's, no gain: a plateau
    assert refined_count([lost_alike], 4) == 1 and refined_count([lost_alike, plain, plain], 4) == 1
    # while no extra has won in the run, each generation whose extras lost doubles the probe's wait: none, 1, 3, at
    # most 7
    assert refined_count([lost_alike] * 2, 4) == 0 and refined_count([lost_alike] * 2 + [plain], 4) == 1
    for lost, wait in ((3, 3), (9, 7)):
        assert refined_count([lost_alike] * lost + [plain] * (wait - 1), 4) == 0
        assert refined_count([lost_alike] * lost + [plain] * wait, 4) == 1
    # once one has won, a probe each generation: the learners have shown they can
    won = record([-1.0, -3.0])
    assert refined_count([won, lost_alike], 4) == 2 and refined_count([won] + [lost_alike] * 3, 4) == 1
    assert refined_count([won] + [lost_alike] * 3 + [plain] * 5, 4) == 1
    assert refined_count([stood], 4) == 0 and refined_count([stood, plain], 4) == 0
    assert refined_count([stood, plain, plain, plain], 4) == 1  # none ran for a whole window: a probe again
    # the last decides: a plateau before lost extras does not stop the probe (it waits one generation: two lost)
    assert refined_count([stood, lost_alike, plain], 4) == 1 and refined_count([lost_alike, stood, plain], 4) == 0
    assert refined_count([stood, record([-1.0], steps=(1000, 60))], 4) == 2  # a long episode that wins counts
    assert refined_count([won, won, lost_alike], 4) == 4  # earlier wins keep them while they lose alike
    assert refined_count([won, won, stood], 4) == 0  # but not once they only hold a plateau
    # with the episode's length known, a plateau is a whole episode: longer but unfinished episodes (a pole balanced
    # longer than the population's, not yet to the end) keep the probe going
    assert refined_count([stood], 4, episode_steps=1000) == 0 and refined_count([stood], 4, episode_steps=2000) == 1
    assert refined_count([record([-5.0], steps=(40, 12))], 4, episode_steps=1000) == 1


def test_extras_that_lose_leave_cma_es_exactly_as_the_floor():
    from agents.cma_search import CMASearch

    alone, beside = CMASearch(np.zeros(5), 0.5, seed=3, popsize=6), CMASearch(np.zeros(5), 0.5, seed=3, popsize=6)
    for g in range(4):
        x, y = alone.ask(), beside.ask()
        assert np.array_equal(x, y)  # the same samples, generation after generation
        scores = [-float(np.sum((row - 1.0) ** 2)) for row in x]
        alone.tell(scores)
        # a loser, a failure, and one that ranks among the parents without beating the best sample
        losers = [(np.full(5, 9.0), min(scores) - 1.0), (np.ones(5), float("-inf")), (np.ones(5), max(scores))]
        assert beside.tell(scores, losers) == []
    assert np.array_equal(alone.mean, beside.mean) and alone.sigma == beside.sigma


def test_an_extra_that_wins_joins_as_a_direction_no_longer_than_the_longest_sample():
    from agents.cma_search import CMASearch

    search = CMASearch(np.zeros(5), 0.5, seed=3, popsize=6)
    x = search.ask()
    scores = [-float(np.sum((row - 1.0) ** 2)) for row in x]
    far = np.full(5, 100.0)  # far outside the distribution, and the best
    second = sorted(scores)[-2]  # among the parents, below the best: not a win, joins only where extras won lately
    assert search.tell(scores, [(far, 0.0), (np.ones(5), max(scores) + 1e-9), (np.ones(5), second)]) == [0, 1]
    lately = CMASearch(np.zeros(5), 0.5, seed=3, popsize=6)
    assert np.array_equal(lately.ask(), x)
    assert lately.tell(scores, [(far, 0.0), (np.ones(5), second)], trusted=True) == [0, 1]
    told = np.asarray(search.told[-1]["told_x"])
    worst = np.argsort(scores)[:2]  # the two worst samples' places
    assert search.told[-1]["extras"] == 2 and not np.array_equal(told[worst], x[worst])
    norms = np.linalg.norm(x, axis=1)
    # identity covariance at the start: about the Euclidean length (pycma's metric rounds differently), far below the
    # 224 asked
    assert np.linalg.norm(told[worst[0]]) == pytest.approx(norms.max(), rel=1e-4)
    replayed = CMASearch.replay(search.record())
    assert np.array_equal(replayed.mean, search.mean) and replayed.sigma == search.sigma


# -- (g) a near miss of an extra is verified, a far one and CMA-ES's own are not -----------------
def _extra_scores(agent: SEDarwinAgent, first_return: float, rest: float):
    """Patch ``agent``'s refinement to offer one fixed extra a generation; returns the evaluator's score: the extras
    score ``first_return`` on the first start state each runs on and ``rest`` on every other, CMA-ES's samples
    `loop_fakes.distance_return` (some hundreds below 0)."""
    extras: list[np.ndarray] = []
    first_state: dict[int, float] = {}

    async def one_extra(z_mean, space, generation, elite=None, count=None, new_steps=None):
        z = np.full_like(z_mean, 0.01 * generation)
        extras.append(space.to_raw(z[None])[0])
        return [(z, "refined:actor")]

    def score(params, state) -> float:
        for k, raw in enumerate(extras):
            if np.array_equal(raw, params):
                first = first_state.setdefault(k, float(state[0]))
                return first_return if first == float(state[0]) else rest
        return loop_fakes.distance_return(params, state)

    agent.learners.refine = one_extra
    return score


@pytest.mark.parametrize("first_return, verified", [(-2.0, True), (-1e5, False)])
async def test_an_extra_that_nearly_meets_the_target_is_verified(state_dir, first_return, verified):
    """An extra whose one episode misses the target (-1) by less than `agents.verify.NEAR_MISS` of the run's spread
    (CMA-ES's samples score hundreds below: the bar is far under -2) is verified; on every other start state it meets
    the target, so it is accepted and confirmed in the generation it ran. One far below the bar runs its one episode."""
    from agents.verify import NEAR_MISS, near_miss_bar, return_scale

    evaluator = FakeEvaluator(TASK)
    agent = SEDarwinAgent(critic_config(budget=40), settings=load_settings(), evaluator=evaluator)
    evaluator.score = _extra_scores(agent, first_return, rest=0.0)
    with capture_logs() as logs:
        report = await agent.evolve()
    gens = report["generations"]
    extra = next(c for c in gens[1]["candidates"] if c["operator"] == "refined:actor")
    firsts = [c["real_return"] for c in gens[0]["candidates"]] + [first_return]
    bar = near_miss_bar(-1.0, return_scale(firsts))
    assert NEAR_MISS > 0 and (bar < first_return) == verified
    near = [e for e in logs if e["event"] == "evolve.near_miss"]
    if verified:
        assert [(e["candidate"], e["generation"], e["real_return"], e["target"]) for e in near] == [
            (extra["id"], 1, first_return, -1.0)
        ]
        assert near[0]["bar"] == pytest.approx(bar)
        # 16 training states, its first at -2 and 15 at 0: the mean meets -1; confirmed on the validation states
        assert extra["episodes"] > 1 and extra["accepted"] and report["target_reached"]
        assert report["best_candidate"]["id"] == extra["id"] and len(gens) == 2
        assert [c["operator"] for c in gens[1]["candidates"]] == ["refined:actor"]  # the population never ran
    else:
        assert extra["episodes"] == 1 and not extra.get("accepted") and len(gens) > 2 and near == []


async def test_cma_samples_are_verified_only_when_they_meet_the_target(state_dir):
    """The floor (no extras) decides as plain one-episode CMA-ES: its best sample, a near miss by 1 in a spread of
    tens, runs its one episode."""
    from loop_fakes import distance_return

    from agents.cma_search import CMASearch

    zs = CMASearch(np.zeros(TASK.n_params), 0.5, seed=0, popsize=6).ask()
    best = max(distance_return(p, np.zeros(2)) for p in SearchSpace.identity(TASK.policy).to_raw(zs))
    agent = SEDarwinAgent(
        critic_config(budget=12, refined=0, use_critic=False, target=best + 1.0),
        settings=load_settings(),
        evaluator=FakeEvaluator(TASK, score=lambda p, s: distance_return(p, np.zeros(2))),
    )
    report = await agent.evolve()
    assert report["real_episodes"] == 12 and not report["target_reached"]
    assert all(c["episodes"] == 1 for g in report["generations"] for c in g["candidates"])


async def test_the_second_extra_that_met_the_target_is_verified_when_the_first_is_refuted(state_dir):
    """Two extras meet the target (-1) on their one episode: the better one (0.5) scores -1000 on every other start
    state and is refuted; the other (0.0 everywhere) is verified next, accepted and confirmed before the population
    runs (`agents.se_darwin_agent.HOPEFUL_EXTRAS`)."""
    from agents.se_darwin_agent import HOPEFUL_EXTRAS

    evaluator = FakeEvaluator(TASK)
    agent = SEDarwinAgent(critic_config(budget=60), settings=load_settings(), evaluator=evaluator)
    extras: list[np.ndarray] = []
    first_state: dict[int, float] = {}

    async def two_extras(z_mean, space, generation, elite=None, count=None, new_steps=None):
        zs = [np.full_like(z_mean, 0.01 * generation), np.full_like(z_mean, -0.01 * generation)]
        extras.extend(space.to_raw(np.stack(zs)))
        return [(zs[0], "refined:actor"), (zs[1], "refined:mean:8")]

    def score(params, state) -> float:
        for k, raw in enumerate(extras):
            if np.array_equal(raw, params):
                if k % 2:
                    return 0.0
                first = first_state.setdefault(k, float(state[0]))
                return 0.5 if first == float(state[0]) else -1000.0
        return loop_fakes.distance_return(params, state)

    agent.learners.refine = two_extras
    evaluator.score = score
    report = await agent.evolve()
    gens = report["generations"]
    lucky, steady = (
        next(c for c in gens[1]["candidates"] if c["operator"] == op) for op in ("refined:actor", "refined:mean:8")
    )
    assert lucky["episodes"] > 1 and not lucky["accepted"]
    assert steady["episodes"] > 1 and steady["accepted"] and report["target_reached"] and HOPEFUL_EXTRAS == 2
    assert report["best_candidate"]["id"] == steady["id"] and len(gens) == 2
    assert all(c["operator"] != "cma" for c in gens[1]["candidates"])  # the population never ran


# -- (h) probes that the budget's end may not hold beside the population run after it -------------------
async def test_probes_run_after_the_population_where_the_budget_may_not_hold_both(state_dir):
    """Extras that never win (probes, one a generation after a wait) score far below CMA-ES's samples; the step budget
    (213 steps of 5-step fake episodes) ends in generation 4 (8 + 9 + 9 + 8 episodes before it, 43 steps left). There,
    at the run's longest episode (5 steps), the budget may not hold the probe beside the population: CMA-ES's samples
    run first (an `evolve.probes_last` event, that generation's only), all 8, and are told; the probe runs on the 3
    steps left (cut). Without the rule the probe would have run first and cut the population. The generation keeps the
    extras first in its record, the pool and the replay buffer, and the loop's own samples are the floor's."""

    def score(params, state) -> float:
        if any(np.array_equal(params, p) for p in probes):
            return -1e6
        return loop_fakes.distance_return(params, state)

    probes: list[np.ndarray] = []

    async def one_probe(z_mean, space, generation, elite=None, count=None, new_steps=None):
        z = np.full_like(z_mean, 0.01 * generation)
        probes.append(space.to_raw(z[None])[0])
        return [(z, "refined:actor")]

    runs = {}
    for name, refined in (("loop", 2), ("floor", 0)):
        agent = SEDarwinAgent(
            critic_config(budget=100, budget_steps=213, popsize=8, refined=refined, use_critic=refined > 0),
            settings=load_settings(),
            evaluator=FakeEvaluator(TASK, score=score),
        )
        agent.learners.refine = one_probe
        with capture_logs() as logs:
            report = await agent.evolve()
        runs[name] = (report, [e for e in logs if e["event"] == "evolve.probes_last"], agent)
    (loop, events, agent), (floor, _, floor_agent) = runs["loop"], runs["floor"]
    assert loop["env_steps"] == floor["env_steps"] == 213 and loop["stop_reason"] == "budget"
    gens = loop["generations"]
    ran = [[c["operator"] for c in g["candidates"]] for g in gens]
    assert ran == [["cma"] * 8] + [["refined:actor"] + ["cma"] * 8] * 2 + [["cma"] * 8, ["refined:actor"] + ["cma"] * 8]
    assert [(e["generation"], e["extras"], e["population"]) for e in events] == [(4, 1, 8)]
    probe = gens[4]["candidates"][0]
    assert probe["cut"] and probe["steps"] == 3 and agent.search.generations == 5  # the whole population was told
    assert not any(c["joined"] for g in gens for c in g["candidates"] if c["operator"] != "cma")
    assert [c.id for c in agent.pool[-9:]] == [c["id"] for c in gens[4]["candidates"]]  # the extras first, as ever
    newest = [t.candidate for t in agent.buffer.sample(agent.data_agent, limit=9)][::-1]
    assert newest == [c["id"] for c in gens[4]["candidates"]]
    loop_own = [c.params for c in agent.pool if c.operator == "cma"]
    floor_own = [c.params for c in floor_agent.pool]
    assert len(loop_own) == 8 * 5 and len(floor_own) > len(loop_own)
    np.testing.assert_array_equal(np.array(loop_own), np.array(floor_own[: len(loop_own)]))


async def test_the_first_extras_run_first_where_the_budget_cannot_hold_the_population_beside_them(state_dir):
    """As on Pendulum-v1 at 4,000 steps: after a population of 30 (150 of the 200 steps), the first extras are not
    probes (never judged): they run first, and the population takes what they leave."""

    async def one_extra(z_mean, space, generation, elite=None, count=None, new_steps=None):
        return [(np.full_like(z_mean, 0.01 * generation), "refined:actor")]

    agent = SEDarwinAgent(
        critic_config(budget=100, budget_steps=200, popsize=30), settings=load_settings(), evaluator=FakeEvaluator(TASK)
    )
    agent.learners.refine = one_extra
    with capture_logs() as logs:
        report = await agent.evolve()
    ran = [[c["operator"] for c in g["candidates"]] for g in report["generations"]]
    assert ran == [["cma"] * 30, ["refined:actor"] + ["cma"] * 9]
    assert not [e for e in logs if e["event"] == "evolve.probes_last"]

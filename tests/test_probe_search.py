"""Probe search (`agents.probe_search`): the trust gate, CMA-ES's state kept
in the manifest and replayed, and the loop's probe generations (one start
state per round, every probe charged, stored and audited; the mean raced):
what docs/EVOLUTION.md's "Probe search" runs at full size, on tiny budgets here."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agents.evolve_config import EvolveConfig
from agents.probe_search import ProbeSearch, trust
from agents.se_darwin_agent import SEDarwinAgent
from genesis_fp16.settings import load_settings
from infrastructure.replay_buffer import ReplayBuffer

pytestmark = pytest.mark.usefixtures("one_thread")


def _generation(imagined, real):
    records = [{"imagined_mean": float(i), "real_mean": float(r)} for i, r in zip(imagined, real)]
    return {"imagination": {"records": records}}


def test_trust_reads_the_latest_audited_candidates():
    good, bad = _generation([1, 2, 3, 4], [10, 20, 30, 40]), _generation([1, 2, 3, 4], [40, 30, 20, 10])
    assert trust([], threshold=0.3, window=4) == (False, None)  # nothing audited: not trusted
    assert trust([{"imagination": None}, good], threshold=0.3, window=4) == (True, 1.0)
    assert trust([good, bad], threshold=0.3, window=4) == (False, -1.0)  # only the last four count
    trusted, rho = trust([good, bad], threshold=0.3, window=8)  # both generations: no order at all
    assert not trusted and rho is not None and rho < 0.3
    assert trust([_generation([1, 1, 1], [1, 2, 3])], threshold=-1.0, window=3) == (False, None)  # no spread to rank


def _run_search(search: ProbeSearch, generations: int, first: int = 0) -> list[np.ndarray]:
    asked = []
    for g in range(first, first + generations):
        zs = search.ask()
        asked.append(zs)
        search.tell(g, [-float(np.sum((z - 1.0) ** 2)) if k else -np.inf for k, z in enumerate(zs)])  # one failed probe each
    return asked


def test_probe_search_replays_from_its_manifest_record():
    search = ProbeSearch(seed=3, sigma0=0.5, popsize=None)
    search.start(np.zeros(4), generation=1)
    assert search.active() and search.population == 8 == search.size(4)  # pycma's default for 4 parameters: 4 + 3 ln 4
    assert ProbeSearch(seed=3, sigma0=0.5, popsize=None).size(18) == 12 and ProbeSearch(seed=3, sigma0=0.5, popsize=5).size(18) == 5
    _run_search(search, 3, first=1)
    saved = json.loads(json.dumps(search.as_dict()))  # through JSON, as the manifest keeps it
    again = ProbeSearch.from_dict(saved, seed=3, sigma0=0.5, popsize=None)
    np.testing.assert_array_equal(again.mean, search.mean)
    np.testing.assert_array_equal(again.ask(), search.ask())  # the same next population
    saved["segments"][-1]["told"][1]["z"][0][0] += 0.5
    with pytest.raises(ValueError, match="generation 2 does not replay"):
        ProbeSearch.from_dict(saved, seed=3, sigma0=0.5, popsize=None)


def test_screening_gives_the_screens_best_samples_and_replays():
    def screen(z: np.ndarray) -> np.ndarray:  # the "model": closer to 1 is better
        return -np.sum((z - 1.0) ** 2, axis=1)

    plain, screened = search_fresh(5), search_fresh(5)
    pool = np.asarray(search_fresh(5)._es.ask(number=3 * 4), dtype=np.float64)  # what a 3x oversample draws
    zs = screened.ask(screen, oversample=3)
    assert zs.shape == (4, 3)
    best = sorted(range(12), key=lambda i: -screen(pool)[i])[:4]
    np.testing.assert_array_equal(zs, pool[sorted(best)])  # the screen's best four of the twelve, in drawn order
    assert screen(zs).min() >= np.sort(screen(pool))[-4]
    np.testing.assert_array_equal(plain.ask(screen, oversample=1), pool[:4])  # no oversample: CMA-ES's own population
    screened.tell(1, list(screen(zs)))
    record = screened.as_dict()["segments"][0]["told"][0]
    assert record["screened"] == {"oversample": 3, "picked": sorted(best)}
    saved = json.loads(json.dumps(screened.as_dict()))
    again = ProbeSearch.from_dict(saved, seed=5, sigma0=0.5, popsize=4)
    np.testing.assert_array_equal(again.mean, screened.mean)
    np.testing.assert_array_equal(again.ask(), screened.ask())
    saved["segments"][0]["told"][0]["screened"]["picked"] = [0, 1, 2, 3] if sorted(best) != [0, 1, 2, 3] else [4, 5, 6, 7]
    with pytest.raises(ValueError, match="generation 1 does not replay"):
        ProbeSearch.from_dict(saved, seed=5, sigma0=0.5, popsize=4)


def test_an_ended_segment_is_not_continued():
    search = ProbeSearch(seed=0, sigma0=0.5, popsize=4)
    search.start(np.zeros(3), generation=1)
    search.ask()
    search.end()
    assert not search.active()
    assert not ProbeSearch.from_dict(search.as_dict(), seed=0, sigma0=0.5, popsize=4).active()
    other = ProbeSearch(seed=1, sigma0=0.5, popsize=4)
    other.start(np.zeros(3), generation=1)
    assert not np.array_equal(_run_search(other, 1)[0], _run_search(search_fresh(0), 1)[0])  # the seed decides the probes


def search_fresh(seed: int) -> ProbeSearch:
    s = ProbeSearch(seed=seed, sigma0=0.5, popsize=4)
    s.start(np.zeros(3), generation=1)
    return s


def test_bad_probe_options_are_refused():
    with pytest.raises(ValueError) as err:
        EvolveConfig(trust_spearman=1.5, trust_window=2, probe_sigma=0.0, probe_popsize=1).validate()
    for name in ("trust_spearman=1.5", "trust_window=2", "probe_sigma=0.0", "probe_popsize=1"):
        assert name in str(err.value)
    EvolveConfig(trust_spearman=None).validate()  # None: always trust the model


def tiny_config(**kw) -> EvolveConfig:
    base = dict(budget=48, init_candidates=8, wm_steps=30, refine_iters=2, revision_iters=2, revision_samples=8, popsize=6, horizon=15,
                imagine_starts=4, workers=1, eval_timeout_s=60)
    base.update(kw)
    return EvolveConfig(**base)


async def test_a_generation_before_any_audit_is_a_probe_generation(state_dir):
    settings = load_settings()
    agent = SEDarwinAgent(tiny_config(), settings=settings)
    report = await agent.evolve()
    gen1, lam = report["generations"][1], agent.probe.population
    probes = [e for e in gen1["evaluated"] if e["operator"] == "probe"]
    assert gen1["probe"] is not None and gen1["probe"]["trust_spearman"] is None
    assert len(probes) == lam and gen1["probe"]["probes"] == lam + 1  # the population and its mean
    assert all(e["episodes"] == 1 and not e["full"] for e in probes)
    states = {tuple(c.starts) for c in agent.pool if c.operator == "probe" or c.id.endswith("-mean-probe")}
    assert states == {(agent.real.order[0],)}  # one round, one start state for all its probes
    # no incumbent yet: the search's mean is raced, on every training start state
    raced = [(e["operator"], e["episodes"], e["full"]) for e in gen1["evaluated"] if e["operator"] == "probe_mean" and e["episodes"] > 1]
    assert raced == [("probe_mean", 16, True)]
    assert report["real_episodes"] == 8 + lam + 1 + 16 and report["budget_exhausted"] == "episodes"
    # every probe and the mean are audited (imagined on the start states they ran on) and stored
    assert gen1["imagination"]["candidates"] == lam + 2 and {r["states"] for r in gen1["imagination"]["records"]} == {1, 16}
    assert ReplayBuffer(settings=settings).count(agent.data_agent)["trajectories"] == report["real_episodes"]
    assert report["imagination"]["candidates"] == lam + 2


async def test_probe_generations_same_seed_same_report(tmp_path):
    reports = []
    for name in ("a", "b"):
        settings = load_settings(state_dir=tmp_path / name)
        reports.append(await SEDarwinAgent(tiny_config(budget=70, trust_spearman=1.0), settings=settings).evolve())
    a, b = ({k: v for k, v in r.items() if k in ("real_episodes", "heldout_return", "train_return", "best_candidate")} for r in reports)
    assert a == b
    probed = [g["generation"] for g in reports[0]["generations"] if g["probe"] is not None]
    assert len(probed) >= 2  # more than one round of the same search
    assert [g["evaluated"] for g in reports[0]["generations"]] == [g["evaluated"] for g in reports[1]["generations"]]


def test_the_mean_is_raced_when_it_can_matter():
    search = ProbeSearch(seed=0, sigma0=0.5, popsize=None)
    search.rounds, search.raced = 2, 1
    assert search.race_due(False, -5.0, meets=False, last=False)  # no incumbent yet: one is needed
    assert not search.race_due(True, -np.inf, meets=False, last=True)  # its probe failed
    assert not search.race_due(True, 3.0, meets=False, last=False)  # better, but raced one round ago
    assert search.race_due(True, 3.0, meets=True, last=False)  # its episode met the target
    assert search.race_due(True, -3.0, meets=False, last=True)  # the search's final answer
    search.rounds = 4
    assert search.race_due(True, 3.0, meets=False, last=False) and not search.race_due(True, -3.0, meets=False, last=False)


async def test_where_no_round_fits_the_mean_is_raced_alone_then_the_model_proposes(state_dir):
    # 8 + (16 probes + 16) leaves 20 of 60: no room for a round of 16 probes and a race after it
    agent = SEDarwinAgent(tiny_config(budget=60, trust_spearman=1.0), settings=load_settings())
    report = await agent.evolve()
    gen2 = report["generations"][2]
    assert gen2["probe"]["final"] is True and gen2["probe"]["probes"] == 0
    assert [e["operator"] for e in gen2["evaluated"]] == ["probe_mean"] and gen2["evaluated"][0]["episodes"] > 1
    assert all(g["probe"] is None for g in report["generations"][3:])  # the search ended: what is left goes to the model
    assert report["real_episodes"] <= 60


@pytest.mark.parametrize("rho, screened", [(0.5, 3), (-0.5, 1)])
async def test_a_probe_round_is_screened_while_the_model_ranks(state_dir, monkeypatch, rho, screened):
    agent = SEDarwinAgent(tiny_config(budget=90, probe_screen=3), settings=load_settings())

    def never_trusted() -> bool:  # the model's rank correlation so far is rho: below the trust threshold either way
        agent._trust_rho = rho
        return False

    monkeypatch.setattr(agent, "_trusted", never_trusted)
    scored: list[int] = []
    make = agent._make_imaginer

    def counting(generation):
        imaginer = make(generation)
        if imaginer is not None:
            score = imaginer.score
            imaginer.score = lambda params: (scored.append(len(params)), score(params))[1]
        return imaginer

    monkeypatch.setattr(agent, "_make_imaginer", counting)
    report = await agent.evolve()
    rounds = [g["probe"] for g in report["generations"] if g["probe"] is not None and not g["probe"]["final"]]
    lam = agent.probe.size(agent.task.n_params)
    assert len(rounds) >= 2 and all(p["screened"] == screened for p in rounds)
    told = [t for seg in agent.probe.segments for t in seg["told"]]
    assert len(told) == len(rounds)
    assert all(t.get("screened", {"oversample": 1})["oversample"] == screened for t in told)
    assert scored == ([3 * lam] * len(rounds) if screened > 1 else [])  # the model scored three populations per round, or none
    for g in report["generations"]:  # still one real episode per probe, every probe audited
        if g["probe"] is not None and not g["probe"]["final"]:
            assert sum(e["operator"] == "probe" for e in g["evaluated"]) == lam

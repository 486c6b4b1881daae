"""benchmarks.baselines: observation normalisation folded into a policy, the
steps-to-target bookkeeping, and tuned CMA-ES's one episode per candidate."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from benchmarks.baselines import BaselineConfig, RunningStats, TargetWatch, fold, run_cma_tuned
from benchmarks.baselines.normalization import unit_scale
from agents.evaluation import make_evaluator
from agents.evaluation_contract import Evaluation, EvaluationEnvError
from agents.tasks import PolicySpec, get_task

pytest.importorskip("cma")
pytest.importorskip("gymnasium")


def spec(hidden: int) -> PolicySpec:
    return PolicySpec(
        obs_dim=3, act_dim=2, hidden=hidden, obs_scale=(1.0, 0.5, 0.125), action_low=(-2.0, 0.0), action_high=(2.0, 1.0)
    )


@pytest.mark.parametrize("hidden", [0, 4])
def test_folded_policy_on_raw_observations_is_the_policy_on_normalised_ones(hidden):
    s, rng = spec(hidden), np.random.default_rng(0)
    obs = rng.normal([1.0, -3.0, 20.0], [0.5, 2.0, 8.0], size=(50, 3))
    stats = RunningStats(3)
    for part in np.array_split(obs * np.asarray(s.obs_scale), 3):  # the scaled observations, in batches
        stats.update(part)
    params_z = rng.normal(size=s.n_params)
    normalised = (obs * np.asarray(s.obs_scale) - stats.mean) / stats.std
    expected = unit_scale(s).act(params_z, normalised)
    np.testing.assert_allclose(s.act(fold(s, params_z, stats.mean, stats.std), obs), expected, rtol=1e-12, atol=1e-12)
    assert not np.allclose(s.act(params_z, obs), expected)  # the fold changed something


def test_running_stats_are_exact_over_batches_and_ignore_a_constant_input():
    rows = np.random.default_rng(1).normal(size=(40, 3))
    rows[:, 2] = 7.0
    stats = RunningStats(3)
    assert np.array_equal(stats.mean, np.zeros(3)) and np.array_equal(stats.std, np.ones(3))  # identity before data
    for part in (rows[:1], rows[1:13], rows[13:]):
        stats.update(part)
    np.testing.assert_allclose(stats.mean[:2], rows[:, :2].mean(axis=0))
    np.testing.assert_allclose(stats.std[:2], rows[:, :2].std(axis=0, ddof=1))
    assert stats.std[2] == np.inf  # ARS's rule: a constant input gets weight 0
    s = spec(0)
    folded = fold(s, np.ones(s.n_params), stats.mean, stats.std)
    w = s.unpack(folded)[0][0]
    assert np.all(w[2] == 0.0) and np.all(np.isfinite(folded))


def test_target_watch_counts_the_first_check_that_meets_the_target():
    watch = TargetWatch(target=-300.0, every=10)
    assert watch.due(10) and not watch.record(1, 10, 2000, -400.0)
    assert not watch.due(15)  # 5 episodes since the last check
    assert watch.due(24) and watch.record(2, 24, 4800, -299.0)
    assert watch.due(40) and not watch.record(3, 40, 8000, -100.0)  # a later, better check changes nothing
    assert (watch.episodes_to_target, watch.env_steps_to_target, watch.reached) == (24, 4800, True)
    assert [c["best_return"] for c in watch.checks] == [-400.0, -299.0, -100.0]


class FakeEvaluator:
    """Records every job; a candidate's return is -|params|^2, a check's is
    ``check_returns`` in turn; each episode takes ``steps`` env steps."""

    workers, timeout_s = 2, 60.0

    def __init__(self, task, steps=10, check_returns=(), fail_every=0):
        self.task, self.steps, self.check_returns, self.fail_every = task, steps, list(check_returns), fail_every
        self.jobs, self.checks, self.closed = [], [], False

    def _episode(self):
        return {
            "obs": np.ones((self.steps, self.task.policy.obs_dim), dtype=np.float32),
            "reward": np.zeros(self.steps, dtype=np.float32),
        }

    def evaluate_many(self, jobs, *, per_job_env_errors=False):
        out = []
        for params, states in jobs:
            self.jobs.append((np.asarray(params), np.asarray(states)))
            if self.fail_every and len(self.jobs) % self.fail_every == 0:
                out.append(EvaluationEnvError("env raised in step"))
            else:
                out.append(
                    Evaluation(
                        returns=[-float(np.sum(np.square(params)))] * len(states),
                        episodes=[self._episode() for _ in states],
                    )
                )
        return out

    def evaluate(self, params, states):
        self.checks.append(np.asarray(states))
        ret = self.check_returns.pop(0) if self.check_returns else -1e9
        return Evaluation(returns=[ret] * len(states), episodes=[self._episode() for _ in states])

    def terminate(self):
        pass

    def close(self):
        self.closed = True


def _task(env="MountainCarContinuous-v0"):
    return get_task(env).resolve()


def test_cma_tuned_charges_one_episode_per_candidate_and_respects_the_budget():
    task = _task()
    fake = FakeEvaluator(task)
    cfg = BaselineConfig(env_id=task.env_id, budget=11, seed=3)
    report = run_cma_tuned(cfg, popsize=4, evaluator=fake)
    train_jobs = fake.jobs
    assert len(train_jobs) == 11 and all(states.shape == (1, 1) for _, states in train_jobs)
    starts = task.start_states(3)
    assert [states[0, 0] for _, states in train_jobs] == [
        starts.train[c % 16, 0] for c in range(11)
    ]  # start states in turn
    assert report["real_episodes"] == 11 and report["env_steps"] == 110
    assert (
        report["settings"]["generations"] == 2 and report["settings"]["popsize"] == 4
    )  # the third generation was cut by the budget
    assert (
        len(fake.checks) == 2 + 2 and not fake.closed
    )  # a check per told generation, then train and held-out; ours to close
    assert len(fake.checks[-1]) == len(starts.heldout) and report["heldout_episodes"] == 20
    assert (
        report["method"] == "cma_tuned"
        and report["sigma0"] == report["settings"]["sigma0"] == 0.5
        and report["cpu_s"] >= 0
    )
    assert report["check_episodes"] == 2 * len(starts.validation) == 2 * 8  # checks run on the validation states


def test_cma_tuned_env_step_budget_and_failures_are_charged():
    task = _task()
    fake = FakeEvaluator(task, steps=100, fail_every=3)
    report = run_cma_tuned(
        BaselineConfig(env_id=task.env_id, budget=100, budget_steps=450, workers=2), popsize=4, evaluator=fake
    )
    # batches of `workers` (2) episodes: after 400 steps one more batch starts, then none (600 >= 450)
    assert report["real_episodes"] == len(fake.jobs) == 8 and report["env_steps"] == 600
    assert len(report["failed_candidates"]) == 2 and report["stop_reason"] == "budget"


def test_cma_tuned_steps_to_target_and_stop_at_target():
    task = _task()
    cfg = BaselineConfig(env_id=task.env_id, budget=40, stop_at_target=True)
    fake = FakeEvaluator(task, check_returns=[0.0, 95.0, 99.0])
    report = run_cma_tuned(cfg, popsize=4, normalize=True, evaluator=fake)
    assert (report["episodes_to_target"], report["env_steps_to_target"]) == (8, 80)
    assert report["target_reached"] and report["stop_reason"] == "target" and report["real_episodes"] == 8
    assert report["method"] == "cma_tuned_norm" and "target 90 first met after 8 real episodes" in report["stop_detail"]
    report = run_cma_tuned(
        replace(cfg, stop_at_target=False, check_every=8),
        popsize=4,
        evaluator=FakeEvaluator(task, check_returns=[0.0, 95.0]),
    )
    assert (
        report["episodes_to_target"] == 16 and report["real_episodes"] == 40
    )  # checks at 8 and 16 episodes; the budget spent


def test_cma_tuned_refuses_bad_options():
    with pytest.raises(ValueError, match="sigma0=0"):
        run_cma_tuned(BaselineConfig(), sigma0=0.0)
    with pytest.raises(ValueError, match="popsize=1"):
        run_cma_tuned(BaselineConfig(), popsize=1)
    with pytest.raises(ValueError, match="budget=0.*check_every=0"):
        run_cma_tuned(BaselineConfig(budget=0, check_every=0))


def test_cma_tuned_on_real_episodes_is_reproducible():
    cfg = BaselineConfig(env_id="MountainCarContinuous-v0", budget=6, episode_steps=30, workers=1, seed=1)
    with make_evaluator(cfg.resolve(), workers=1) as evaluator:  # one worker process for both runs
        first = run_cma_tuned(cfg, popsize=3, normalize=True, evaluator=evaluator)
        again = run_cma_tuned(cfg, popsize=3, normalize=True, evaluator=evaluator)
    assert first["real_episodes"] == 6 and first["env_steps"] == 180
    keys = ("env_steps", "train_return", "heldout_return", "generations")
    assert {k: first[k] for k in keys} == {k: again[k] for k in keys}

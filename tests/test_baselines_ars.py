"""benchmarks.baselines.ars: the ARS V2-t update and a tiny run on real episodes."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.baselines import ARS_HYPERPARAMETERS, ARSHyper, BaselineConfig, ars_update, run_ars

pytest.importorskip("gymnasium")


def test_ars_update_climbs_a_toy_objective():
    """Maximise -|theta - optimum|^2 with the paper's step: the distance shrinks by far."""
    rng = np.random.default_rng(0)
    optimum = rng.normal(size=(2, 3))
    theta = np.zeros((2, 3))

    def reward(m):
        return -float(np.sum((m - optimum) ** 2))

    start = np.linalg.norm(theta - optimum)
    for _ in range(150):
        deltas = rng.standard_normal((8, 2, 3))
        plus = np.array([reward(theta + 0.05 * d) for d in deltas])
        minus = np.array([reward(theta - 0.05 * d) for d in deltas])
        theta = ars_update(theta, deltas, plus, minus, top=4, step_size=0.05)
    assert np.linalg.norm(theta - optimum) < 0.1 * start


def test_ars_update_keeps_the_top_directions_and_scales_by_their_spread():
    deltas = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    plus, minus = np.array([3.0, 0.0, -5.0]), np.array([1.0, 2.0, -6.0])
    # top 2 by max(r+, r-): directions 0 (3) and 1 (2); sigma_R = std([3, 0, 1, 2])
    expected = 0.1 / (2 * np.std([3.0, 0.0, 1.0, 2.0])) * (2.0 * deltas[0] - 2.0 * deltas[1])
    np.testing.assert_allclose(ars_update(np.zeros(2), deltas, plus, minus, top=2, step_size=0.1), expected)
    same = ars_update(np.ones(2), deltas, np.ones(3), np.ones(3), top=3, step_size=0.1)
    assert np.array_equal(same, np.ones(2))  # equal returns: no information, no step (not a division by 0)


def test_ars_hyperparameters_are_checked():
    with pytest.raises(ValueError, match="top=5: expected 1 <= top <= directions \\(4\\)"):
        ARSHyper(0.02, 0.03, 4, 5).validate()
    with pytest.raises(ValueError, match="noise=0"):
        run_ars(BaselineConfig(budget=4), hyper=ARSHyper(0.02, 0.0, 1, 1))
    swimmer, cheetah = ARS_HYPERPARAMETERS["Swimmer-v5"], ARS_HYPERPARAMETERS["HalfCheetah-v5"]
    assert (swimmer.step_size, swimmer.noise, swimmer.directions, swimmer.top) == (0.02, 0.01, 1, 1)
    assert (cheetah.step_size, cheetah.noise, cheetah.directions, cheetah.top) == (0.02, 0.03, 32, 4)


def test_ars_on_pendulum_charges_two_episodes_per_direction_and_is_reproducible():
    cfg = BaselineConfig(env_id="Pendulum-v1", budget=11, seed=2, episode_steps=50)
    hyper = ARSHyper(step_size=0.05, noise=0.1, directions=2, top=1)
    report = run_ars(cfg, hyper=hyper)
    # iterations of 4 episodes while they fit the budget of 11: 2 iterations, 8 episodes
    assert report["real_episodes"] == 8 and report["env_steps"] == 8 * 50
    assert report["settings"]["iterations"] == 2 and report["settings"]["version"] == "V2-t"
    assert len(report["generations"]) == 2 and report["generations"][-1]["real_episodes"] == 8
    assert report["heldout_episodes"] == 20 and report["method"] == "ars" and report["wall_s"] > 0
    assert any(t != 0.0 for t in report["settings"]["theta"])  # it moved
    again = run_ars(cfg, hyper=hyper)
    assert (
        again["settings"]["theta"] == report["settings"]["theta"]
        and again["heldout_return"] == report["heldout_return"]
    )


def test_ars_env_step_budget_cuts_an_iteration_without_an_update():
    cfg = BaselineConfig(env_id="Pendulum-v1", budget=100, budget_steps=250, episode_steps=50)
    report = run_ars(cfg, hyper=ARSHyper(step_size=0.05, noise=0.1, directions=2, top=2, normalize=False))
    # iteration 1: 4 episodes (200 steps); iteration 2 stops after its first episode (250 steps): charged, no update
    assert report["real_episodes"] == 5 and report["env_steps"] == 250 and report["settings"]["iterations"] == 1
    assert report["settings"]["version"] == "V1-t" and report["settings"]["obs_mean"] is None


@pytest.mark.parametrize(
    "factory, expected",
    [
        ("nan_last_obs", r"env 'Bad' returned a non-finite next_obs \(next_obs\[1\] = nan\) at step 4 of episode 1"),
        ("huge_reward", r"env 'Bad' returned a non-finite reward \(1e\+39, inf as float32\) at step 4 of episode 1"),
        ("nan_reset_obs", r"env 'Bad' returned a non-finite obs \(obs\[1\] = nan\) from reset at step 0 of episode 1"),
    ],
)
def test_the_baselines_episodes_refuse_non_finite_env_data(factory, expected):
    """The same float32 check as the loop's workers, naming the start state's place."""
    import task_envs

    from benchmarks.baselines.rollout import EpisodeRunner
    from agents.tasks import EnvFailure, Task

    task = Task(env_id="Bad", env_factory=getattr(task_envs, factory), target=0.0).resolve()
    with EpisodeRunner(task.episode_spec) as runner, pytest.raises(EnvFailure, match=expected):
        runner.episode(lambda obs: np.zeros((len(obs), 1)), [1.0], k=1)

"""Action repeat and the measured sync/async choice."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest

from agents.ppo.config import Optimizations
from agents.ppo.envs import ActionRepeat, choose_vec_env, estimate_costs, make_env_fn, time_subprocess_round_trip


class CountingEnv(gym.Env):
    """Reward = step index (1, 2, 3, ...); terminates after ``length`` steps; records actions."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def __init__(self, length: int = 100, sleep_s: float = 0.0) -> None:
        self.length, self.sleep_s, self.t, self.actions = length, sleep_s, 0, []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        self.t += 1
        self.actions.append(int(action))
        return np.zeros(2, np.float32), float(self.t), self.t >= self.length, False, {}


def test_action_repeat_repeats_the_action_and_sums_rewards():
    inner = CountingEnv()
    env = ActionRepeat(inner, 3)
    env.reset(seed=0)
    _, reward, terminated, _, _ = env.step(2)
    assert inner.actions == [2, 2, 2] and reward == 1 + 2 + 3 and not terminated
    _, reward, _, _, _ = env.step(1)
    assert inner.actions[3:] == [1, 1, 1] and reward == 4 + 5 + 6


def test_action_repeat_stops_at_episode_end():
    inner = CountingEnv(length=4)
    env = ActionRepeat(inner, 3)
    env.reset()
    env.step(0)
    _, reward, terminated, _, _ = env.step(0)
    assert terminated and reward == 4 and len(inner.actions) == 4


def test_cost_model():
    sync, asyn = estimate_costs(step_s=5e-6, round_trip_s=40e-6, num_envs=8, cores=2)
    assert sync < asyn
    sync, asyn = estimate_costs(step_s=5e-3, round_trip_s=40e-6, num_envs=8, cores=2)
    assert asyn < sync


def test_auto_picks_subprocesses_for_a_slow_env_and_in_process_for_a_fast_one():
    rt = time_subprocess_round_trip(trips=50)
    assert 0 < rt < 0.5  # measured; its value swings with the machine's load
    rt = 2e-4  # the choice itself is checked against a fixed round trip, so load cannot flip it
    slow = choose_vec_env(Optimizations(), lambda: CountingEnv(sleep_s=0.002), 4, cores=2, round_trip_s=rt)
    assert slow.mode == "async" and "round trip" in slow.reason and slow.step_s >= 0.002
    fast = choose_vec_env(Optimizations(), lambda: CountingEnv(), 4, cores=2, round_trip_s=rt)
    assert fast.mode == "sync"


def test_auto_picks_in_process_for_cartpole_on_two_cores():
    choice = choose_vec_env(Optimizations(), make_env_fn("CartPole-v1", 0), 8, cores=2)
    assert choice.mode == "sync", choice.reason
    assert choice.sync_cost_s < choice.async_cost_s


@pytest.mark.parametrize(
    "opts, mode",
    [
        (Optimizations(force_dummy_vec_env=True, use_subproc_vec_env=True), "sync"),
        (Optimizations(vec_env="async"), "async"),
        (Optimizations(vec_env="sync", use_subproc_vec_env=True), "sync"),
        (Optimizations(use_subproc_vec_env=True), "async"),
    ],
)
def test_explicit_flags_override_measurement(opts, mode):
    def boom():
        raise AssertionError("must not measure when the mode is explicit")

    assert choose_vec_env(opts, boom, 8).mode == mode


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_in_process_vector_env_matches_gymnasium_sync(env_id):
    from agents.ppo.envs import make_vector_env

    fns = [make_env_fn(env_id, i) for i in range(3)]
    ours, ref = make_vector_env(fns, "sync"), make_vector_env(fns, "sync_gymnasium")
    o1, _ = ours.reset(seed=7)
    o2, _ = ref.reset(seed=7)
    np.testing.assert_array_equal(o1, o2)
    ref.action_space.seed(0)
    finals = 0
    for _ in range(250):
        a = ref.action_space.sample()
        r1, r2 = ours.step(a), ref.step(a)
        for x, y in zip(r1[:4], r2[:4]):
            np.testing.assert_array_equal(x, y)
        assert ("final_obs" in r1[4]) == ("final_obs" in r2[4])
        if "final_obs" in r1[4]:
            finals += 1
            for i in np.nonzero(r2[4]["_final_obs"])[0]:
                np.testing.assert_array_equal(r1[4]["final_obs"][i], r2[4]["final_obs"][i])
    assert finals > 0
    ours.close(), ref.close()

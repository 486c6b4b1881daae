"""The lean MuJoCo step (`agents.ppo.mujoco_env`): gymnasium's observations,
rewards and flags to the bit, step for step and across the time limit; what
it refuses; when ``auto`` picks it; PPO on it trains exactly as on
`InProcessVectorEnv`. Skipped without MuJoCo (``dev`` has it)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("mujoco")

from agents.ppo import envs as ppo_envs  # noqa: E402
from agents.ppo.config import ConfigError, Optimizations, load_config  # noqa: E402
from agents.ppo.envs import ActionRepeat, choose_vec_env, lean_mujoco_supported, make_env_fn, make_vector_env  # noqa: E402
from agents.ppo.mujoco_env import MujocoVectorEnv  # noqa: E402


def _assert_same_steps(fns, steps: int, dtype=np.float32, seed: int = 3) -> int:
    ours, ref = make_vector_env(fns, "mujoco"), make_vector_env(fns, "sync")
    np.testing.assert_array_equal(ours.reset(seed=seed)[0], ref.reset(seed=seed)[0])
    space = ref.single_action_space
    rng = np.random.default_rng(seed)
    finals = 0
    for _ in range(steps):
        a = np.clip(rng.uniform(-1.5, 1.5, (len(fns), *space.shape)), space.low, space.high).astype(dtype)
        r1, r2 = ours.step(a), ref.step(a)
        for x, y in zip(r1[:4], r2[:4]):
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x, y)  # to the bit, not approximately
        assert set(r1[4]) == set(r2[4])
        if r2[4]:
            finals += 1
            np.testing.assert_array_equal(r1[4]["_final_obs"], r2[4]["_final_obs"])
            for i in np.nonzero(r2[4]["_final_obs"])[0]:
                np.testing.assert_array_equal(r1[4]["final_obs"][i], r2[4]["final_obs"][i])
    ours.close(), ref.close()
    return finals


@pytest.mark.parametrize("env_id", ["HalfCheetah-v5", "Swimmer-v5"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_lean_step_is_gymnasiums_to_the_bit_across_time_limits(env_id, dtype):
    fns = [make_env_fn(env_id, i, max_episode_steps=30 + 7 * i) for i in range(3)]  # envs truncate at different steps
    assert _assert_same_steps(fns, 100, dtype) >= 4


def test_the_envs_own_settings_are_honoured():
    fns = [make_env_fn("HalfCheetah-v5", i, max_episode_steps=20, exclude_current_positions_from_observation=False,
                       ctrl_cost_weight=0.5, forward_reward_weight=2.0, frame_skip=3) for i in range(2)]
    assert make_vector_env(fns, "mujoco").single_observation_space.shape == (18,)
    assert _assert_same_steps(fns, 45) >= 2


def test_what_it_cannot_step_exactly_is_a_clear_error():
    with pytest.raises(ValueError, match="lean MuJoCo step knows"):
        MujocoVectorEnv([make_env_fn("Pendulum-v1", 0)])
    with pytest.raises(ValueError, match="wrapper ActionRepeat"):
        MujocoVectorEnv([lambda: ActionRepeat(gym.make("Swimmer-v5", disable_env_checker=True), 2)])
    with pytest.raises(ValueError, match="without a TimeLimit"):
        MujocoVectorEnv([lambda: gym.make("Swimmer-v5", disable_env_checker=True, max_episode_steps=None).unwrapped])
    with pytest.raises(ConfigError, match="vec_env='mujoco' with action_repeat=2"):
        load_config(None, vec_env="mujoco", action_repeat=2)
    envs = MujocoVectorEnv([make_env_fn("Swimmer-v5", i) for i in range(2)])
    with pytest.raises(gym.error.ResetNeeded):
        envs.step(np.zeros((2, 2), dtype=np.float32))
    envs.reset(seed=0)
    with pytest.raises(ValueError, match=r"actions of shape \(2, 3\): expected \(2, 2\)"):
        envs.step(np.zeros((2, 3), dtype=np.float32))
    envs.close()


def test_auto_picks_the_lean_step_where_it_applies(monkeypatch):
    fn = make_env_fn("CartPole-v1", 0)
    timed = dict(step_s=3e-5, round_trip_s=4e-5, cores=2)
    assert lean_mujoco_supported("HalfCheetah-v5") and lean_mujoco_supported("Swimmer-v5")
    assert not lean_mujoco_supported("Hopper-v5") and not lean_mujoco_supported("CartPole-v1")
    assert not lean_mujoco_supported("NoSuchEnv-v0")
    choice = choose_vec_env(Optimizations(), fn, 8, env_id="HalfCheetah-v5", **timed)
    assert choice.mode == "mujoco" and "lean MuJoCo step" in choice.reason
    assert choose_vec_env(Optimizations(), fn, 1, env_id="Swimmer-v5", **timed).mode == "mujoco"
    assert choose_vec_env(Optimizations(), fn, 8, env_id="Hopper-v5", **timed).mode == "sync"
    assert choose_vec_env(Optimizations(action_repeat=2), fn, 8, env_id="HalfCheetah-v5", **timed).mode == "sync"
    assert choose_vec_env(Optimizations(vec_env="sync"), fn, 8, env_id="HalfCheetah-v5", **timed).mode == "sync"
    # a slow step on many cores (EnvPool not installed): subprocesses still win the measurement
    monkeypatch.setattr(ppo_envs, "envpool_ids", lambda: frozenset())
    assert choose_vec_env(Optimizations(), fn, 8, env_id="HalfCheetah-v5", step_s=5e-3, round_trip_s=4e-5, cores=8).mode == "async"


def test_ppo_on_the_lean_step_trains_exactly_as_in_process(state_dir):
    from agents.ppo.ppo import PPO

    def trained(vec_env: str):
        cfg = load_config(None, env_id="Swimmer-v5", num_envs=2, num_steps=64, minibatch_size=64, update_epochs=2,
                          total_steps=512, eval_episodes=0, vec_env=vec_env, device="cpu", seed=4)
        ppo = PPO(cfg)
        try:
            ppo.train()
            return ppo.vec_choice.mode, [p.detach().clone() for p in ppo.net.parameters()]
        finally:
            ppo.close()

    (mode_a, lean), (mode_b, plain) = trained("mujoco"), trained("sync")
    assert (mode_a, mode_b) == ("mujoco", "sync")
    assert all(torch.equal(a, b) for a, b in zip(lean, plain))

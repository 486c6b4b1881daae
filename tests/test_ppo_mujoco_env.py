"""The lean MuJoCo step (`agents.ppo.fast.MujocoVectorEnv`, the fast path's
``lean_mujoco`` piece): gymnasium's observations, rewards and flags to the
bit, step for step and across the time limit; what it refuses; when PPO
takes it; PPO on it trains exactly as on `InProcessVectorEnv`. Skipped
without MuJoCo (``dev`` has it)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("mujoco")

from agents.ppo.config import ConfigError, load_config  # noqa: E402
from agents.ppo.envs import ActionRepeat, make_env_fn, make_vector_env  # noqa: E402
from agents.ppo.fast import PIECES, MujocoVectorEnv, lean_mujoco_supported  # noqa: E402


def _assert_same_steps(fns, steps: int, dtype=np.float32, seed: int = 3) -> int:
    ours, ref = MujocoVectorEnv(fns), make_vector_env(fns, "sync")
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
    fns = [
        make_env_fn(
            "HalfCheetah-v5",
            i,
            max_episode_steps=20,
            exclude_current_positions_from_observation=False,
            ctrl_cost_weight=0.5,
            forward_reward_weight=2.0,
            frame_skip=3,
        )
        for i in range(2)
    ]
    assert MujocoVectorEnv(fns).single_observation_space.shape == (18,)
    assert _assert_same_steps(fns, 45) >= 2


def test_what_it_cannot_step_exactly_is_a_clear_error():
    with pytest.raises(ValueError, match="lean MuJoCo step knows"):
        MujocoVectorEnv([make_env_fn("Pendulum-v1", 0)])
    with pytest.raises(ValueError, match="wrapper ActionRepeat"):
        MujocoVectorEnv([lambda: ActionRepeat(gym.make("Swimmer-v5", disable_env_checker=True), 2)])
    with pytest.raises(ValueError, match="without a TimeLimit"):
        MujocoVectorEnv([lambda: gym.make("Swimmer-v5", disable_env_checker=True, max_episode_steps=None).unwrapped])
    with pytest.raises(
        ConfigError, match="vec_env='mujoco' was removed: the lean MuJoCo step now comes with cpu_fast_path"
    ):
        load_config(None, vec_env="mujoco")
    envs = MujocoVectorEnv([make_env_fn("Swimmer-v5", i) for i in range(2)])
    with pytest.raises(gym.error.ResetNeeded):
        envs.step(np.zeros((2, 2), dtype=np.float32))
    envs.reset(seed=0)
    with pytest.raises(ValueError, match=r"actions of shape \(2, 3\): expected \(2, 2\)"):
        envs.step(np.zeros((2, 3), dtype=np.float32))
    envs.close()


def test_the_lean_step_is_taken_in_process_where_it_applies():
    assert lean_mujoco_supported("HalfCheetah-v5") and lean_mujoco_supported("Swimmer-v5")
    assert not lean_mujoco_supported("Hopper-v5") and not lean_mujoco_supported("CartPole-v1")
    assert not lean_mujoco_supported("NoSuchEnv-v0")

    def built(env_id, lean=True, **opts):
        from agents.ppo.ppo import PPO

        cfg = load_config(None, env_id=env_id, num_envs=2, device="cpu", eval_episodes=0, **opts)
        ppo = PPO(cfg, fast_pieces=PIECES if lean else tuple(p for p in PIECES if p != "lean_mujoco"))
        ppo.close()
        return type(ppo.envs).__name__, ppo.vec_choice.reason

    name, reason = built("HalfCheetah-v5", vec_env="sync")
    assert name == "MujocoVectorEnv" and "lean MuJoCo step" in reason
    assert built("Swimmer-v5", force_dummy_vec_env=True)[0] == "MujocoVectorEnv"
    assert built("HalfCheetah-v5", lean=False, vec_env="sync")[0] == "InProcessVectorEnv"
    assert built("HalfCheetah-v5", vec_env="sync", cpu_fast_path=False)[0] == "InProcessVectorEnv"
    assert built("HalfCheetah-v5", vec_env="sync", action_repeat=2)[0] == "InProcessVectorEnv"
    assert built("CartPole-v1", vec_env="sync")[0] == "InProcessVectorEnv"


def test_ppo_on_the_lean_step_trains_exactly_as_in_process(state_dir):
    from agents.ppo.ppo import PPO

    def trained(pieces):
        cfg = load_config(
            None,
            env_id="Swimmer-v5",
            num_envs=2,
            num_steps=64,
            minibatch_size=64,
            update_epochs=2,
            total_steps=512,
            eval_episodes=0,
            vec_env="sync",
            device="cpu",
            seed=4,
        )
        ppo = PPO(cfg, fast_pieces=pieces)
        try:
            ppo.train()
            return type(ppo.envs).__name__, [p.detach().clone() for p in ppo.net.parameters()]
        finally:
            ppo.close()

    (kind_a, lean), (kind_b, plain) = trained(PIECES), trained(tuple(p for p in PIECES if p != "lean_mujoco"))
    assert (kind_a, kind_b) == ("MujocoVectorEnv", "InProcessVectorEnv")
    assert all(torch.equal(a, b) for a, b in zip(lean, plain))

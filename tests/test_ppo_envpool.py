"""The EnvPool backend (`agents.ppo.envpool_env`): same-step autoreset, the
dynamics of gymnasium's envs, PPO on it, and when ``auto`` picks it. The
tests that step EnvPool skip without the ``envpool`` extra (``dev`` has it);
the choice and the errors are tested either way."""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import pytest

from agents.ppo import envs as ppo_envs
from agents.ppo.config import ConfigError, Optimizations, load_config
from agents.ppo.envs import choose_vec_env, make_env_fn
from genesis_fp16.extras import MissingExtraError

needs_envpool = pytest.mark.skipif(not ppo_envs.envpool_ids(), reason="needs the envpool extra: pip install -e '.[envpool]'")


@needs_envpool
def test_a_finished_env_starts_its_next_episode_in_the_same_step():
    envs = ppo_envs.EnvPoolVectorEnv("CartPole-v1", 4, seed=0)
    assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
    envs.reset(seed=0)
    for _ in range(100):  # always pushing right: the poles fall within a few dozen steps
        obs, reward, terminated, truncated, infos = envs.step(np.ones(4, dtype=np.int64))
        if infos:
            break
    done = terminated | truncated
    assert done.any() and np.array_equal(infos["_final_obs"], done)
    for i in np.nonzero(done)[0]:
        assert abs(infos["final_obs"][i][2]) > 0.2  # the last observation: the pole has fallen
        assert np.all(np.abs(obs[i]) <= 0.05)  # what is returned: a fresh start (CartPole starts within +-0.05)
    _, reward, terminated, truncated, _ = envs.step(np.zeros(4, dtype=np.int64))
    assert np.all(reward == 1.0)  # every env acted: none spent the step resetting, as EnvPool alone would
    envs.close()


def _returns_gymnasium(env_id: str, policy, episodes: int) -> np.ndarray:
    out = []
    for k in range(episodes):
        env = gym.make(env_id)
        obs, _ = env.reset(seed=1000 + k)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(policy(obs[None])[0])
            total, done = total + reward, terminated or truncated
        out.append(total)
        env.close()
    return np.array(out)


def _returns_envpool(env_id: str, policy, episodes: int) -> np.ndarray:
    envs = ppo_envs.EnvPoolVectorEnv(env_id, episodes, seed=1000)
    obs, _ = envs.reset()
    total, finished, returns = np.zeros(episodes), np.zeros(episodes, bool), np.zeros(episodes)
    while not finished.all():
        obs, reward, terminated, truncated, _ = envs.step(policy(obs))
        total += np.where(finished, 0.0, reward)
        ended = (terminated | truncated) & ~finished
        returns[ended], finished = total[ended], finished | ended
    envs.close()
    return returns


@needs_envpool
@pytest.mark.parametrize("env_id, policy", [
    ("CartPole-v1", lambda obs: (obs[:, 2] > 0).astype(np.int64)),  # push toward the lean: balances for about 40 steps
    ("Pendulum-v1", lambda obs: np.clip(-2.0 * obs[:, 1:2] - 0.5 * obs[:, 2:3], -2.0, 2.0)),
])
def test_dynamics_match_gymnasium_on_a_fixed_policy(env_id, policy):
    """Not step for step (the two draw their start states from different
    random numbers) but in distribution: the mean return of a fixed policy
    over 64 episodes agrees within 4 standard errors."""
    ours, theirs = _returns_envpool(env_id, policy, 64), _returns_gymnasium(env_id, policy, 64)
    se = np.sqrt(ours.var() / len(ours) + theirs.var() / len(theirs))
    assert abs(ours.mean() - theirs.mean()) < 4 * se + 1e-6, (ours.mean(), theirs.mean(), se)


@needs_envpool
def test_ppo_trains_on_envpool(state_dir):
    from agents.ppo.ppo import PPO

    cfg = load_config(None, env_id="CartPole-v1", num_envs=4, num_steps=32, minibatch_size=32, update_epochs=2, total_steps=256,
                      eval_episodes=1, vec_env="envpool", device="cpu")
    ppo = PPO(cfg)
    assert isinstance(ppo.envs, ppo_envs.EnvPoolVectorEnv) and ppo.vec_choice.mode == "envpool"
    result = ppo.train()
    ppo.close()
    assert result.env_steps == 256 and len(result.episode_returns) > 0


def test_auto_picks_envpool_for_a_mujoco_env_it_has_and_nothing_else(monkeypatch):
    monkeypatch.setattr(ppo_envs, "envpool_ids", lambda: frozenset({"HalfCheetah-v5", "CartPole-v1"}))
    fn = make_env_fn("CartPole-v1", 0)
    timed = dict(step_s=1e-5, round_trip_s=4e-5, cores=ppo_envs.ENVPOOL_MIN_CORES)
    assert choose_vec_env(Optimizations(), fn, 8, env_id="HalfCheetah-v5", **timed).mode == "envpool"
    # too few cores for its thread pool: left out, and the reason says so
    few = choose_vec_env(Optimizations(), fn, 8, env_id="HalfCheetah-v5", **{**timed, "cores": 2})
    assert few.mode == "mujoco" and "EnvPool left out on 2 cores" in few.reason  # in process: the lean MuJoCo step
    assert choose_vec_env(Optimizations(vec_env="envpool"), fn, 8, env_id="HalfCheetah-v5", **{**timed, "cores": 2}).mode == "envpool"
    assert choose_vec_env(Optimizations(), fn, 8, env_id="CartPole-v1", **timed).mode == "sync"  # classic control: in process
    assert choose_vec_env(Optimizations(action_repeat=2), fn, 8, env_id="HalfCheetah-v5", **timed).mode == "sync"
    assert choose_vec_env(Optimizations(vec_env="sync"), fn, 8, env_id="HalfCheetah-v5", **timed).mode == "sync"
    monkeypatch.setattr(ppo_envs, "envpool_ids", lambda: frozenset())  # the extra is not installed
    assert choose_vec_env(Optimizations(), fn, 8, env_id="HalfCheetah-v5", **timed).mode == "mujoco"


def test_envpool_without_the_extra_or_with_action_repeat_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "envpool", None)  # import envpool now raises ImportError
    with pytest.raises(MissingExtraError, match=r"vec_env: envpool needs envpool.*genesis-fp16\[envpool\]"):
        ppo_envs.EnvPoolVectorEnv("CartPole-v1", 2)
    with pytest.raises(ConfigError, match="action_repeat=2"):
        load_config(None, vec_env="envpool", action_repeat=2)

"""Small gymnasium environments for the task tests. Module level and
torch-free, so spawned evaluation workers import them quickly."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class Drift(gym.Env):
    """x moves by the action; reward -|x|; ends after 5 steps. ``explode_above``:
    step raises for an action above it (a candidate-dependent failure)."""

    observation_space = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, explode_above: float = np.inf) -> None:
        self.explode_above = explode_above
        self.x, self.t = 0.0, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.t = float(self.np_random.uniform(-1, 1)), 0
        return np.array([self.x, 0.0], np.float32), {}

    def step(self, action):
        if float(action[0]) > self.explode_above:
            raise RuntimeError(f"actuator limit: action {float(action[0]):.2f}")
        self.x += float(action[0])
        self.t += 1
        return np.array([self.x, self.t / 5], np.float32), -abs(self.x), False, self.t >= 5, {}


def drift() -> gym.Env:
    return Drift()


def exploding_drift() -> gym.Env:
    return Drift(explode_above=0.0)


class Still(Drift):
    """Nothing moves and nothing is earned: every return is exactly 0.0."""

    def step(self, action):
        self.t += 1
        return np.array([self.x, self.t / 5], np.float32), 0.0, False, self.t >= 5, {}


def still() -> gym.Env:
    return Still()


class Camera(Drift):
    observation_space = gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)


def camera() -> gym.Env:
    return Camera()


class BrokenReset(Drift):
    def reset(self, *, seed=None, options=None):
        raise OSError("simulator license server unreachable")


def broken_reset() -> gym.Env:
    return BrokenReset()


def broken_make() -> gym.Env:
    raise ConnectionError("no simulator on port 7000")


class Vanishing(Drift):
    """step ends the worker process for a large action, as a segfaulting simulator would."""

    def step(self, action):
        if float(action[0]) > 0.0:
            import os

            os._exit(3)
        return super().step(action)


def vanishing() -> gym.Env:
    return Vanishing()


def mujoco_warning() -> int:
    """Step a one-joint MuJoCo model with a NaN velocity: MuJoCo warns (an
    unstable simulation) and logs it. Returns how often it warned."""
    import mujoco

    model = mujoco.MjModel.from_xml_string(
        '<mujoco><worldbody><body><joint type="hinge"/><geom size="0.1"/></body></worldbody></mujoco>'
    )
    data = mujoco.MjData(model)
    data.qvel[:] = np.nan
    mujoco.mj_step(model, data)
    return int(data.warning[mujoco.mjtWarning.mjWARN_BADQVEL].number)


class NaNReward(Drift):
    """A simulator that diverged: the reward is NaN for an action above
    ``nan_above`` (by default for every action)."""

    def __init__(self, nan_above: float = -np.inf) -> None:
        super().__init__()
        self.nan_above = nan_above

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, float("nan") if float(action[0]) > self.nan_above else reward, terminated, truncated, info


def nan_reward() -> gym.Env:
    return NaNReward()


def nan_reward_above_zero() -> gym.Env:
    return NaNReward(nan_above=0.0)


class HugeReward(Drift):
    """A reward of 1e39 at the last step (step 4): finite as a Python float,
    inf once stored as float32."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, 1e39 if truncated else reward, terminated, truncated, info


def huge_reward() -> gym.Env:
    return HugeReward()


class LargeReward(Drift):
    """A reward of 1e38 at the last step (step 4) for an action above
    ``above``: finite even as float32, but near its limit (its square, or a
    few summed, overflow)."""

    def __init__(self, above: float = -np.inf) -> None:
        super().__init__()
        self.above = above

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, 1e38 if truncated and float(action[0]) > self.above else reward, terminated, truncated, info


def large_reward() -> gym.Env:
    return LargeReward()


def large_reward_above_zero() -> gym.Env:
    return LargeReward(above=0.0)


class NaNObs(Drift):
    """A simulator that diverges at the episode's last step (step 4): that
    next_obs is NaN for an action above ``nan_above`` (by default for every
    action). ``at_reset``: the observation from reset is NaN instead."""

    def __init__(self, nan_above: float = -np.inf, at_reset: bool = False) -> None:
        super().__init__()
        self.nan_above, self.at_reset = nan_above, at_reset

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        if self.at_reset:
            obs[1] = np.nan
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if truncated and float(action[0]) > self.nan_above:
            obs[1] = np.nan
        return obs, reward, terminated, truncated, info


def nan_last_obs() -> gym.Env:
    return NaNObs()


def nan_last_obs_above_zero() -> gym.Env:
    return NaNObs(nan_above=0.0)


def nan_reset_obs() -> gym.Env:
    return NaNObs(at_reset=True)


class FragileNaN(Drift):
    """next_obs is NaN at step 1; step raises on the NaN action a policy then gives, as a simulator may."""

    def step(self, action):
        if not np.isfinite(action).all():
            raise ValueError("bad action")
        obs, reward, terminated, truncated, info = super().step(action)
        if self.t == 2:
            obs[0] = np.nan
        return obs, reward, terminated, truncated, info


def fragile_nan() -> gym.Env:
    return FragileNaN()


class Fragment(gym.Env):
    """docs/EMBEDDING.md's Thermostat as its fragments read, joined: the spaces, and ``reset`` and ``step`` left as
    ``...`` (they return None)."""

    observation_space = gym.spaces.Box(-5.0, 5.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None): ...

    def step(self, action): ...


def fragment() -> gym.Env:
    return Fragment()

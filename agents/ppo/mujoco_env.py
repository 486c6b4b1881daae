"""Gymnasium's MuJoCo locomotion envs without gymnasium's per-step Python.

HalfCheetah-v5 and Swimmer-v5 reward forward velocity minus a control cost
and never terminate. Their ``step`` in gymnasium is one ``mj_step`` call
wrapped in about 20 small NumPy and Python operations per env (the shape
check, ``np.sum`` for the control cost, ``np.concatenate`` for the
observation, an info dict, two wrappers). `MujocoVectorEnv` keeps
gymnasium's envs (their models, their data, their reset and its random
numbers) and replaces only the step: per env it sets the control, calls
``mj_step`` and ``mj_rnePostConstraint`` as gymnasium does and copies the
positions into a preallocated observation array; the rewards of all envs
are computed in one vectorised expression with the same operations in the
same dtypes, and the time limit is counted here. The observations, rewards
and flags are gymnasium's to the bit, step for step
(``tests/test_ppo_mujoco_env.py``). PPO's ``vec_env: auto`` picks it for
the envs it supports; ``vec_env: mujoco`` asks for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from genesis_fp16.extras import require

from .vector_env import EnvFn, InProcessVectorEnv

gym = require("gymnasium", "genesis-fp16 ppo")

# the env classes this module steps, by gymnasium entry point -> how many leading qpos entries their
# observation leaves out (with exclude_current_positions_from_observation)
LAYOUTS = {
    "gymnasium.envs.mujoco.half_cheetah_v5:HalfCheetahEnv": 1,
    "gymnasium.envs.mujoco.swimmer_v5:SwimmerEnv": 2,
}


def lean_mujoco_supported(env_id: str) -> bool:
    """Whether `MujocoVectorEnv` steps ``env_id`` (by its registered entry point)."""
    try:
        entry = gym.spec(env_id).entry_point
    except gym.error.Error:
        return False
    return isinstance(entry, str) and entry in LAYOUTS


# the wrappers whose per-step work this class does itself (exactly these classes, not subclasses):
# the time limit, and the reset-before-step order
_ALLOWED_WRAPPERS = (gym.wrappers.TimeLimit, gym.wrappers.OrderEnforcing)


@dataclass(frozen=True)
class _Layout:
    skip: int  # leading qpos entries left out of the observation
    frame_skip: int
    dt: float
    forward_weight: float
    ctrl_weight: float


def _layout(env: gym.Env) -> tuple[_Layout, int]:
    """The step's constants and the env's time limit, read from one env; ValueError for an env this class cannot
    step exactly."""
    sim = env.unwrapped
    entry = f"{type(sim).__module__}:{type(sim).__name__}"
    if entry not in LAYOUTS:
        raise ValueError(f"{entry}: the lean MuJoCo step knows {sorted(LAYOUTS)}; use vec_env sync for other envs")
    max_steps: Optional[int] = None
    layer = env
    while isinstance(layer, gym.Wrapper):
        if type(layer) not in _ALLOWED_WRAPPERS:
            raise ValueError(
                f"wrapper {type(layer).__name__} around {entry}: the lean MuJoCo step replaces only "
                f"{', '.join(w.__name__ for w in _ALLOWED_WRAPPERS)} (action repeat and other wrappers need vec_env sync)"
            )
        if type(layer) is gym.wrappers.TimeLimit:
            max_steps = int(layer._max_episode_steps)
        layer = layer.env
    if max_steps is None:
        raise ValueError(f"{entry} without a TimeLimit wrapper: the lean MuJoCo step counts the episode's time limit itself")
    if sim.render_mode is not None:
        raise ValueError(f"render_mode={sim.render_mode!r}: the lean MuJoCo step does not render; use vec_env sync")
    skip = LAYOUTS[entry] if sim._exclude_current_positions_from_observation else 0
    return _Layout(skip, int(sim.frame_skip), float(sim.dt), sim._forward_reward_weight, sim._ctrl_cost_weight), max_steps


class MujocoVectorEnv(InProcessVectorEnv):
    """`InProcessVectorEnv` with gymnasium's HalfCheetah-v5 / Swimmer-v5 step
    done here (see the module docstring): same-step autoreset, the final
    observation in ``infos['final_obs']``. Resets go through gymnasium."""

    def __init__(self, env_fns: list[EnvFn]) -> None:
        super().__init__(env_fns)
        try:
            found = [_layout(env) for env in self.envs]
        except ValueError:
            self.close()
            raise
        layouts = {layout for layout, _ in found}
        if len(layouts) != 1:
            self.close()
            raise ValueError(f"the envs differ in their step's constants ({len(layouts)} kinds): one vector env steps one kind")
        self._c = layouts.pop()
        import mujoco

        self._mj_step, self._mj_rne = mujoco.mj_step, mujoco.mj_rnePostConstraint
        self._sims = [(env.unwrapped.model, env.unwrapped.data) for env in self.envs]
        self._npos = self._obs.shape[1] - self._sims[0][1].qvel.size
        self._nu = self._sims[0][0].nu
        self._x_before = np.zeros(self.num_envs)
        self._x_after = np.zeros(self.num_envs)
        self._elapsed = np.zeros(self.num_envs, dtype=np.int64)
        self._max_steps = np.array([limit for _, limit in found], dtype=np.int64)  # each env's TimeLimit
        self._needs_reset = True

    def reset(self, *, seed: Any = None, options: Optional[dict] = None):
        out = super().reset(seed=seed, options=options)
        self._elapsed[:] = 0
        self._needs_reset = False
        return out

    def step(self, actions: Any):
        if self._needs_reset:
            raise gym.error.ResetNeeded("call reset() before step()")
        acts = np.asarray(actions)
        if acts.shape != (self.num_envs, self._nu):
            raise ValueError(f"actions of shape {acts.shape}: expected ({self.num_envs}, {self._nu})")
        c, obs, npos = self._c, self._obs, self._npos
        x0, x1 = self._x_before, self._x_after
        for i, (model, data) in enumerate(self._sims):
            x0[i] = data.qpos[0]
            data.ctrl[:] = acts[i]
            self._mj_step(model, data, nstep=c.frame_skip)
            self._mj_rne(model, data)  # gymnasium computes the force quantities after every step
            x1[i] = data.qpos[0]
            obs[i, :npos] = data.qpos[c.skip:]
            obs[i, npos:] = data.qvel
        # gymnasium's expression per env, on all envs at once: weight * (dx / dt) - weight * sum(a^2), same dtypes
        self._rew[:] = c.forward_weight * ((x1 - x0) / c.dt) - c.ctrl_weight * np.sum(np.square(acts), axis=1)
        self._elapsed += 1
        np.greater_equal(self._elapsed, self._max_steps, out=self._trunc)
        infos: dict[str, Any] = {}
        if self._trunc.any():
            final_obs = np.full(self.num_envs, None, dtype=object)
            for i in np.nonzero(self._trunc)[0]:
                final_obs[i] = obs[i].copy()
                obs[i], _ = self.envs[i].reset()
                self._elapsed[i] = 0
            infos = {"final_obs": final_obs, "_final_obs": self._trunc.copy()}
        return obs.copy(), self._rew.copy(), self._term.copy(), self._trunc.copy(), infos

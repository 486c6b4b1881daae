"""The in-process vector env PPO steps by default (``vec_env: sync``), and
the base of the lean MuJoCo one (`agents.ppo.mujoco_env`)."""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from genesis_fp16.extras import require

gym = require("gymnasium", "genesis-fp16 ppo")

EnvFn = Callable[[], gym.Env]


class InProcessVectorEnv(gym.vector.VectorEnv):
    """In-process vector env with the ``SyncVectorEnv`` same-step autoreset
    contract, minus some per-step overhead: results go into preallocated
    arrays. Actions go to each env as the array's own elements (NumPy
    scalars): gymnasium 1.4's ``Discrete.contains``, which CartPole asserts on
    every step, takes 1.7 us for one and 2.2 us for a Python int. Measured
    against ``SyncVectorEnv`` by ``scripts/diagnose_performance.py --test env``."""

    def __init__(self, env_fns: list[EnvFn]) -> None:
        self.envs = [fn() for fn in env_fns]
        self.num_envs = len(self.envs)
        first = self.envs[0]
        if first.observation_space.shape is None:
            for env in self.envs:
                env.close()
            raise ValueError(
                f"observation space {first.observation_space} not supported (expected a space with a shape, e.g. Box)"
            )
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.observation_space = gym.vector.utils.batch_space(first.observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(first.action_space, self.num_envs)
        self.metadata = dict(first.metadata, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        shape = first.observation_space.shape
        self._obs = np.zeros((self.num_envs, *shape), dtype=first.observation_space.dtype)
        self._rew = np.zeros(self.num_envs, dtype=np.float64)
        self._term = np.zeros(self.num_envs, dtype=bool)
        self._trunc = np.zeros(self.num_envs, dtype=bool)

    def reset(self, *, seed: Any = None, options: Optional[dict] = None):
        seeds = [seed + i for i in range(self.num_envs)] if isinstance(seed, int) else (seed or [None] * self.num_envs)
        for i, env in enumerate(self.envs):
            self._obs[i], _ = env.reset(seed=seeds[i], options=options)
        return self._obs.copy(), {}

    def step(self, actions: Any):
        acts = np.asarray(actions)
        final_obs = final_mask = None
        for i, env in enumerate(self.envs):
            obs, reward, terminated, truncated, _ = env.step(acts[i])
            if terminated or truncated:
                if final_obs is None:
                    final_obs = np.full(self.num_envs, None, dtype=object)
                    final_mask = np.zeros(self.num_envs, dtype=bool)
                final_obs[i], final_mask[i] = obs, True
                obs, _ = env.reset()
            self._obs[i] = obs
            self._rew[i], self._term[i], self._trunc[i] = reward, terminated, truncated
        infos = {} if final_obs is None else {"final_obs": final_obs, "_final_obs": final_mask}
        return self._obs.copy(), self._rew.copy(), self._term.copy(), self._trunc.copy(), infos

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()

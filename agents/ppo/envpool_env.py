"""The EnvPool backend (``vec_env: envpool``, the ``envpool`` extra): the
envs step in EnvPool's C++ thread pool, behind gymnasium's vector-env
interface with the same-step autoreset PPO needs.

EnvPool resets a finished env one step late: the step after the one that
ended an episode ignores that env's action and returns its first observation
with reward 0 (what gymnasium calls ``NEXT_STEP`` autoreset). PPO would store
that step as a transition (the old episode's last observation, an action that
did nothing, reward 0, the new episode's first observation). `EnvPoolVectorEnv`
resets the finished envs at once instead (``reset`` of just their ids), so a
step returns, as gymnasium's ``SAME_STEP`` mode does, the new episode's first
observation for a finished env and its last one in ``infos["final_obs"]``.
``tests/test_ppo_envpool.py`` checks this against gymnasium's own envs.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Optional

import numpy as np

from genesis_fp16.extras import require

gym = require("gymnasium", "genesis-fp16 ppo")

PURPOSE = "genesis-fp16 ppo with vec_env: envpool"


@lru_cache(maxsize=1)
def envpool_ids() -> frozenset[str]:
    """The env ids EnvPool has; empty without the ``envpool`` extra."""
    try:
        import envpool
    except ImportError:
        return frozenset()
    return frozenset(envpool.list_all_envs())


class EnvPoolVectorEnv(gym.vector.VectorEnv):
    """``num_envs`` copies of ``env_id`` in one EnvPool (synchronous: every
    step steps them all), env ``i`` seeded ``seed + i`` by EnvPool. ``reset``
    with another seed builds the pool again with that seed."""

    def __init__(self, env_id: str, num_envs: int, seed: int = 0, **kwargs: Any) -> None:
        require("envpool", PURPOSE)
        if env_id not in envpool_ids():
            raise ValueError(f"vec_env: envpool has no env {env_id!r}; use vec_env: sync or async for it")
        self.env_id, self.num_envs, self.kwargs = env_id, int(num_envs), kwargs
        self._pool = self._make(seed)
        self.single_observation_space = self._pool.observation_space
        self.single_action_space = self._pool.action_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
        self._discrete = isinstance(self.single_action_space, gym.spaces.Discrete)

    def _make(self, seed: int) -> Any:
        import envpool

        self._seed = int(seed)
        return envpool.make_gymnasium(self.env_id, num_envs=self.num_envs, seed=self._seed, **self.kwargs)

    def reset(self, *, seed: Any = None, options: Optional[dict] = None) -> tuple[np.ndarray, dict]:
        if options:
            raise ValueError(f"EnvPoolVectorEnv.reset: options {sorted(options)} are not supported")
        if isinstance(seed, (list, tuple)):
            raise ValueError("EnvPoolVectorEnv.reset: one int seed (env i gets seed + i), not one per env")
        if seed is not None and int(seed) != self._seed:
            self._pool.close()
            self._pool = self._make(int(seed))
        obs, _ = self._pool.reset()
        return obs, {}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        actions = np.asarray(actions)
        obs, reward, terminated, truncated, _ = self._pool.step(actions.astype(np.int32) if self._discrete else actions)
        done = np.logical_or(terminated, truncated)
        if not done.any():
            return obs, reward, terminated, truncated, {}
        ids = np.nonzero(done)[0]
        final = np.full(self.num_envs, None, dtype=object)
        for i in ids:
            final[i] = obs[i].copy()
        first, info = self._pool.reset(ids.astype(np.int32))  # at once: the next step acts in the new episode
        obs = obs.copy()
        obs[np.asarray(info["env_id"])] = first
        return obs, reward, terminated, truncated, {"final_obs": final, "_final_obs": done}

    def close_extras(self, **kwargs: Any) -> None:
        self._pool.close()

"""Vectorized environments: action repeat, our in-process vector env, and the
in-process / subprocess choice.

``vec_env: auto`` decides by measurement, not by platform: it times one env
step here and one round trip to a subprocess, and picks subprocesses only
when the step is slow enough that parallel envs pay for the pipe traffic (on
CartPole, about 10 us a step, the round trip alone costs 10x the step).
In process, with the CPU fast path on, HalfCheetah-v5 and Swimmer-v5 step
through the lean MuJoCo step (`agents.ppo.fast.MujocoVectorEnv`).
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing as mp
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from genesis_fp16.base.extras import require
from genesis_fp16.base.telemetry import get_logger

from .config import Optimizations

gym = require("gymnasium", "genesis-fp16 ppo")

EnvFn = Callable[[], gym.Env]


class InProcessVectorEnv(gym.vector.VectorEnv):
    """``SyncVectorEnv``'s same-step autoreset contract with less per-step overhead: results go into preallocated
    arrays; actions go to each env as NumPy scalars (gymnasium 1.4's ``Discrete.contains`` takes 1.7 us for one, 2.2 us
    for a Python int). Measured by ``scripts/diagnose_performance.py --test env``."""

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
        self.single_observation_space, self.single_action_space = first.observation_space, first.action_space
        self.observation_space = gym.vector.utils.batch_space(first.observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(first.action_space, self.num_envs)
        self.metadata = dict(first.metadata, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        self._obs = np.zeros((self.num_envs, *first.observation_space.shape), dtype=first.observation_space.dtype)
        self._rew = np.zeros(self.num_envs, dtype=np.float64)
        self._term, self._trunc = np.zeros(self.num_envs, dtype=bool), np.zeros(self.num_envs, dtype=bool)

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


class ActionRepeat(gym.Wrapper):
    """Repeat each action ``repeat`` times and sum the rewards; stops at the episode's end."""

    def __init__(self, env: gym.Env, repeat: int) -> None:
        super().__init__(env)
        if repeat < 1:
            raise ValueError(f"action_repeat={repeat!r}: expected an integer >= 1")
        self.repeat = repeat

    def step(self, action: Any):
        total = 0.0
        for _ in range(self.repeat):
            obs, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if terminated or truncated:
                break
        return obs, total, terminated, truncated, info


def make_env_fn(env_id: str, seed: int, action_repeat: int = 1, **kwargs: Any) -> EnvFn:
    def thunk() -> gym.Env:
        kwargs.setdefault(
            "disable_env_checker", True
        )  # it checks the first step only, and costs a wrapper on every one
        env = gym.make(env_id, **kwargs)
        if action_repeat > 1:
            env = ActionRepeat(env, action_repeat)
        env.action_space.seed(seed)
        return env

    return thunk


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def time_env_step(env_fn: EnvFn, steps: int = 50, seed: int = 0) -> float:
    """Median seconds of one ``env.step`` in this process (random actions)."""
    env = env_fn()
    try:
        env.reset(seed=seed)
        env.action_space.seed(seed)
        times = []
        for _ in range(steps):
            action = env.action_space.sample()
            t0 = time.perf_counter()
            _, _, terminated, truncated, _ = env.step(action)
            times.append(time.perf_counter() - t0)
            if terminated or truncated:
                env.reset()
        return statistics.median(times)
    finally:
        env.close()


def _echo(conn) -> None:
    while (msg := conn.recv()) is not None:
        conn.send(msg)


def time_subprocess_round_trip(trips: int = 200, payload_size: int = 64) -> float:
    """Median seconds of one send/receive to a subprocess with an observation-sized payload (AsyncVectorEnv's cost per
    env step)."""
    ctx = mp.get_context()
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_echo, args=(child,), daemon=True)
    proc.start()
    payload = (np.zeros(payload_size, dtype=np.float32), 0.0, False, False, {})
    try:
        parent.send(payload)
        parent.recv()  # warm-up
        times = []
        for _ in range(trips):
            t0 = time.perf_counter()
            parent.send(payload)
            parent.recv()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    finally:
        parent.send(None)
        proc.join(timeout=5)
        if proc.is_alive():
            proc.terminate()


@dataclass(frozen=True)
class VecEnvChoice:
    mode: str  # "sync" | "async"
    reason: str
    step_s: Optional[float] = None
    round_trip_s: Optional[float] = None
    sync_cost_s: Optional[float] = None
    async_cost_s: Optional[float] = None


def estimate_costs(step_s: float, round_trip_s: float, num_envs: int, cores: int) -> tuple[float, float]:
    """Seconds per vector step: in process every env steps in turn; with subprocesses the main process pays one round
    trip per env and the envs step in parallel on at most ``cores`` cores."""
    sync_cost = num_envs * step_s
    async_cost = num_envs * round_trip_s + math.ceil(num_envs / max(1, cores)) * step_s
    return sync_cost, async_cost


def choose_vec_env(
    opts: Optimizations,
    env_fn: EnvFn,
    num_envs: int,
    *,
    cores: Optional[int] = None,
    step_s: Optional[float] = None,
    round_trip_s: Optional[float] = None,
) -> VecEnvChoice:
    """Resolve ``vec_env`` / ``force_dummy_vec_env`` / ``use_subproc_vec_env``; ``auto`` measures."""
    if opts.force_dummy_vec_env:
        return VecEnvChoice("sync", "force_dummy_vec_env=true")
    if opts.vec_env in ("sync", "async"):
        return VecEnvChoice(opts.vec_env, f"vec_env={opts.vec_env}")
    if opts.use_subproc_vec_env:
        return VecEnvChoice("async", "vec_env=auto with use_subproc_vec_env=true")
    if num_envs == 1:
        return VecEnvChoice("sync", "one env: nothing to run in parallel")
    cores = cores or available_cores()
    step_s = time_env_step(env_fn) if step_s is None else step_s
    round_trip_s = time_subprocess_round_trip() if round_trip_s is None else round_trip_s
    sync_cost, async_cost = estimate_costs(step_s, round_trip_s, num_envs, cores)
    reason = (
        f"measured env step {step_s * 1e6:.1f} us, subprocess round trip {round_trip_s * 1e6:.1f} us, "
        f"{num_envs} envs on {cores} cores: in-process {sync_cost * 1e6:.0f} us vs subprocess "
        f"{async_cost * 1e6:.0f} us per vector step"
    )
    return VecEnvChoice(
        "async" if async_cost < sync_cost else "sync", reason, step_s, round_trip_s, sync_cost, async_cost
    )


def make_vector_env(env_fns: list[EnvFn], mode: str) -> gym.vector.VectorEnv:
    """sync: `InProcessVectorEnv`; sync_gymnasium: gymnasium's ``SyncVectorEnv``; async: ``AsyncVectorEnv`` (one
    subprocess per env). All use SAME_STEP autoreset: a finished env returns its reset observation in the same step,
    with the final observation in ``infos['final_obs']`` (what GAE needs to bootstrap a truncated episode)."""
    autoreset = gym.vector.AutoresetMode.SAME_STEP
    if mode == "async":
        return gym.vector.AsyncVectorEnv(env_fns, autoreset_mode=autoreset)
    if mode == "sync":
        return InProcessVectorEnv(env_fns)
    if mode == "sync_gymnasium":
        return gym.vector.SyncVectorEnv(env_fns, autoreset_mode=autoreset)
    raise ValueError(f"vec env mode {mode!r}: expected sync, sync_gymnasium or async")


def build_envs(
    env_id: str,
    num_envs: int,
    seed: int,
    opts: Optimizations,
    lean: Optional[Callable[[list[EnvFn]], gym.vector.VectorEnv]] = None,
    **env_kwargs: Any,
) -> tuple[gym.vector.VectorEnv, VecEnvChoice]:
    """The vector env for training and the choice made (logged with its reason); in process, ``lean`` (the fast
    path's lean MuJoCo step, where it applies) in place of `InProcessVectorEnv`. ``env_kwargs`` go to ``gym.make``."""
    fns = [make_env_fn(env_id, seed + i, opts.action_repeat, **env_kwargs) for i in range(num_envs)]
    choice = choose_vec_env(opts, fns[0], num_envs)
    if choice.mode == "sync" and lean is not None and opts.action_repeat == 1 and not env_kwargs:
        choice = dataclasses.replace(
            choice, reason=choice.reason + f"; in process: the lean MuJoCo step for {env_id} (cpu_fast_path)"
        )
        envs = lean(fns)
    else:
        envs = make_vector_env(fns, choice.mode)
    get_logger("agents.ppo").info(
        "ppo.vec_env_selected", env=env_id, mode=choice.mode, num_envs=num_envs, reason=choice.reason
    )
    return envs, choice


def check_spaces(envs: gym.vector.VectorEnv, env_id: str) -> None:
    """ValueError (closing ``envs``) unless PPO can train on them: same-step autoreset, an observation shape, Discrete
    or Box actions."""
    autoreset = envs.metadata.get("autoreset_mode")
    if autoreset is not None and autoreset != gym.vector.AutoresetMode.SAME_STEP:
        envs.close()
        raise ValueError(
            f"vector env autoreset_mode={autoreset}: PPO needs AutoresetMode.SAME_STEP "
            "(the final observation in infos['final_obs'] for the truncation bootstrap)"
        )
    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    if obs_space.shape is None or not isinstance(act_space, (gym.spaces.Discrete, gym.spaces.Box)):
        envs.close()
        raise ValueError(
            f"env {env_id!r}: observation space {obs_space} / action space {act_space} not supported "
            "(expected an observation space with a shape and a Discrete or Box action space)"
        )

"""Vectorized environments: action repeat, and the sync/async choice.

``vec_env: auto`` decides by measurement, not by platform: it times one
environment step in this process and one round trip to a subprocess, and
picks subprocesses only when the step is slow enough that running envs in
parallel pays for the pipe traffic. On CartPole (about 10 us a step) the round
trip alone costs 10x the step, so in-process envs win there whatever the
platform.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from genesis_fp16.extras import require
from genesis_fp16.telemetry import get_logger

from .config import Optimizations
from .envpool_env import EnvPoolVectorEnv, envpool_ids
from .mujoco_env import MujocoVectorEnv, lean_mujoco_supported
from .vector_env import EnvFn, InProcessVectorEnv

gym = require("gymnasium", "genesis-fp16 ppo")


class ActionRepeat(gym.Wrapper):
    """Repeat each action ``repeat`` times and sum the rewards; stops early
    when the episode terminates or is truncated."""

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
        # the passive env checker only inspects the first reset/step; without it,
        # one wrapper layer less on every step
        kwargs.setdefault("disable_env_checker", True)
        env = gym.make(env_id, **kwargs)
        if action_repeat > 1:
            env = ActionRepeat(env, action_repeat)
        env.action_space.seed(seed)
        return env

    return thunk


# -- the sync / async choice ---------------------------------------------------


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
    while True:
        msg = conn.recv()
        if msg is None:
            break
        conn.send(msg)


def time_subprocess_round_trip(trips: int = 200, payload_size: int = 64) -> float:
    """Median seconds of one send/receive to a subprocess over a pipe, with a
    payload about the size of an observation (what AsyncVectorEnv pays per env per step)."""
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


ENVPOOL_MIN_CORES = 4  # auto's EnvPool rule: its C++ thread pool needs cores beside the learner's (measured slower on 2)


@dataclass(frozen=True)
class VecEnvChoice:
    mode: str  # "sync" | "async" | "envpool"
    reason: str
    step_s: Optional[float] = None
    round_trip_s: Optional[float] = None
    sync_cost_s: Optional[float] = None
    async_cost_s: Optional[float] = None


def estimate_costs(step_s: float, round_trip_s: float, num_envs: int, cores: int) -> tuple[float, float]:
    """Seconds per vector step. In-process: every env steps in turn. Subprocess:
    the main process pays one round trip per env (serially), and the envs
    step in parallel on at most ``cores`` cores."""
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
    env_id: Optional[str] = None,
) -> VecEnvChoice:
    """Resolve ``vec_env`` / ``force_dummy_vec_env`` / ``use_subproc_vec_env``.
    ``auto`` picks EnvPool, by rule and not by timing (its envs reset from
    other random numbers than gymnasium's, so a choice that followed the
    machine's load would change the run), for a MuJoCo ``env_id`` EnvPool has
    when the extra is installed, there is no action repeat and the machine
    has at least `ENVPOOL_MIN_CORES` cores (on 2 cores its thread pool made
    PPO slower than in-process envs: docs/PPO.md, "EnvPool inside PPO");
    otherwise it times in-process against subprocess envs. In process means
    `MujocoVectorEnv` for the MuJoCo envs it steps (gymnasium's results, step
    for step, so this choice changes no run), `InProcessVectorEnv` otherwise."""
    if opts.force_dummy_vec_env:
        return VecEnvChoice("sync", "force_dummy_vec_env=true")
    if opts.vec_env in ("sync", "async", "envpool", "mujoco"):
        return VecEnvChoice(opts.vec_env, f"vec_env={opts.vec_env}")
    if opts.use_subproc_vec_env:
        return VecEnvChoice("async", "vec_env=auto with use_subproc_vec_env=true")
    cores = cores or available_cores()
    envpool_fits = env_id is not None and opts.action_repeat == 1 and env_id in envpool_ids() and is_mujoco(env_id)
    if envpool_fits and cores >= ENVPOOL_MIN_CORES:
        return VecEnvChoice("envpool", f"{env_id} is a MuJoCo env EnvPool has (the envpool extra is installed), {cores} cores")
    left_out = f"EnvPool left out on {cores} cores (auto needs {ENVPOOL_MIN_CORES}); " if envpool_fits else ""
    # in process, the lean MuJoCo step where it applies: the same results as gymnasium's, step for step
    in_process = "mujoco" if env_id is not None and opts.action_repeat == 1 and lean_mujoco_supported(env_id) else "sync"
    lean = f"; in-process means the lean MuJoCo step for {env_id}" if in_process == "mujoco" else ""
    if num_envs == 1:
        return VecEnvChoice(in_process, left_out + "one env: nothing to run in parallel" + lean)
    step_s = time_env_step(env_fn) if step_s is None else step_s
    round_trip_s = time_subprocess_round_trip() if round_trip_s is None else round_trip_s
    sync_cost, async_cost = estimate_costs(step_s, round_trip_s, num_envs, cores)
    mode = "async" if async_cost < sync_cost else in_process
    reason = left_out + (
        f"measured env step {step_s * 1e6:.1f} us, subprocess round trip {round_trip_s * 1e6:.1f} us, "
        f"{num_envs} envs on {cores} cores: in-process {sync_cost * 1e6:.0f} us vs subprocess "
        f"{async_cost * 1e6:.0f} us per vector step" + (lean if mode == "mujoco" else "")
    )
    return VecEnvChoice(mode, reason, step_s, round_trip_s, sync_cost, async_cost)


def is_mujoco(env_id: str) -> bool:
    """Whether gymnasium registers ``env_id`` as one of its MuJoCo envs."""
    try:
        entry = gym.spec(env_id).entry_point
    except gym.error.Error:
        return False
    return isinstance(entry, str) and entry.startswith("gymnasium.envs.mujoco")


def make_vector_env(env_fns: list[EnvFn], mode: str) -> gym.vector.VectorEnv:
    """sync: `InProcessVectorEnv`; mujoco: `MujocoVectorEnv` (its envs only,
    else ValueError); sync_gymnasium: gymnasium's ``SyncVectorEnv``; async:
    ``AsyncVectorEnv`` (one subprocess per env).
    All use SAME_STEP autoreset: a finished env returns its reset observation
    in the same step, with the final observation in ``infos['final_obs']``
    (what GAE needs to bootstrap a truncated episode)."""
    autoreset = gym.vector.AutoresetMode.SAME_STEP
    if mode == "async":
        return gym.vector.AsyncVectorEnv(env_fns, autoreset_mode=autoreset)
    if mode == "sync":
        return InProcessVectorEnv(env_fns)
    if mode == "sync_gymnasium":
        return gym.vector.SyncVectorEnv(env_fns, autoreset_mode=autoreset)
    if mode == "mujoco":
        return MujocoVectorEnv(env_fns)
    raise ValueError(f"vec env mode {mode!r}: expected sync, mujoco, sync_gymnasium or async")


def build_envs(env_id: str, num_envs: int, seed: int, opts: Optimizations, **env_kwargs: Any):
    """The vector env for training and the choice made (logged with its reason).
    ``env_kwargs`` go to ``gym.make``; EnvPool is then left out of ``auto``
    (its envs take their own options)."""
    fns = [make_env_fn(env_id, seed + i, opts.action_repeat, **env_kwargs) for i in range(num_envs)]
    if env_kwargs and opts.vec_env == "envpool":
        raise ValueError(f"vec_env: envpool with gymnasium env options {sorted(env_kwargs)}: EnvPool takes its own; use sync or async")
    choice = choose_vec_env(opts, fns[0], num_envs, env_id=None if env_kwargs else env_id)
    get_logger("agents.ppo").info(
        "ppo.vec_env_selected", env=env_id, mode=choice.mode, num_envs=num_envs, reason=choice.reason
    )
    if choice.mode == "envpool":
        return EnvPoolVectorEnv(env_id, num_envs, seed), choice
    return make_vector_env(fns, choice.mode), choice


def check_spaces(envs: gym.vector.VectorEnv, env_id: str) -> None:
    """Raise ValueError (closing ``envs``) unless PPO can train on them: same-step
    autoreset, an observation space with a shape, a Discrete or Box action space."""
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

"""Real episodes of one candidate, in a torch-free worker process.

A start state is a row of floats. By default it is one number, the seed of
``env.reset(seed=...)``; a task with exact states (Pendulum) sets them with
its own ``set_state(env, row) -> obs`` after ``reset(seed=k)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

import numpy as np

from infrastructure.trajectory import F32_INF_FROM, MAX_MAGNITUDE, first_non_finite

from .policies import PolicySpec

if TYPE_CHECKING:
    import gymnasium as gym

SetStateFn = Callable[["gym.Env", Sequence[float]], np.ndarray]


class EnvFailure(RuntimeError):
    """The task's environment raised in make, reset or step, or returned data
    that is not finite: the candidate is charged and skipped, and the message
    says where."""


def refuse_non_finite(who: str, field: str, value: Any, step: int, episode: int) -> None:
    """Raise `EnvFailure` when ``value`` (``field`` of ``step`` of
    ``episode``: the obs from reset, an action, a reward or a next_obs) is
    NaN or inf once stored as float32, as the replay buffer stores it (a
    reward of 1e39 is inf there), or beyond `MAX_MAGNITUDE` (a reward of 1e38
    is finite there, but overflows the learners' statistics). One bad number would stop every later
    training of the world model on the buffer, so it costs its candidate
    instead. ``who`` produced the value: ``env 'X'``, or the policy."""
    bad = first_non_finite(value)
    if bad is None:
        return
    number = float(np.asarray(value, dtype=np.float64).reshape(-1)[bad])
    shown = str(number) if np.ndim(value) == 0 else f"{field}[{bad}] = {number}"
    if math.isfinite(number):
        shown += (
            ", inf as float32"
            if abs(number) >= F32_INF_FROM
            else f", beyond the +-{MAX_MAGNITUDE:g} the learners' float32 statistics allow"
        )
    where = " from reset" if field == "obs" else ""
    raise EnvFailure(f"{who} returned a non-finite {field} ({shown}){where} at step {step} of episode {episode}")


def _refuse_non_finite_steps(
    env_id: str, actions: Sequence[np.ndarray], next_obs: Sequence[np.ndarray], episode: int
) -> None:
    """`refuse_non_finite` for the earliest step whose action or next_obs is
    not finite (the action first within a step). Checked once an episode ends
    or fails, not at every step: one vectorised test costs what one step's
    would, and an episode runs hundreds of steps (Pendulum's ran 20-50% slower
    with a test per step). The reward (a float: cheap) and the obs from reset
    are checked at once."""
    with np.errstate(over="ignore"):  # beyond float32 becomes inf: that is what is looked for
        found = [
            (first_non_finite(np.asarray(rows, dtype=np.float32)), order, name, rows)
            for order, (name, rows) in enumerate((("action", actions), ("next_obs", next_obs)))
            if len(rows)
        ]
    bad = min((f for f in found if f[0] is not None), default=None, key=lambda f: (f[0], f[1]))
    if bad is not None:
        step, _, name, rows = bad
        who = f"the policy on env {env_id!r}" if name == "action" else f"env {env_id!r}"
        refuse_non_finite(who, name, rows[step], step, episode)


@dataclass(frozen=True)
class EpisodeSpec:
    """What a worker needs to run episodes (picklable; callables by reference)."""

    env_id: str
    policy: PolicySpec
    steps: int
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    env_factory: Optional[Callable[[], "gym.Env"]] = None
    set_state: Optional[SetStateFn] = None

    def make_env(self) -> "gym.Env":
        if self.env_factory is not None:
            return self.env_factory()
        # a plain import: this runs in torch-free worker processes, and importing
        # genesis_fp16.base.extras would import torch; Evaluator checks the extra first
        import gymnasium as gym

        return gym.make(self.env_id, **dict(self.env_kwargs))


def _returned(spec: EpisodeSpec, call: str, value: Any, shape: str, n: int) -> tuple[Any, ...]:
    """``value``, what the env's ``call`` returned, as the ``n``-tuple gymnasium's API says it returns (``shape``);
    anything else is `EnvFailure` saying so (an env that returns None raises nothing, and unpacking it would
    say only "cannot unpack")."""
    if isinstance(value, tuple) and len(value) == n:
        return value
    got = (
        "None"
        if value is None
        else f"a {type(value).__name__}" + (f" of {len(value)}" if isinstance(value, (tuple, list)) else "")
    )
    raise EnvFailure(f"env {spec.env_id!r} {call} returned {got}: a gymnasium env's {call} must return {shape}")


def _reset(spec: EpisodeSpec, env: "gym.Env", k: int, state: Sequence[float]) -> np.ndarray:
    if spec.set_state is not None:
        env.reset(seed=k)
        return np.asarray(spec.set_state(env, state), dtype=np.float32)
    obs, _ = _returned(spec, "reset", env.reset(seed=int(state[0])), "(obs, info)", 2)
    return np.asarray(obs, dtype=np.float32)


def run_episodes(
    spec: EpisodeSpec,
    params: Sequence[float],
    states: Sequence[Sequence[float]],
) -> dict[str, Any]:
    """One real episode per start state with the policy ``params``.

    Returns plain lists/arrays (picklable): per-episode returns and, per
    episode, the transitions (obs, action, reward, next_obs, done), where
    ``done`` marks a termination by the environment (not a time limit).
    A `MemoryError` (the worker's memory limit) passes through. An exception
    from the environment becomes `EnvFailure`, and so does an observation
    (from reset or step), an action or a reward that is not finite as
    float32 (`refuse_non_finite`), or a return that is not finite: such a
    return ranks nothing and the data would poison the replay buffer, so the
    candidate is charged and skipped like a crash.
    """
    params = np.asarray(params, dtype=np.float64)
    stage = "make"
    try:
        env = spec.make_env()
    except MemoryError:  # the worker's memory limit: the evaluator reports it as such
        raise
    except Exception as exc:
        raise EnvFailure(f"env {spec.env_id!r} raised in make: {type(exc).__name__}: {exc}") from None
    returns: list[float] = []
    episodes: list[dict[str, np.ndarray]] = []
    who = f"env {spec.env_id!r}"
    try:
        for k, state in enumerate(states):
            stage = "reset"
            obs = _reset(spec, env, k, state)
            refuse_non_finite(who, "obs", obs, 0, k)
            o, a, r, n, d = [], [], [], [], []
            total, action = 0.0, None
            stage = "step"
            for t in range(spec.steps):
                action = spec.policy.act(params, obs.astype(np.float64)).astype(np.float32)
                next_obs, reward, terminated, truncated, _ = _returned(
                    spec, "step", env.step(action), "(obs, reward, terminated, truncated, info)", 5
                )
                try:
                    refuse_non_finite(who, "reward", float(reward), t, k)
                except EnvFailure:  # a NaN action, or an earlier NaN obs, may be its cause: named first
                    _refuse_non_finite_steps(spec.env_id, [*a, action], n, k)
                    raise
                next_obs = np.asarray(next_obs, dtype=np.float32)
                o.append(obs)
                a.append(action)
                r.append(float(reward))
                n.append(next_obs)
                d.append(bool(terminated))
                total += float(reward)
                obs = next_obs
                if terminated or truncated:
                    break
            _refuse_non_finite_steps(spec.env_id, a, n, k)
            if not math.isfinite(
                total
            ):  # rewards within float32 cannot overflow a float64 sum: a last guard, kept cheap
                raise EnvFailure(f"env {spec.env_id!r} gave episode {k} a non-finite return ({total})")
            returns.append(total)
            episodes.append(
                {
                    "obs": np.asarray(o, dtype=np.float32),
                    "action": np.asarray(a, dtype=np.float32).reshape(-1, spec.policy.act_dim),
                    "reward": np.asarray(r, dtype=np.float32),
                    "next_obs": np.asarray(n, dtype=np.float32),
                    "done": np.asarray(d, dtype=bool),
                }
            )
    except (MemoryError, EnvFailure):
        raise
    except Exception as exc:
        if stage == "step":  # a simulator may raise on a NaN it was given: name where the NaN began
            _refuse_non_finite_steps(spec.env_id, a if action is None else [*a, action], n, k)
        raise EnvFailure(f"env {spec.env_id!r} raised in {stage}: {type(exc).__name__}: {exc}") from None
    finally:
        env.close()
    return {"returns": returns, "episodes": episodes}

"""Real episodes of any policy function, in this process (torch-free).

ARS's linear policy clips its raw actions to the box instead of squashing
them with tanh, and SAC's policy is a torch network: neither is a
`PolicySpec` the project's workers run, so their episodes run here. Start
states mean what they mean in the workers (``agents.tasks.episodes``): a
reset seed, or a row the task's ``set_state`` sets after ``reset(seed=k)``
with ``k`` the state's place in the list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from infrastructure.trajectory import first_non_finite

from agents.tasks import EnvFailure, EpisodeSpec
from agents.tasks.episodes import refuse_non_finite

if TYPE_CHECKING:
    import gymnasium as gym

PolicyFn = Callable[[np.ndarray], np.ndarray]  # observations (n, obs_dim) -> actions (n, act_dim)


@dataclass(frozen=True)
class Episode:
    ret: float
    steps: int
    observations: np.ndarray  # (steps, obs_dim): the observations the policy acted on


class EpisodeRunner:
    """Envs of ``spec``'s task, opened once and reused: one for a single
    episode, one per start state for an evaluation, whose episodes step in
    lockstep so the policy is called once per time step for all of them."""

    def __init__(self, spec: EpisodeSpec) -> None:
        self.spec = spec
        self._envs: list["gym.Env"] = []

    def _env(self, i: int) -> "gym.Env":
        while len(self._envs) <= i:
            try:
                self._envs.append(self.spec.make_env())
            except Exception as exc:
                raise EnvFailure(f"env {self.spec.env_id!r} raised in make: {type(exc).__name__}: {exc}") from None
        return self._envs[i]

    def _reset(self, env: "gym.Env", k: int, state: Sequence[float]) -> np.ndarray:
        if self.spec.set_state is not None:
            env.reset(seed=k)
            return np.asarray(self.spec.set_state(env, state), dtype=np.float64)
        obs, _ = env.reset(seed=int(state[0]))
        return np.asarray(obs, dtype=np.float64)

    def episode(self, policy: PolicyFn, state: Sequence[float], k: int = 0) -> Episode:
        """One episode from ``state`` (``k``: the reset seed of a task with exact states)."""
        return self._run(policy, [state], first=k)[0]

    def evaluate(self, policy: PolicyFn, states: Sequence[Sequence[float]]) -> list[Episode]:
        """One episode per start state, ``k`` counting from 0 as one worker call does."""
        return self._run(policy, states)

    def _run(self, policy: PolicyFn, states: Sequence[Sequence[float]], first: int = 0) -> list[Episode]:
        n, act_dim = len(states), self.spec.policy.act_dim
        who, by_policy = f"env {self.spec.env_id!r}", f"the policy on env {self.spec.env_id!r}"
        envs = [self._env(i) for i in range(n)]
        obs = np.stack([self._reset(env, first + k, state) for k, (env, state) in enumerate(zip(envs, states))])
        # the workers' float32 checks (agents.tasks.episodes), on the whole lockstep batch:
        # one vectorised test a time step, not one per env
        self._refuse(who, "obs", obs, list(range(n)), 0, first)
        seen: list[list[np.ndarray]] = [[] for _ in range(n)]
        totals, running = np.zeros(n), list(range(n))
        for t in range(self.spec.steps):
            actions = np.asarray(policy(obs[running]), dtype=np.float32).reshape(len(running), act_dim)
            self._refuse(by_policy, "action", actions, running, t, first)
            still = []
            for i, action in zip(running, actions):
                seen[i].append(obs[i].copy())
                next_obs, reward, terminated, truncated, _ = envs[i].step(action)
                refuse_non_finite(who, "reward", float(reward), t, first + i)
                totals[i] += float(reward)
                obs[i] = np.asarray(next_obs, dtype=np.float64)
                if not (terminated or truncated):
                    still.append(i)
            self._refuse(who, "next_obs", obs[running], running, t, first)
            running = still
            if not running:
                break
        return [
            Episode(float(totals[i]), len(seen[i]), np.asarray(seen[i]).reshape(len(seen[i]), -1)) for i in range(n)
        ]

    @staticmethod
    def _refuse(who: str, field: str, rows: np.ndarray, envs: list[int], step: int, first: int) -> None:
        """`refuse_non_finite` for the first of ``rows`` (one per env in ``envs``) holding NaN or inf as float32."""
        bad = first_non_finite(rows)
        if bad is not None:
            refuse_non_finite(who, field, rows[bad], step, first + envs[bad])

    def close(self) -> None:
        envs, self._envs = self._envs, []
        for env in envs:
            env.close()

    def __enter__(self) -> "EpisodeRunner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def mean_return(episodes: Sequence[Episode]) -> float:
    return float(np.mean([e.ret for e in episodes])) if episodes else float("-inf")

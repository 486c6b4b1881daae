"""A task for the evolution loop: the environment, the policy family, the
start states, the target, the episode length, and what is known of its
structure (an observation projection, a termination function).

`Task` is what a user writes; `Task.resolve` opens the
environment once, checks its spaces and fills in what the env spec knows
(target, episode length, observation scale), giving a `ResolvedTask`
the loop, the baselines and the evaluator all take. Torch-free: the
callables a task holds are called by the torch side only when it imagines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

import numpy as np

from genesis_fp16.base.seeds import numpy_rng, stream_seed

from .episodes import EpisodeSpec, SetStateFn
from .policies import PolicySpec, parse_policy

if TYPE_CHECKING:
    import gymnasium as gym
    import torch

ProjectFn = Callable[["torch.Tensor"], "torch.Tensor"]  # imagined observations back onto what the env can produce
TerminationFn = Callable[["torch.Tensor"], "torch.Tensor"]  # observations (..., obs_dim) -> bool (...)
DEFAULT_EPISODE_STEPS = 1000
DEFAULT_REFINE_STEPS = 800
"""The loop's actor-gradient steps a generation (`Task.refine_steps`) on a task that does not set its own."""
DEFAULT_DISCOUNT = 0.99
"""The learners' discount (`Task.discount`) on a task that does not set its own: TD3's, SAC's, CEM-RL's."""
DEFAULT_SIGMA0 = 0.5
"""CMA-ES's initial step size in normalised coordinates (`Task.sigma0`) on a task that does not set its own."""


RESET_STRIDE = 1_000_000
"""The reset seeds of one run's start states lie in one block of this many (`reset_seed_base`)."""
HELDOUT_OFFSET = 500_000
"""The held-out start states' reset seeds begin this far above a run's `reset_seed_base` (validation: 300,000)."""
HELDOUT_END = 800_000
"""The held-out range of reset seeds ends this far above `reset_seed_base` (`Task.heldout_states`: at most 300,000)."""
RESET_BLOCKS = 2**32
"""Blocks a run's seed picks its block among: the largest reset seed, about ``RESET_STRIDE * (RESET_BLOCKS + 1)``, is
under 2^53, exact in the float64 rows a start state is."""


def reset_seed_base(seed: int) -> int:
    """The first reset seed of the block of a run seeded ``seed``: ``RESET_STRIDE``
    times a block (1 to `RESET_BLOCKS`) from the stream ``task.reset_seeds``
    (`genesis_fp16.base.seeds`). The run's training, validation, held-out and
    model-only states are disjoint ranges inside the block (`ResolvedTask.start_states`)."""
    return RESET_STRIDE * (1 + stream_seed(seed, "task.reset_seeds") % RESET_BLOCKS)


def is_step_size(value: object) -> bool:
    """Whether ``value`` is a step size CMA-ES takes: a finite number (not a bool) above 0."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def is_discount(value: object) -> bool:
    """Whether ``value`` is a discount the learners take: a number (not a bool) in [0, 1)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value < 1.0


class TaskError(ValueError):
    """A task that cannot run: the message says what is wrong and what to do."""


@dataclass(frozen=True)
class StartStates:
    """A run's start states, three disjoint sets: ``train`` (the search and
    the target test), ``validation`` (confirms a target met on ``train``
    before the run stops) and ``heldout`` (only the final report)."""

    train: np.ndarray  # (n_train, k): one row per start state
    heldout: np.ndarray  # (n_heldout, k)
    validation: np.ndarray  # (n_validation, k)


@dataclass(frozen=True)
class ExactStates:
    """Start states a task sets itself instead of ``reset(seed=k)``.
    ``split(seed)`` gives the train, held-out and validation states; ``set_state(env, row)``
    sets one after a reset and returns its observation (runs in workers: a
    module-level function); ``observe(rows)`` gives observations without an
    env and ``extra(rng, n)`` draws states only the model sees."""

    split: Callable[[int], StartStates]
    set_state: SetStateFn
    observe: Callable[[np.ndarray], np.ndarray]
    extra: Callable[[np.random.Generator, int], np.ndarray]


@dataclass(frozen=True)
class Task:
    """What to evolve. ``env_id`` is a gymnasium id, or the name of the env
    ``env_factory`` makes (a module-level callable: worker processes import it).
    Left ``None``, ``target`` is the env spec's ``reward_threshold`` and
    ``episode_steps`` its ``max_episode_steps``. ``terminates=False`` says the
    env only ends on time; otherwise the world model learns termination, unless
    ``termination`` gives it."""

    env_id: str
    target: Optional[float] = None
    policy: str = "linear"
    episode_steps: Optional[int] = None
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    env_factory: Optional[Callable[[], "gym.Env"]] = None
    n_train: int = 16
    n_heldout: int = 20
    n_validation: int = 8
    exact_states: Optional[ExactStates] = None
    obs_scale: Optional[tuple[float, ...]] = None
    project: Optional[ProjectFn] = None
    termination: Optional[TerminationFn] = None
    terminates: bool = True
    description: str = ""
    refine_steps: Optional[int] = None
    """The loop's actor-gradient steps a generation on this task (`agents.evolve_config.EvolveConfig.refine_steps`),
    where a measurement chose other than the loop's default (`DEFAULT_REFINE_STEPS`); None: the default."""
    discount: Optional[float] = None
    """The learners' discount on this task: the critic's TD target and the actor's objective
    (`agents.evolve_config.EvolveConfig.discount`), where a measurement chose other than `DEFAULT_DISCOUNT`; None: the
    default."""
    sigma0: Optional[float] = None
    """CMA-ES's initial step size on this task, in normalised coordinates (`agents.evolve_config.EvolveConfig.sigma0`),
    where a measurement chose other than `DEFAULT_SIGMA0`; None: the default. The loop and its floor start alike."""

    def make_env(self) -> "gym.Env":
        """The env, in this process; TaskError when it cannot be made."""
        import gymnasium as gym

        try:
            return (
                self.env_factory() if self.env_factory is not None else gym.make(self.env_id, **dict(self.env_kwargs))
            )
        except gym.error.Error as exc:  # unknown id, missing dependency (e.g. mujoco)
            raise TaskError(
                f"env {self.env_id!r} cannot be made ({type(exc).__name__}: {exc}); expected a gymnasium id such as "
                "'InvertedPendulum-v5' (genesis-fp16 evolve --list-tasks lists the built-in tasks)"
            ) from None
        except Exception as exc:  # bad kwargs, or the factory itself failed
            raise TaskError(f"env {self.env_id!r} raised when made: {type(exc).__name__}: {exc}") from None

    def resolve(
        self, *, target: Optional[float] = None, policy: Optional[str] = None, episode_steps: Optional[int] = None
    ) -> "ResolvedTask":
        """Open the env once and check it; arguments override the task's own."""
        import gymnasium as gym

        try:
            hidden = parse_policy(policy or self.policy)
        except ValueError as exc:
            raise TaskError(str(exc)) from None
        steps = self.refine_steps
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
            raise TaskError(
                f"env {self.env_id!r}: refine_steps={steps!r}: expected a whole number >= 1 (the loop's actor-gradient "
                f"steps a generation), or None for the loop's {DEFAULT_REFINE_STEPS}"
            )
        gamma = self.discount
        if gamma is not None and not is_discount(gamma):
            raise TaskError(
                f"env {self.env_id!r}: discount={gamma!r}: expected a number in [0, 1) (the learners' discount per "
                f"step), or None for the loop's {DEFAULT_DISCOUNT}"
            )
        if self.sigma0 is not None and not is_step_size(self.sigma0):
            raise TaskError(
                f"env {self.env_id!r}: sigma0={self.sigma0!r}: expected a finite number > 0 (CMA-ES's initial step "
                f"size), or None for the loop's {DEFAULT_SIGMA0}"
            )
        env = self.make_env()
        try:
            obs_space, act_space, spec = env.observation_space, env.action_space, env.spec
        finally:
            env.close()
        for role, space in (("observation", obs_space), ("action", act_space)):
            if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
                kind = (
                    "an image"
                    if isinstance(space, gym.spaces.Box) and len(space.shape) >= 2
                    else f"a {type(space).__name__} space"
                )
                raise TaskError(
                    f"env {self.env_id!r}: its {role} space {space} is {kind}; expected a flat Box (a vector of "
                    "floats): "
                    "the loop's policies map an observation vector to an action vector. Pick a continuous-control "
                    "task, "
                    "or wrap the env (e.g. gymnasium.wrappers.FlattenObservation)"
                )
        if not (np.isfinite(act_space.low).all() and np.isfinite(act_space.high).all()):
            raise TaskError(
                f"env {self.env_id!r}: action space {act_space} is unbounded; expected finite bounds (actions are "
                "tanh-scaled into them)"
            )
        resolved_target = (
            target
            if target is not None
            else self.target
            if self.target is not None
            else (spec.reward_threshold if spec else None)
        )
        if resolved_target is None:
            raise TaskError(
                f"env {self.env_id!r} has no target: neither the task nor its env spec (reward_threshold) gives one; "
                "pass --target R (the mean return over the training start states that counts as solved)"
            )
        if not math.isfinite(resolved_target):
            raise TaskError(
                f"env {self.env_id!r}: target {resolved_target}: expected a finite number (the mean return over the "
                "training "
                "start states that counts as solved); pass --target R"
            )
        steps = (
            episode_steps
            or self.episode_steps
            or (spec.max_episode_steps if spec and spec.max_episode_steps else DEFAULT_EPISODE_STEPS)
        )
        obs_low, obs_high = np.asarray(obs_space.low, dtype=np.float64), np.asarray(obs_space.high, dtype=np.float64)
        policy_spec = PolicySpec(
            obs_dim=int(obs_space.shape[0]),
            act_dim=int(act_space.shape[0]),
            hidden=hidden,
            obs_scale=self.obs_scale or default_obs_scale(obs_low, obs_high),
            action_low=tuple(float(v) for v in act_space.low),
            action_high=tuple(float(v) for v in act_space.high),
        )
        return ResolvedTask(
            task=self,
            target=float(resolved_target),
            episode_steps=int(steps),
            policy=policy_spec,
            obs_low=tuple(float(v) for v in obs_low),
            obs_high=tuple(float(v) for v in obs_high),
        )


def default_obs_scale(low: np.ndarray, high: np.ndarray) -> tuple[float, ...]:
    """1 / the largest magnitude an observation can take where its bounds are finite, else 1."""
    bound = np.maximum(np.abs(low), np.abs(high))
    ok = np.isfinite(bound) & (bound > 0)
    return tuple(float(1.0 / b) if k else 1.0 for b, k in zip(bound, ok))


@dataclass(frozen=True)
class ResolvedTask:
    """A checked task with everything filled in (see `Task.resolve`)."""

    task: Task
    target: float
    episode_steps: int
    policy: PolicySpec
    obs_low: tuple[float, ...]
    obs_high: tuple[float, ...]

    @property
    def env_id(self) -> str:
        return self.task.env_id

    @property
    def n_params(self) -> int:
        return self.policy.n_params

    @property
    def learns_termination(self) -> bool:
        """Whether the world model needs a done head: the env may terminate and the task gives no function for it."""
        return self.task.terminates and self.task.termination is None

    @property
    def episode_spec(self) -> EpisodeSpec:
        exact = self.task.exact_states
        return EpisodeSpec(
            env_id=self.env_id,
            policy=self.policy,
            steps=self.episode_steps,
            env_kwargs=dict(self.task.env_kwargs),
            env_factory=self.task.env_factory,
            set_state=exact.set_state if exact is not None else None,
        )

    def start_states(self, seed: int) -> StartStates:
        """Train, held-out and validation start states; by default disjoint
        ranges of reset seeds (train from `reset_seed_base`, validation
        300,000 and held-out 500,000 above it)."""
        if self.task.exact_states is not None:
            return self.task.exact_states.split(seed)
        base = reset_seed_base(seed)
        train = np.arange(self.task.n_train, dtype=np.float64) + base
        heldout = np.arange(self.task.n_heldout, dtype=np.float64) + base + HELDOUT_OFFSET
        validation = np.arange(self.task.n_validation, dtype=np.float64) + base + 300_000
        return StartStates(train=train[:, None], heldout=heldout[:, None], validation=validation[:, None])

    def heldout_states(self, seed: int, n: int) -> np.ndarray:
        """``n`` held-out start states of a run seeded ``seed``: its own held-out
        states (`start_states`) first, then, past their number, more of their
        kind that no run of ``seed`` uses: the next reset seeds of the held-out
        range (at most 300,000 in all), or, for a task with exact states, states
        drawn by its ``extra`` from the stream ``task.more_heldout_starts``.
        ``genesis-fp16 eval`` runs a policy on these."""
        own = self.start_states(seed).heldout
        if n <= len(own):
            return own[:n]
        exact = self.task.exact_states
        if exact is not None:
            more = np.asarray(exact.extra(numpy_rng(seed, "task.more_heldout_starts"), n - len(own)), dtype=np.float64)
            return np.concatenate([own, more.reshape(n - len(own), -1)])
        if n > HELDOUT_END - HELDOUT_OFFSET:
            raise TaskError(f"{n} held-out start states: expected at most {HELDOUT_END - HELDOUT_OFFSET}")
        seeds = np.arange(len(own), n, dtype=np.float64) + reset_seed_base(seed) + HELDOUT_OFFSET
        return np.concatenate([own, seeds[:, None]])

    def reset_observations(self, seeds: Sequence[int]) -> np.ndarray:
        """Observations after ``reset(seed=s)`` for each seed (no steps: no real episode spent)."""
        env = self.task.make_env()
        try:
            return np.stack([np.asarray(env.reset(seed=int(s))[0], dtype=np.float32) for s in seeds])
        except Exception as exc:
            raise TaskError(f"env {self.env_id!r} raised in reset: {type(exc).__name__}: {exc}") from None
        finally:
            env.close()

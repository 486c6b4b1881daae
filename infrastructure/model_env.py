"""Short model rollouts branched from real states (MBPO, Janner et al. 2019),
behind a step API like mbrl-lib's ``ModelEnv``.

Why short and branched: a learned model's errors compound over an open loop
(``scripts/model_error_growth.py`` measures how fast, per task), so a whole
episode imagined from a reset state ranks policies by the model's drift more
than by their worth. The world model is asked instead for k-step rollouts
that start from states the real environment visited; their transitions
(`infrastructure.transitions.Transitions`) train a critic beside the real
ones, and k stays where the model is still accurate.

* `ModelEnv` steps N rows at once: ``reset(obs)``, then ``step(action)``.
  Each step runs every elite member on every live row in one batched
  forward; each row takes the prediction of one elite drawn at random at
  that step (MBPO's TS1) and, with a Gaussian head, samples it. The draws
  come from a generator on the CPU seeded once, drawn for all N rows at
  every step: the same seed gives the same rollout on every device, whichever
  rows are still alive.
* Rewards are clipped into the range seen in the training data (the
  ensemble's ``reward_low`` / ``reward_high``): a model off its data cannot
  hand the critic a reward no real transition had.
* Pessimism: the elites' disagreement on a row (the standard deviation over
  the members of their predicted mean deltas, in units of the data's delta
  standard deviation, averaged over the dimensions; `disagreement`) above
  ``max_disagreement`` ends the row, as a prediction that is not finite
  does: its transition at that step is not returned, nor any later one. The
  members are compared on the row's own state; particles are not (they
  drift apart by their sampled noise alone, inside the data as much as
  outside). A single network has no disagreement and is never cut by it.
* Termination: ``terminated(next_obs)`` where the task gives it, else the
  chosen member's done head (probability above one half), else never. A row
  that terminated returns that transition with ``terminal`` set and is not
  stepped further.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass
from typing import Callable, NamedTuple, Optional, Protocol, Union

import numpy as np
import numpy.typing as npt
import torch

from genesis_fp16.base.seeds import torch_generator

from .dynamics import NotTrainedError, ProjectFn, TerminationFn, features
from .ensemble import EnsembleDynamics, run_layers
from .transitions import Transitions


class Trained(Protocol):
    """What a `ModelEnv` reads of a `WorldModel`: its ensemble, and whether it has been trained."""

    model: EnsembleDynamics
    trained: bool


RolloutPolicy = Callable[[torch.Tensor], torch.Tensor]
"""``policy(obs (N, obs_dim)) -> actions (N, act_dim)``, tensors on the model's device."""

DEFAULT_MAX_DISAGREEMENT = 1.0
"""End a row where the elites' predicted deltas for its state spread by more
than one standard deviation of the deltas in the training data. Measured for
the long imagination this module replaced (``scripts/bench_world_model.py
--disagreement``; a 5 x 128 x 2 ensemble on 16 random-policy episodes): at
1.0, 0% of rollouts from the data's start states were cut on Pendulum-v1,
InvertedPendulum-v5, MountainCarContinuous-v0 and HalfCheetah-v5, 7-11% on
Swimmer-v5, against 100% of those started 8 standard deviations outside
the data on Swimmer and HalfCheetah; at 0.5, 68-80% of Swimmer's
in-distribution rollouts were cut, at 2.0 none of the off-distribution ones.
Measured again for 10-step branched rollouts (``--disagreement
Pendulum-v1,InvertedPendulum-v5,Swimmer-v5 --rollout-horizon 10``, 8 real
states of each of the 16 episodes): at 1.0, no row from real states was cut,
for the data's policies or unseen ones, on any of the three; from states 8
standard deviations out, 100% on Swimmer, 41% on Pendulum and none on
InvertedPendulum (where the projection into the observation box brings them
back); at 0.5, 9% of Swimmer's unseen-policy rows were cut from real states."""


def disagreement(mean: torch.Tensor, obs_dim: int) -> torch.Tensor:
    """The members' disagreement per row, ``(L,)``, from their normalised
    predicted means ``(M, L, n_out)``: the standard deviation over the members
    of the first ``obs_dim`` outputs (the deltas, already in units of the
    data's delta standard deviation), averaged over those dimensions. NaN
    where a member's prediction is not finite."""
    return mean[..., :obs_dim].std(0, correction=0).mean(-1)


def _check_limit(value: Optional[float]) -> float:
    limit = DEFAULT_MAX_DISAGREEMENT if value is None else value
    if isinstance(limit, bool) or not isinstance(limit, numbers.Real) or not limit > 0:  # NaN fails too
        raise ValueError(f"ModelEnv: max_disagreement={value!r}: expected a number > 0 (inf: never cut a row)")
    return float(limit)


def _ensemble_of(source: Union[Trained, EnsembleDynamics]) -> EnsembleDynamics:
    """The trained ensemble of a `WorldModel` or the ensemble itself; `NotTrainedError` before training."""
    if isinstance(source, EnsembleDynamics):
        if not bool(torch.isfinite(source.member_val_loss).any()):
            raise NotTrainedError(
                "ModelEnv: no member of this ensemble has a finite validation loss: it was never trained (or every "
                "member "
                "diverged); train it with `await WorldModel.train()` or load a checkpoint first"
            )
        return source
    if not source.trained:
        raise NotTrainedError(
            "ModelEnv: the WorldModel is not trained: call `await train()` (or load a checkpoint) first"
        )
    return source.model


def _rows(bad: list[int], limit: int = 8) -> str:
    """Row indices as a message names them: the first ``limit``, then how many more."""
    return ", ".join(str(i) for i in bad[:limit]) + (f" and {len(bad) - limit} more" if len(bad) > limit else "")


class ModelEnv:
    """N imagined rows stepped together in a trained world model (see the module's docstring).

    Args:
        model: a trained `WorldModel`, or its `EnsembleDynamics` (the device
            is where its weights are); `NotTrainedError` before training.
        terminated: the task's termination rule, ``obs (L, obs_dim) -> bool
            (L,)``; left out, the model's done head where it has one, else never.
        project: ``obs -> obs``, maps predicted observations back into what
            the env can produce (e.g. clamps into the observation box).
        seed: seeds the CPU generator of the member draws and the Gaussian
            noise (its stream ``model_env``, `genesis_fp16.base.seeds`), once:
            successive rollouts of one `ModelEnv` draw afresh.
        max_disagreement: the disagreement that ends a row (default
            `DEFAULT_MAX_DISAGREEMENT`; ``inf``: never).

    A rollout uses the weights as they are at `reset`; run it while the model
    does not train (`WorldModel.rollouts` takes the model's lock for that).
    """

    def __init__(
        self,
        model: Union[Trained, EnsembleDynamics],
        *,
        terminated: Optional[TerminationFn] = None,
        project: Optional[ProjectFn] = None,
        seed: int = 0,
        max_disagreement: Optional[float] = None,
    ) -> None:
        self.model = _ensemble_of(model)
        self.device = self.model.x_mean.device
        self.terminated, self.project = terminated, project
        self.max_disagreement = _check_limit(max_disagreement)
        self.generator = torch_generator(int(seed), "model_env")
        self._obs: Optional[torch.Tensor] = None

    @property
    def obs(self) -> torch.Tensor:
        """The rows' current observations ``(N, obs_dim)`` (a row that ended keeps its last)."""
        return self._state()[0]

    @property
    def running(self) -> torch.Tensor:
        """``(N,)`` bool: the rows the next `step` advances (not terminated, not cut)."""
        return self._state()[1]

    def _state(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._obs is None:
            raise RuntimeError("ModelEnv: call reset(start_obs) before stepping")
        return self._obs, self._running

    def reset(self, obs: npt.ArrayLike) -> torch.Tensor:
        """Start N rows at ``obs (N, obs_dim)`` (real states); returns them as
        a float32 tensor on the model's device. Raises `ValueError` for
        another shape or for rows that are not finite (naming them)."""
        start = (
            obs.detach().float()
            if isinstance(obs, torch.Tensor)
            else torch.as_tensor(np.asarray(obs), dtype=torch.float32)
        )
        d = self.model.obs_dim
        if start.ndim != 2 or start.shape[1] != d or len(start) == 0:
            raise ValueError(
                f"ModelEnv.reset: start states of shape {tuple(start.shape)}: expected (N, {d}) with N >= 1, "
                "real observations of the environment this model was trained on"
            )
        bad = ~torch.isfinite(start).all(1)
        if bad.any():
            raise ValueError(
                f"ModelEnv.reset: start states {_rows(bad.nonzero().flatten().tolist())} are not finite (NaN or inf): "
                "pass real, finite observations"
            )
        self._obs = start.to(self.device, copy=True)
        n = len(start)
        self._running = torch.ones(n, dtype=torch.bool, device=self.device)
        self.cut = torch.zeros(
            n, dtype=torch.bool, device=self.device
        )  # ended by disagreement or a non-finite prediction
        self.ended = torch.zeros(n, dtype=torch.bool, device=self.device)  # ended by the termination rule
        self.lengths = torch.zeros(n, dtype=torch.long, device=self.device)  # the transitions each row has returned
        with torch.no_grad():
            self._weights = [
                (w.detach().clone(), b.detach().clone()) for w, b in self.model.layer_weights(self.model.elite_index)
            ]
        return self._obs.clone()

    def _action(self, action: npt.ArrayLike) -> torch.Tensor:
        n, a = len(self._state()[0]), self.model.act_dim
        act = (
            action.detach().float()
            if isinstance(action, torch.Tensor)
            else torch.as_tensor(np.asarray(action), dtype=torch.float32)
        )
        if act.shape != (n, a):
            raise ValueError(
                f"ModelEnv.step: actions of shape {tuple(act.shape)}: expected ({n}, {a}), one row per start state"
            )
        return act.to(self.device)

    def step(self, action: npt.ArrayLike) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Advance the running rows by ``action (N, act_dim)``; returns
        ``(next_obs (N, obs_dim), reward (N,), terminal (N,) bool, alive (N,)
        bool)`` on the model's device. ``alive`` marks the rows whose
        transition at this step is real model output: a row that had ended
        before, or that is cut now, has ``alive`` False (its ``next_obs`` is
        its last observation, its reward 0). Non-finite actions of running
        rows raise `ValueError`; the actions of ended rows are not read."""
        obs, running = self._state()
        act = self._action(action)
        model, n, d = self.model, len(obs), self.model.obs_dim
        n_m, n_g = len(self._weights[0][0]), model.n_gauss
        # drawn for every row at every step: the same seed, the same draws, whichever rows are alive
        member = torch.randint(n_m, (n,), generator=self.generator)
        noise = torch.randn(n, n_g, generator=self.generator) if model.probabilistic else None
        next_obs, reward = obs.clone(), torch.zeros(n, device=self.device)
        terminal, alive = (
            torch.zeros(n, dtype=torch.bool, device=self.device),
            torch.zeros(n, dtype=torch.bool, device=self.device),
        )
        live = running.nonzero().flatten()
        if len(live):
            o, a = obs[live], act[live]
            bad = ~torch.isfinite(a).all(1)
            if bad.any():
                raise ValueError(
                    f"ModelEnv.step: the actions of rows {_rows(live[bad].tolist())} are not finite: "
                    "the policy returned NaN or inf"
                )
            with torch.no_grad():
                x = model.normalise_x(features(o, a)).unsqueeze(0).expand(n_m, -1, -1)
                mean, logvar, done = model.heads(run_layers(x, self._weights))
                pick, rows = member[live.cpu()].to(self.device), torch.arange(len(live), device=self.device)
                y = mean[pick, rows]
                if logvar is not None:
                    y = y + noise[live.cpu()].to(self.device) * torch.exp(0.5 * logvar[pick, rows])
                y = y * model.y_std[:n_g].float() + model.y_mean[:n_g].float()
                nxt = o + y[:, :d]
                if self.project is not None:
                    nxt = self.project(nxt)
                ok = torch.isfinite(nxt).all(1) & torch.isfinite(y[:, d])
                if n_m > 1 and math.isfinite(self.max_disagreement):  # NaN disagreement ends the row too
                    ok &= disagreement(mean, d) <= self.max_disagreement
                ends = self._ends(nxt, None if done is None else done[pick, rows]) & ok
                next_obs[live] = torch.where(ok[:, None], nxt, o)
                reward[live] = torch.where(ok, y[:, d].clamp(model.reward_low.float(), model.reward_high.float()), 0.0)
                terminal[live], alive[live] = ends, ok
                self.cut[live] |= ~ok
        self._obs, self._running = next_obs, alive & ~terminal
        self.ended |= terminal
        self.lengths += alive.long()
        return next_obs.clone(), reward, terminal, alive

    def _ends(self, next_obs: torch.Tensor, done_logit: Optional[torch.Tensor]) -> torch.Tensor:
        if self.terminated is not None:
            ends = torch.as_tensor(self.terminated(next_obs), device=self.device)
            if ends.shape != (len(next_obs),):
                raise ValueError(
                    f"ModelEnv: terminated(obs) returned shape {tuple(ends.shape)}: expected ({len(next_obs)},), one "
                    "flag per row"
                )
            return ends.bool()
        if done_logit is not None:
            return done_logit > 0.0
        return torch.zeros(len(next_obs), dtype=torch.bool, device=self.device)


@dataclass(frozen=True)
class RolloutStats:
    """What one `branched_rollouts` call produced."""

    rows: int
    """Start states (one row each)."""
    horizon: int
    """The most steps a row could take."""
    transitions: int
    """Transitions returned: the alive steps of every row."""
    cut: int
    """Rows ended by disagreement (or a non-finite prediction)."""
    terminated: int
    """Rows ended by the termination rule."""

    @property
    def cut_share(self) -> float:
        """The share of rows cut by disagreement."""
        return self.cut / self.rows

    @property
    def mean_length(self) -> float:
        """Transitions per row."""
        return self.transitions / self.rows

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "cut_share": self.cut_share, "mean_length": self.mean_length}


class Rollouts(NamedTuple):
    """`branched_rollouts`'s result: the transitions for the critic and what produced them."""

    transitions: Transitions
    stats: RolloutStats


def branched_rollouts(
    source: Union[ModelEnv, Trained, EnsembleDynamics],
    policy: RolloutPolicy,
    start_obs: npt.ArrayLike,
    horizon: int,
    *,
    terminated: Optional[TerminationFn] = None,
    project: Optional[ProjectFn] = None,
    seed: Optional[int] = None,
    max_disagreement: Optional[float] = None,
) -> Rollouts:
    """MBPO's model rollout: from N real ``start_obs (N, obs_dim)``, up to
    ``horizon`` steps of ``policy(obs (N, obs_dim)) -> actions (N, act_dim)``
    (called under ``torch.no_grad`` with every row, tensors on the model's
    device; row i stays row i, an ended row showing its last observation, and
    only the running rows' actions are read), every transition of every alive row collected into one
    `Transitions` on that device (``terminal`` 1.0 where the termination rule
    ended the row; a row cut by disagreement contributes the steps before the
    cut). ``source`` is a `ModelEnv`, or a trained model from which one is
    built with ``terminated``, ``project``, ``seed`` (default 0) and
    ``max_disagreement`` (see `ModelEnv`); a `ModelEnv` carries its own."""
    if isinstance(horizon, bool) or not isinstance(horizon, numbers.Integral) or horizon < 1:
        raise ValueError(f"branched_rollouts: horizon={horizon!r}: expected at least 1 step")
    if isinstance(source, ModelEnv):
        given = [
            k
            for k, v in {
                "terminated": terminated,
                "project": project,
                "seed": seed,
                "max_disagreement": max_disagreement,
            }.items()
            if v is not None
        ]
        if given:
            raise ValueError(
                f"branched_rollouts: {', '.join(given)} given with a ModelEnv, which has its own: set them on the "
                "ModelEnv"
            )
        env = source
    else:
        env = ModelEnv(
            source,
            terminated=terminated,
            project=project,
            seed=0 if seed is None else seed,
            max_disagreement=max_disagreement,
        )
    obs = env.reset(start_obs)
    n, parts = len(obs), []
    act_dim = env.model.act_dim
    for _ in range(int(horizon)):
        if not env.running.any():
            break
        with torch.no_grad():
            action = torch.as_tensor(policy(obs), dtype=torch.float32, device=env.device)
        if action.shape != (n, act_dim):
            raise ValueError(
                f"branched_rollouts: policy returned shape {tuple(action.shape)} for {n} observations: expected ({n}, "
                f"{act_dim})"
            )
        next_obs, reward, terminal, alive = env.step(action)
        parts.append(Transitions(obs[alive], action[alive], reward[alive], next_obs[alive], terminal[alive].float()))
        obs = next_obs
    stats = RolloutStats(
        rows=n,
        horizon=int(horizon),
        transitions=int(env.lengths.sum()),
        cut=int(env.cut.sum()),
        terminated=int(env.ended.sum()),
    )
    kept = [p for p in parts if len(p)]
    if not kept:
        empty = torch.empty(0, env.model.obs_dim, device=env.device)
        return Rollouts(
            Transitions(
                empty,
                torch.empty(0, act_dim, device=env.device),
                torch.empty(0, device=env.device),
                empty.clone(),
                torch.empty(0, device=env.device),
            ),
            stats,
        )
    return Rollouts(Transitions.cat(kept), stats)

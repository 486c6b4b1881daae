"""Imagination that knows what it does not know: candidate policies rolled
out inside an `EnsembleDynamics`, scored by what the model is sure of.

* Trajectory sampling (PETS's TS-inf): K particles per (candidate, start
  state); particle k follows elite member ``k % M`` (M = min(K, elites)) for
  the whole rollout, and its next state and reward are drawn from that
  member's Gaussian. The noise comes from a generator seeded by ``seed`` on
  the model's device, and is the same for every candidate (common random
  numbers: candidates are compared on the same draws, and a candidate's
  result does not depend on which others are imagined beside it). One
  batched ensemble forward per time step serves all candidates x starts x
  particles (rows arranged as ``[M, rows / M, in]``).
* Rewards are clipped into the range seen in the training data, so an
  imagined return never exceeds ``horizon`` times the largest reward seen.
* Disagreement: per (candidate, start) and step, every member used predicts
  the next-observation delta of the same state (the rollout's first particle
  still alive; those rows ride in the same batched forward), and the spread
  of their means (standard deviation over the members, over the
  normaliser's delta standard deviation, averaged over the dimensions) is
  the members' disagreement there. Where it passes ``max_disagreement`` the
  model is off its data: the rollout is truncated and adds no more reward
  from the model. Where the rollout can terminate, its remaining steps are
  valued at the lowest reward seen per step, or 0 where that is higher
  (ending the episode is then the worse case), as MOPO penalises
  uncertainty. Where it cannot (the episode runs its length), each remaining
  step is valued at the rollout's own mean value per step until then, but
  never above the data's mean reward per step; truncated at the first step,
  or after a non-finite value, at the lowest reward seen: valuing every
  remaining step at the lowest reward made long horizons' imagined returns
  meaningless without changing the ranking (measured by
  ``scripts/imagination_ranking.py``; the figures are in docs/EVOLUTION.md).
  The share truncated is reported. The members are compared on one state
  rather than the particles on theirs: particles drift apart by their
  sampled noise alone, so their spread fired inside the data as often as
  outside it (``scripts/bench_world_model.py --disagreement``). The check
  runs every `DISAGREEMENT_EVERY` steps. A single network (``ensemble=1``)
  has no disagreement and never truncates.
* The score is pessimistic: the particles' mean return minus ``kappa`` times
  their spread.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Optional

import numpy as np
import numpy.typing as npt
import torch

from .dynamics import PolicyFn, ProjectFn, TerminationFn, features
from .ensemble import EnsembleDynamics, run_layers

DEFAULT_PARTICLES = 5
"""Particles per (candidate, start) when ``particles`` is left out: one per
elite of the default 5-member ensemble. More give a steadier spread, at a
cost proportional to their number."""
DEFAULT_MAX_DISAGREEMENT = 1.0
"""Truncate where the members' predicted deltas for one state spread by more
than one standard deviation of the deltas in the training data. Measured by
``scripts/bench_world_model.py --disagreement`` (a 5 x 128 x 2 ensemble
trained on 16 random-policy episodes, 5 particles, horizon 200): at 1.0, 0%
of the rollouts of the data's own and of unseen random policies were
truncated on Pendulum-v1, InvertedPendulum-v5, MountainCarContinuous-v0 and
HalfCheetah-v5 and 7-11% on Swimmer-v5, against 100% of those started 8
standard deviations outside the data on Swimmer and HalfCheetah (on the
other three, the projection into the observation box or termination brings
such starts back to the data); at 0.5, 68-80% of Swimmer's in-distribution
rollouts were truncated, at 2.0 none of the off-distribution ones."""
DISAGREEMENT_EVERY = 4
"""The members' disagreement is measured at every 4th step (from the first):
the extra rows of that forward cost as much as the particles' own at the
default size (7.6 against 2.5 ms a step for 16 x 32 x 5 rows, Pendulum,
5 x 128 x 2, one thread), and a rollout drifts off its data over several
steps; a truncation comes at most 3 steps late."""
LOWEST_SCORE = -1e30
"""The score of a candidate whose imagined return is not finite (a diverged rollout): it ranks last."""
INTERVAL_STDS = 2.0
"""``low`` / ``high``: the mean -/+ this many standard deviations over the particles."""


@dataclass(frozen=True)
class Imagination:
    """What `imagine_uncertain` (``WorldModel.imagine_uncertain``) imagined for P candidates from S starts with K particles."""

    returns: torch.Tensor
    """(P, S, K) per-particle imagined returns, float32 on the CPU."""
    mean: np.ndarray
    """(P,) mean over starts and particles."""
    std: np.ndarray
    """(P,) standard deviation over the K particles of each particle's mean over the starts (0 for one particle)."""
    score: np.ndarray
    """(P,) ``mean - kappa * std``: what the search maximises (pessimism, as MOPO); `LOWEST_SCORE` where not finite."""
    low: np.ndarray
    """(P,) the imagined interval of the candidate's mean return over the starts: ``mean - 2 * std`` ..."""
    high: np.ndarray
    """(P,) ... ``mean + 2 * std``."""
    truncated: np.ndarray
    """(P,) the share of the candidate's rollouts (one per start) truncated by disagreement."""
    horizon: int
    """Time steps imagined (an extrapolated tail beyond them is not counted here)."""


def _check(value: object, name: str, least: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ValueError(f"WorldModel.imagine: {name}={value!r}: expected at least {what}")
    return int(value)


def _checked_inputs(
    model: EnsembleDynamics, params: npt.ArrayLike, start_obs: npt.ArrayLike, horizon: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    params_t = torch.as_tensor(np.asarray(params), dtype=torch.float32, device=device)
    start = torch.as_tensor(np.asarray(start_obs), dtype=torch.float32, device=device)
    obs_dim = model.obs_dim
    if start.ndim not in (1, 2) or start.shape[-1] != obs_dim:
        raise ValueError(
            f"WorldModel.imagine: start_obs of shape {tuple(start.shape)}: expected (S, {obs_dim}) or ({obs_dim},) "
            "for one start state, observations of the environment this model was trained on"
        )
    if params_t.ndim != 2:
        raise ValueError(f"WorldModel.imagine: params of shape {tuple(params_t.shape)}: expected (P, D), one row per candidate policy")
    _check(horizon, "horizon", 1, "1 time step")
    return params_t, start.reshape(-1, obs_dim)


def _probe(x: torch.Tensor, alive: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (candidate, start), the features of its first particle still
    alive (particle 0 where none is): ``[P, S, in]``, and that particle's
    survival probability ``[P, S]``. From ``x [M, P, J, S, in]`` and ``alive
    [M, P, J, S]`` (particle k = j * M + m)."""
    n_m, n_p, n_j, n_s = alive.shape
    pick = (alive.permute(1, 2, 0, 3).reshape(n_p, n_j * n_m, n_s) > 0).float().argmax(1)  # [P, S]
    m, j = pick % n_m, pick // n_m
    p = torch.arange(n_p, device=x.device)[:, None].expand(n_p, n_s)
    s = torch.arange(n_s, device=x.device)[None, :].expand(n_p, n_s)
    return x[m, p, j, s], alive[m, p, j, s]


def imagine_uncertain(
    model: EnsembleDynamics,
    policy: PolicyFn,
    params: npt.ArrayLike,
    start_obs: npt.ArrayLike,
    horizon: int,
    *,
    particles: Optional[int] = None,
    kappa: float = 1.0,
    project: Optional[ProjectFn] = None,
    terminated: Optional[TerminationFn] = None,
    discount: float = 1.0,
    episode_steps: Optional[int] = None,
    seed: int = 0,
    max_disagreement: Optional[float] = None,
) -> Imagination:
    """Imagined returns of P candidate policies (``params`` (P, D)) from S
    start observations (``start_obs`` (S, obs_dim), or (obs_dim,) for one),
    K particles each (``particles``, default `DEFAULT_PARTICLES`), in FP32 on
    the model's device; see the module's docstring. ``policy(params, obs (P,
    N, obs_dim)) -> actions (P, N, act_dim)`` gets tensors on that device.

    A rollout stops at ``terminated(obs)`` where given, else a done-head
    model's survival probability weighs the rest of it. ``project(obs)``
    maps imagined observations back onto what the env can produce.
    ``max_disagreement`` (default `DEFAULT_MAX_DISAGREEMENT`; ``inf`` turns
    truncation off) is the spread that truncates a rollout. Where
    ``episode_steps`` exceeds ``horizon``, the remaining steps are valued at
    the rollout's mean reward over the last quarter of the horizon (an
    extrapolation, not a learned value). Same ``seed``, same result."""
    device = model.x_mean.device
    params_t, start = _checked_inputs(model, params, start_obs, horizon, device)
    k_total = _check(particles if particles is not None else DEFAULT_PARTICLES, "particles", 1, "1 rollout per candidate and start")
    if episode_steps is not None:
        _check(episode_steps, "episode_steps", horizon, f"the horizon ({horizon} steps): the episode's length")
    if not (isinstance(kappa, numbers.Real) and math.isfinite(kappa) and kappa >= 0):
        raise ValueError(f"WorldModel.imagine: kappa={kappa!r}: expected a finite number >= 0 (0: the plain mean)")
    if not (isinstance(discount, numbers.Real) and 0.0 < discount <= 1.0):
        raise ValueError(f"WorldModel.imagine: discount={discount!r}: expected a number in (0, 1]")
    limit = DEFAULT_MAX_DISAGREEMENT if max_disagreement is None else max_disagreement
    if not (isinstance(limit, numbers.Real) and limit > 0):  # NaN fails too
        raise ValueError(f"WorldModel.imagine: max_disagreement={max_disagreement!r}: expected a number > 0 (inf: never truncate)")

    n_p, n_s, d = params_t.shape[0], start.shape[0], model.obs_dim
    n_m = min(k_total, len(model.elite_index))
    # particles per member; particle k = j * n_m + m. A deterministic head gives every particle of
    # a member the same rollout: one each is computed, and particle k repeats member k % n_m's
    n_j = -(-k_total // n_m) if model.probabilistic else 1
    keep = torch.arange(k_total, device=device) % (n_j * n_m)
    weights = model.layer_weights(model.elite_index[:n_m])
    n_g = model.n_gauss
    y_mean, y_std = model.y_mean[:n_g].float(), model.y_std[:n_g].float()
    r_low, r_high = model.reward_low.float(), model.reward_high.float()
    can_end = terminated is not None or model.done_head
    floor = torch.minimum(r_low, torch.zeros_like(r_low))  # per step once truncated, where the episode can end
    generator = torch.Generator(device=device).manual_seed(int(seed))
    judge = n_m > 1 and math.isfinite(limit)  # one network cannot disagree with itself; inf: never truncate

    # the model's own layout throughout, [M, P, J, S, ...]: member m's rows are contiguous for the batched forward
    obs = start.expand(n_m, n_p, n_j, n_s, d).contiguous()
    total = torch.zeros(n_m, n_p, n_j, n_s, device=device)
    recent = torch.zeros_like(total)  # per-step values over the last quarter of the horizon
    alive = torch.ones_like(total)  # the probability that the particle has not terminated yet
    stopped = torch.zeros(n_p, n_s, dtype=torch.bool, device=device)
    rate = torch.zeros_like(total)  # per step once truncated, where it cannot end: see the module's docstring
    last_quarter = horizon - max(1, horizon // 4)
    rows = n_p * n_j * n_s
    weight = 1.0
    model.eval()
    with torch.no_grad():
        for t in range(horizon):
            by_candidate = obs.permute(1, 0, 2, 3, 4).reshape(n_p, n_m * n_j * n_s, d)
            action = policy(params_t, by_candidate).reshape(n_p, n_m, n_j, n_s, -1).permute(1, 0, 2, 3, 4)
            x = features(obs, action)
            x_rows = x.reshape(n_m, rows, -1)
            judging = judge and t % DISAGREEMENT_EVERY == 0
            if judging:  # one live particle per rollout, seen by every member, in the same forward
                probe, probe_alive = _probe(x, alive)
                x_rows = torch.cat([x_rows, probe.reshape(1, n_p * n_s, -1).expand(n_m, -1, -1)], dim=1)
            raw = run_layers(model.normalise_x(x_rows), weights)
            mean, logvar, done = model.heads(raw[:, :rows])
            if judging:  # the members' disagreement on one state, in units of the data's delta std; NaN counts as disagreement
                disagreement = model.heads(raw[:, rows:])[0][..., :d].std(0, correction=0).mean(-1).reshape(n_p, n_s)
                newly = (probe_alive > 0) & ~(disagreement <= limit) & ~stopped
                stopped |= newly
                if not can_end:  # no history yet (or a diverged one): the lowest reward seen; else at most a data step's mean
                    so_far = torch.minimum(total / t, y_mean[d]) if t > 0 else r_low.expand_as(total)
                    so_far = torch.where(torch.isfinite(so_far), so_far, r_low)
                    rate = torch.where(newly[None, :, None, :], so_far, rate)
            sample = (mean * y_std + y_mean).reshape(n_m, n_p, n_j, n_s, n_g)
            if logvar is not None:  # the same noise for every candidate
                noise = torch.randn(n_m, 1, n_j, n_s, n_g, generator=generator, device=device)
                sample = sample + noise * torch.exp(0.5 * logvar).reshape(n_m, n_p, n_j, n_s, n_g) * y_std
            value = torch.where(stopped[None, :, None, :], floor if can_end else rate, sample[..., d].clamp(r_low, r_high))
            # a terminated rollout adds nothing, even where its imagined state has diverged (0 * inf)
            value = torch.where(alive > 0, alive * value, torch.zeros_like(alive))
            total += weight * value
            if t >= last_quarter:
                recent += value
            weight *= discount
            obs = obs + sample[..., :d]
            if project is not None:
                obs = project(obs)
            if terminated is not None:
                alive = alive * (~terminated(obs)).float()
            elif done is not None:
                alive = alive * (1.0 - torch.sigmoid(done.reshape(n_m, n_p, n_j, n_s)))
        if episode_steps is not None and episode_steps > horizon:
            rest = episode_steps - horizon
            steps_left = weight * (rest if discount == 1.0 else (1.0 - discount**rest) / (1.0 - discount))
            per_step = torch.where(stopped[None, :, None, :], (floor if can_end else rate) * alive, recent / (horizon - last_quarter))
            total += steps_left * per_step
    # particle k = j * M + m, in order; the first K kept
    returns = total.permute(1, 2, 0, 3).reshape(n_p, n_j * n_m, n_s)[:, keep].permute(0, 2, 1).float().cpu()
    return summarise(returns, kappa, stopped.float().mean(1).cpu().numpy(), horizon)


def summarise(returns: torch.Tensor, kappa: float, truncated: np.ndarray, horizon: int) -> Imagination:
    """The `Imagination` of per-particle returns ``(P, S, K)``."""
    per_particle = returns.double().mean(1)  # (P, K): each particle's mean over the starts
    mean = per_particle.mean(1).numpy()
    std = per_particle.std(1).numpy() if per_particle.shape[1] > 1 else np.zeros(len(mean))
    score = mean - kappa * std
    score = np.where(np.isfinite(score), score, LOWEST_SCORE)
    return Imagination(
        returns=returns, mean=mean, std=std, score=score, low=mean - INTERVAL_STDS * std, high=mean + INTERVAL_STDS * std,
        truncated=np.asarray(truncated, dtype=float), horizon=int(horizon),
    )

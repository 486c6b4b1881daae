"""Racing real evaluations: a candidate runs on a few training start states
first and goes on only while it can still win.

Stages double (2, 4, 8, ... start states, then all of them: successive
halving's schedule, Jamieson and Talwalkar 2016) over one fixed order of the
training start states per run (`race_order`), so every candidate of a run is
measured on the same states in the same order. After each stage the
candidate continues while either bound holds (`can_still_win`):

* **paired**: with ``d_i`` its return minus the incumbent's on each start
  state run so far, ``mean(d) + t * sd(d) / sqrt(n) >= 0``;
* **target**: ``mean(r) + t * sd(r) / sqrt(n) >= target`` on its own returns.

``t`` is the one-sided 90% quantile of Student's t with ``n - 1`` degrees of
freedom (3.08 at n = 2, 1.64 at n = 4, 1.41 at n = 8), ``sd`` the sample
standard deviation: an upper confidence bound that is wide while few states
are in. Paired differences cancel what the start state alone decides (on
Pendulum a hanging start costs every policy far more than an upright one).
The incumbent is the best fully evaluated candidate so far; without one a
candidate is evaluated on every training start state at once (it becomes
the incumbent). Every episode run is charged, a stopped candidate's too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Mapping, Optional, Sequence

import numpy as np

from .evaluation import Evaluation, EvaluationError

FIRST_STAGE = 2
# one-sided 90% quantiles of Student's t by degrees of freedom; beyond the table, the nearest smaller entry (wider)
T90 = {1: 3.078, 2: 1.886, 3: 1.638, 4: 1.533, 5: 1.476, 6: 1.440, 7: 1.415, 8: 1.397, 9: 1.383, 10: 1.372, 12: 1.356,
       15: 1.341, 20: 1.325, 30: 1.310, 60: 1.296, 120: 1.289}

EvaluateFn = Callable[[np.ndarray, np.ndarray], Awaitable[Evaluation]]  # (params, states) -> real episodes; raises EvaluationError


def stage_sizes(n_train: int, racing: bool) -> list[int]:
    """Cumulative start states after each stage: 2, 4, 8, ..., ``n_train``;
    only ``[n_train]`` without racing."""
    if not racing:
        return [n_train]
    sizes, n = [], FIRST_STAGE
    while n < n_train:
        sizes.append(n)
        n *= 2
    return sizes + [n_train]


def race_order(n_train: int, seed: int) -> list[int]:
    """The order (indices into the training start states) every candidate
    of a run with ``seed`` is raced in: a fixed permutation, so the first
    stages are a spread sample and not the first states of a stratified list."""
    return [int(i) for i in np.random.default_rng([seed, 11]).permutation(n_train)]


def t90(dof: int) -> float:
    return T90[max(k for k in T90 if k <= dof)]


def upper_bound(values: Sequence[float]) -> float:
    """mean + t90(n - 1) * sd / sqrt(n); +inf with fewer than 2 values (nothing to judge by)."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) < 2:
        return math.inf
    return float(v.mean() + t90(len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))


def can_still_win(returns: Mapping[int, float], incumbent: Optional[Mapping[int, float]], target: float) -> bool:
    """Whether a candidate with ``returns`` (start index -> return) may still
    beat the incumbent (paired, on the same start states) or reach ``target``."""
    if incumbent is None:
        return True
    idx = sorted(returns)
    if upper_bound([returns[i] - incumbent[i] for i in idx]) >= 0.0:
        return True
    return upper_bound([returns[i] for i in idx]) >= target


@dataclass
class RaceResult:
    """What racing one candidate spent and found. ``starts``: indices into
    the training start states, in the order run; ``evaluation``: every
    stage's episodes in that order (None when a stage failed: ``error``)."""

    starts: list[int] = field(default_factory=list)
    evaluation: Optional[Evaluation] = None
    episodes: int = 0  # charged, the failed stage's included
    error: Optional[EvaluationError] = None

    @property
    def returns(self) -> dict[int, float]:
        assert self.evaluation is not None
        return dict(zip(self.starts, self.evaluation.returns))


async def race(
    evaluate: EvaluateFn, params: np.ndarray, train: np.ndarray, order: Sequence[int], stages: Sequence[int], *,
    incumbent: Optional[Mapping[int, float]], target: float,
) -> RaceResult:
    """Run ``params`` stage by stage on the training start states ``train``
    (in ``order``) until it is stopped, fails or has run them all. Without an
    incumbent, one stage with every state."""
    if incumbent is None:
        stages = [len(order)]
    result = RaceResult(evaluation=Evaluation(returns=[], episodes=[]))
    done = 0
    for size in stages:
        idx = list(order[done:size])
        result.episodes += len(idx)
        try:
            res = await evaluate(params, train[idx])
        except EvaluationError as exc:
            result.evaluation, result.error = None, exc
            return result
        assert result.evaluation is not None
        result.starts += idx
        result.evaluation.returns += list(res.returns)
        result.evaluation.episodes += list(res.episodes)
        done = size
        if done < len(order) and not can_still_win(result.returns, incumbent, target):
            break
    return result

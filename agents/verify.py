"""Verifying a candidate whose one real episode met the target, and
confirming it on the validation start states: a sequential test that stops
as soon as the returns so far decide, either way.

Stages double (2, 4, 8, ... start states, then all of them: successive
halving's schedule, Jamieson and Talwalkar 2016) over one fixed order of the
start states per run (`start_order`). After each stage, on the ``n``
returns so far of the ``N`` states, the bounds are ``mean(r) -+ t * sd(r) /
sqrt(n) * sqrt((N - n) / (N - 1))``, ``t`` the one-sided 90% quantile of
Student's t with ``n - 1`` degrees of freedom and the last factor the finite
population correction (the mean asked about is the one over the N states,
which n of them pin down exactly at n = N). The candidate is rejected once
the upper bound falls below the target and accepted once the lower bound
reaches it: the same error rate both ways, so a policy that meets the target
on every state it runs is decided in a few episodes, as one that cannot
reach it is. Every episode run is charged, a stopped candidate's too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Optional, Sequence

import numpy as np

from genesis_fp16.seeds import numpy_rng

from .evaluation import Evaluation, EvaluationError

FIRST_STAGE = 2
# one-sided 90% quantiles of Student's t by degrees of freedom; beyond the table, the nearest smaller entry (wider)
T90 = {1: 3.078, 2: 1.886, 3: 1.638, 4: 1.533, 5: 1.476, 6: 1.440, 7: 1.415, 8: 1.397, 9: 1.383, 10: 1.372, 12: 1.356,
       15: 1.341, 20: 1.325, 30: 1.310, 60: 1.296, 120: 1.289}

EvaluateFn = Callable[[np.ndarray, np.ndarray], Awaitable[Evaluation]]  # (params, states) -> real episodes; raises EvaluationError


def stage_sizes(n: int) -> list[int]:
    """Cumulative start states after each stage: 2, 4, 8, ..., ``n``."""
    sizes, k = [], FIRST_STAGE
    while k < n:
        sizes.append(k)
        k *= 2
    return sizes + [n]


def start_order(n_train: int, seed: int) -> list[int]:
    """The order (indices into the training start states) of a run with
    ``seed``: a fixed permutation. Candidate ``c`` of the run takes its one
    episode on ``order[c mod n_train]``, and verification walks the same order."""
    return [int(i) for i in numpy_rng(seed, "verify.start_order").permutation(n_train)]


def t90(dof: int) -> float:
    return T90[max(k for k in T90 if k <= dof)]


def half_width(values: Sequence[float], population: Optional[int] = None) -> float:
    """t90(n - 1) * sd / sqrt(n), times the finite population correction when the
    ``n`` values are drawn from ``population`` states; +inf with fewer than 2 values (nothing to judge by)."""
    v = np.asarray(values, dtype=np.float64)
    n = len(v)
    if n < 2:
        return math.inf
    fpc = 1.0 if population is None or population <= 1 else math.sqrt(max(0, population - n) / (population - 1))
    return float(t90(n - 1) * v.std(ddof=1) / math.sqrt(n) * fpc) if fpc > 0 else 0.0


def upper_bound(values: Sequence[float], population: Optional[int] = None) -> float:
    """mean + `half_width`: above the mean over ``population`` states (90%, one-sided)."""
    return float(np.mean(values)) + half_width(values, population) if len(values) else math.inf


def lower_bound(values: Sequence[float], population: Optional[int] = None) -> float:
    """mean - `half_width`: below the mean over ``population`` states (90%, one-sided)."""
    return float(np.mean(values)) - half_width(values, population) if len(values) else -math.inf


@dataclass
class Verification:
    """What verifying one candidate ran: ``starts`` (indices into the
    start states, in the order run, the candidate's own first episode first),
    ``returns`` on them, the new episodes (``evaluation``) and how many were
    charged; ``error`` when a stage failed; ``decided``: ``accept`` (the lower
    bound reached the target), ``reject`` (the upper bound fell below it),
    ``all`` (every state ran: the mean decides), ``budget`` (the next stage
    did not fit the budget), None (an error stopped it)."""

    starts: list[int] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)
    evaluation: Evaluation = field(default_factory=lambda: Evaluation(returns=[], episodes=[]))
    episodes: int = 0
    error: Optional[EvaluationError] = None
    decided: Optional[str] = None

    @property
    def accepted(self) -> bool:
        return self.decided == "accept"


async def verify(
    evaluate: EvaluateFn, params: np.ndarray, states: np.ndarray, order: Sequence[int], *, first: Optional[tuple[int, float]] = None,
    target: float, fits: Optional[Callable[[int], bool]] = None,
) -> Verification:
    """Run ``params`` on the start states ``states`` in ``order`` (``first``:
    the start index and return of its episode so far, if any), stage by
    stage, until the returns decide (`Verification.decided`), an evaluation
    fails, it has run them all, or the next stage does not ``fits`` the budget
    (``decided`` ``budget``: what ran is kept, nothing is decided)."""
    rest = [i for i in order if first is None or i != first[0]]
    result = Verification() if first is None else Verification(starts=[first[0]], returns=[float(first[1])])
    done, n = 0, len(order)
    offset = 0 if first is None else 1
    for size in stage_sizes(n):
        idx = rest[done : size - offset]
        if not idx:
            continue
        if fits is not None and not fits(result.episodes + len(idx)):  # this verification's episodes so far are not charged yet
            result.decided = "budget"
            return result
        result.episodes += len(idx)
        try:
            res = await evaluate(params, states[idx])
        except EvaluationError as exc:
            result.error = exc
            return result
        result.starts += idx
        result.returns += [float(r) for r in res.returns]
        result.evaluation.returns += list(res.returns)
        result.evaluation.episodes += list(res.episodes)
        done = size - offset
        if len(result.starts) >= n:
            result.decided = "all"
        elif upper_bound(result.returns, n) < target:
            result.decided = "reject"
        elif lower_bound(result.returns, n) >= target:
            result.decided = "accept"
        if result.decided is not None:
            break
    result.decided = result.decided or "all"  # one state only: the first episode was all of it
    return result

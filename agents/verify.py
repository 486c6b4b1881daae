"""Verifying a candidate whose one real episode met the target: it runs on
the other training start states in stages and stops as soon as it can no
longer reach the target.

Stages double (2, 4, 8, ... start states, then all of them: successive
halving's schedule, Jamieson and Talwalkar 2016) over one fixed order of the
training start states per run (`start_order`). After each stage the
candidate goes on while ``mean(r) + t * sd(r) / sqrt(n) >= target`` on its
returns so far, ``t`` the one-sided 90% quantile of Student's t with
``n - 1`` degrees of freedom: an upper confidence bound, wide while few
states are in. Every episode run is charged, a stopped candidate's too.
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


def upper_bound(values: Sequence[float]) -> float:
    """mean + t90(n - 1) * sd / sqrt(n); +inf with fewer than 2 values (nothing to judge by)."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) < 2:
        return math.inf
    return float(v.mean() + t90(len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))


@dataclass
class Verification:
    """What verifying one candidate ran: ``starts`` (indices into the training
    start states, in the order run, the candidate's own first episode first),
    ``returns`` on them, the new episodes (``evaluation``) and how many were
    charged; ``error`` when a stage failed."""

    starts: list[int] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)
    evaluation: Evaluation = field(default_factory=lambda: Evaluation(returns=[], episodes=[]))
    episodes: int = 0
    error: Optional[EvaluationError] = None


async def verify(
    evaluate: EvaluateFn, params: np.ndarray, train: np.ndarray, order: Sequence[int], *, first: tuple[int, float], target: float,
) -> Verification:
    """Run ``params`` on the training start states ``train`` in ``order``
    (``first``: the start index and return of its episode so far), stage by
    stage, until it cannot reach ``target``, fails, or has run them all."""
    rest = [i for i in order if i != first[0]]
    result = Verification(starts=[first[0]], returns=[float(first[1])])
    done = 0
    for size in stage_sizes(len(order)):
        idx = rest[done : size - 1]
        if not idx:
            continue
        result.episodes += len(idx)
        try:
            res = await evaluate(params, train[idx])
        except EvaluationError as exc:
            result.error = exc
            return result
        result.starts += idx
        result.returns += [float(r) for r in res.returns]
        result.evaluation.returns += list(res.returns)
        result.evaluation.episodes += list(res.episodes)
        done = size - 1
        if len(result.starts) < len(order) and upper_bound(result.returns) < target:
            break
    return result

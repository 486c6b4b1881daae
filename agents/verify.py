"""Verifying a candidate whose one real episode met the target, and
confirming it on the validation start states: a sequential test that stops
as soon as the returns so far decide, either way.

Stages double (2, 4, 8, ... start states, then all of them: successive
halving's schedule, Jamieson and Talwalkar 2016) over one fixed order of the
start states per run (`start_order`). After each stage the ``n`` returns so
far bound the mean over all ``N`` states, at the level that keeps the
false-accept rate (a candidate whose mean over the N states is below the
target, accepted) at most `STATED_FALSE_ACCEPT` over the whole test:

* the looks share that rate (Bonferroni: each of the stages before the last
  takes `STATED_FALSE_ACCEPT` / their number), so looking several times does
  not multiply it;
* a candidate's first episode is not part of the evidence: it was picked
  because it met the target (the loop verifies only those), so it sits above
  the mean more often than not. The bound is on the other ``N - 1`` states,
  from the returns run on them (a random sample: the order is fixed before
  the run), and the first return enters the mean over the N as the one known
  value it is;
* the spread never rests on the sample alone: the sample's variance is pooled
  with `PRIOR_WEIGHT` pseudo-observation of the task's spread ``scale`` (the
  loop passes the spread of the run's one-episode returns so far,
  `agents.real_episodes.RealEpisodes.scale`), so a sample spread of zero (two
  equal returns: a capped return such as InvertedPendulum's 1000, or one that
  depends on the kind of start state rather than on the policy) narrows the
  bound as one more observation would, never to nothing;
* the bound is Student's t with the pooled degrees of freedom and the finite
  population correction ``sqrt((M - m) / (M - 1))`` for ``m`` of ``M`` states.

Without a scale (a bare call), nothing but the mean over all N states
accepts: the returns alone cannot say how far the states not run are from
them. A candidate is rejected once the upper bound falls below the target and
accepted once the lower bound reaches it; once all N states ran, the mean
decides. Every episode run is charged, a stopped candidate's too.
`scripts/verify_error_rates.py` checks the rate by simulation over adversarial
and random return sets; docs/EVOLUTION.md gives its figures.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Optional, Sequence

import numpy as np

from genesis_fp16.base.seeds import numpy_rng

from .evaluation import Evaluation, EvaluationError

FIRST_STAGE = 2
STATED_FALSE_ACCEPT = 0.10
"""The false-accept rate the test keeps to, over all its looks (docs/EVOLUTION.md; `scripts/verify_error_rates.py`)."""
NEAR_MISS = 0.5
"""How far below the target, in the run's spread, an extra's one episode may fall and still be verified when no extra
of its batch met the target (`near_miss_bar`; docs/EVOLUTION.md, "Near misses")."""
PRIOR_WEIGHT = 1.0
"""Pseudo-observations the task's spread (``scale``) counts for in the pooled spread (`spread`)."""

EvaluateFn = Callable[
    [np.ndarray, np.ndarray], Awaitable[Evaluation]
]  # (params, states) -> real episodes; raises EvaluationError


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (Lentz's continued fraction, Numerical Recipes 6.4)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _betainc(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for i in range(1, 300):
        for numerator in (
            (i * (b - i) * x) / ((a + 2 * i - 1) * (a + 2 * i)),
            -((a + i) * (a + b + i) * x) / ((a + 2 * i) * (a + 2 * i + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-12:
            break
    return front * f


def t_cdf(x: float, dof: float) -> float:
    """P(T <= x) for Student's t with ``dof`` degrees of freedom."""
    tail = 0.5 * _betainc(dof / 2.0, 0.5, dof / (dof + x * x))
    return 1.0 - tail if x >= 0 else tail


@functools.lru_cache(maxsize=1024)
def t_quantile(p: float, dof: float) -> float:
    """The ``p`` quantile (``p`` > 0.5) of Student's t with ``dof`` degrees of freedom (bisection on `t_cdf`)."""
    lo, hi = 0.0, 1.0
    while t_cdf(hi, dof) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(100):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if t_cdf(mid, dof) < p else (lo, mid)
    return hi


def stage_sizes(n: int) -> list[int]:
    """Cumulative start states after each stage: 2, 4, 8, ..., ``n``."""
    sizes, k = [], FIRST_STAGE
    while k < n:
        sizes.append(k)
        k *= 2
    return sizes + [n]


def per_look(population: int) -> float:
    """The false-accept rate each look before the last may spend: `STATED_FALSE_ACCEPT` shared by the stages
    before all ``population`` states ran (Bonferroni; the last look is the exact mean)."""
    return STATED_FALSE_ACCEPT / max(1, len(stage_sizes(population)) - 1)


def start_order(n_train: int, seed: int) -> list[int]:
    """The order (indices into the training start states) of a run with
    ``seed``: a fixed permutation. Candidate ``c`` of the run takes its one
    episode on ``order[c mod n_train]``, and verification walks the same order."""
    return [int(i) for i in numpy_rng(seed, "verify.start_order").permutation(n_train)]


def _squares(values: Sequence[float]) -> tuple[float, int]:
    """(sum of squared deviations from their mean, degrees of freedom) of ``values``."""
    v = np.asarray(values, dtype=np.float64)
    return (float(((v - v.mean()) ** 2).sum()), len(v) - 1) if len(v) > 1 else (0.0, 0)


def spread(
    values: Sequence[float], scale: float, weight: float = PRIOR_WEIGHT, alike: Sequence[float] = ()
) -> tuple[float, float]:
    """(the pooled standard deviation, its degrees of freedom): the sample variance of ``values`` pooled with
    ``weight`` pseudo-observations of variance ``scale**2`` and with the variance of ``alike`` (returns of the
    same policy on other states of the same kind: their spread counts, their mean does not):
    ``sqrt((weight * scale**2 + SS(values) + SS(alike)) / (weight + n - 1 + m - 1))``."""
    ss, dof = _squares(values)
    more, more_dof = _squares(alike)
    dof_all = weight + dof + more_dof
    return math.sqrt((weight * scale * scale + ss + more) / dof_all), dof_all


def half_width(
    values: Sequence[float], population: int, scale: float, alpha: float, alike: Sequence[float] = ()
) -> float:
    """``t(1 - alpha, dof) * s / sqrt(n) * sqrt((population - n) / (population - 1))``: how far the mean over
    ``population`` states may lie from the mean of ``values`` (a random sample of them), one-sided at ``alpha``,
    with `spread`'s ``s`` and ``dof`` for the prior ``scale`` and the ``alike`` returns. 0 once the sample is the
    population."""
    n = len(values)
    if n < 1:
        return math.inf
    if n >= population:
        return 0.0
    sd, dof = spread(values, scale, alike=alike)
    fpc = math.sqrt((population - n) / (population - 1)) if population > 1 else 0.0
    return t_quantile(1.0 - alpha, dof) * sd / math.sqrt(n) * fpc


def bounds(
    returns: Sequence[float],
    population: int,
    scale: float,
    *,
    first_selected: bool,
    alpha: Optional[float] = None,
    alike: Sequence[float] = (),
) -> tuple[float, float]:
    """(lower, upper) bounds of the mean over ``population`` states from ``returns`` on the first of them (at
    ``alpha``, default `per_look`). ``first_selected``: ``returns[0]`` was picked for meeting the target, so it
    is a known value, not evidence: the others bound the mean over the ``population - 1`` other states.
    ``alike``: returns whose spread is pooled in (`spread`)."""
    alpha = per_look(population) if alpha is None else alpha
    known = [float(returns[0])] if first_selected else []
    sample = [float(r) for r in returns[len(known) :]]
    rest = population - len(known)
    if not sample:
        return -math.inf, math.inf
    mean, half = float(np.mean(sample)), half_width(sample, rest, scale, alpha, alike)
    k = len(known)
    return (sum(known) + rest * (mean - half)) / (k + rest), (sum(known) + rest * (mean + half)) / (k + rest)


@dataclass
class Verification:
    """What verifying one candidate ran: ``starts`` (indices into the
    start states, in the order run, the candidate's own first episode first),
    ``returns`` on them, the new episodes (``evaluation``) and how many were
    charged; ``error`` when a stage failed; ``decided``: ``accept`` (the lower
    bound reached the target, or every state ran and the mean did), ``reject``
    (the upper bound fell below it, or every state ran and the mean did not),
    ``budget`` (the next stage did not fit the budget), None (an error stopped it)."""

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
    evaluate: EvaluateFn,
    params: np.ndarray,
    states: np.ndarray,
    order: Sequence[int],
    *,
    first: Optional[tuple[int, float]] = None,
    target: float,
    fits: Optional[Callable[[int], bool]] = None,
    scale: Optional[float] = None,
    alike: Sequence[float] = (),
) -> Verification:
    """Run ``params`` on the start states ``states`` in ``order`` (``first``: the start index and return of its
    episode so far, which met the target), stage by stage, until the returns decide (`Verification.decided`), an
    evaluation fails, or the next stage does not ``fits`` the budget (``decided`` ``budget``: what ran is kept,
    nothing is decided). ``scale``: the spread of the task's returns (see the module docstring); None: only the
    mean over all the states accepts. ``alike``: the same policy's returns on other states of the same kind (a
    confirmation passes the candidate's training returns): their spread is pooled into the bound's."""
    rest = [i for i in order if first is None or i != first[0]]
    result = Verification() if first is None else Verification(starts=[first[0]], returns=[float(first[1])])
    done, n = 0, len(order)
    offset = 0 if first is None else 1
    for size in stage_sizes(n):
        idx = rest[done : size - offset]
        if not idx:
            continue
        if fits is not None and not fits(
            result.episodes + len(idx)
        ):  # this verification's episodes are not charged yet
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
        result.decided = decide(result.returns, n, target, scale, first_selected=first is not None, alike=alike)
        if result.decided is not None:
            break
    if result.decided is None:  # one state only: the first episode was all of it
        result.decided = decide(result.returns, n, target, scale, first_selected=first is not None, alike=alike)
    return result


def decide(
    returns: Sequence[float],
    population: int,
    target: float,
    scale: Optional[float],
    *,
    first_selected: bool = False,
    alike: Sequence[float] = (),
) -> Optional[str]:
    """``accept``, ``reject`` or None (run the next stage) on ``returns`` of ``population`` states: all of them
    ran, the mean decides; else `bounds` with the task's spread ``scale``. Without a scale only the mean over all
    the states accepts (a rejection still uses the bound, with the size of the returns and the target as the
    spread: `fallback_scale`)."""
    if len(returns) >= population:
        return "accept" if float(np.mean(returns)) >= target else "reject"
    lower, upper = bounds(
        returns,
        population,
        fallback_scale(returns, target) if scale is None else scale,
        first_selected=first_selected,
        alike=alike,
    )
    if upper < target:
        return "reject"
    if scale is not None and lower >= target:
        return "accept"
    return None


def return_scale(returns: Sequence[float]) -> Optional[float]:
    """The task's spread as a run has seen it: the standard deviation of ``returns`` (the run's one-episode returns
    so far, across candidates and start states; non-finite ones left out). None (the bare test: only the mean over
    all the states accepts) with fewer than 2 finite returns, or where they are all equal: no spread seen is no
    spread known."""
    finite = np.asarray([r for r in returns if math.isfinite(r)], dtype=np.float64)
    sd = float(finite.std(ddof=1)) if len(finite) > 1 else 0.0
    return sd if sd > 0 else None


def near_miss_bar(target: float, scale: Optional[float]) -> Optional[float]:
    """The lowest one-episode return of a refined candidate (an extra) that the loop verifies when no extra of its
    batch met ``target``: `NEAR_MISS` of the run's spread ``scale`` (`return_scale`) below it; None without a scale.

    One start state moves a good policy's return by about that much: on Pendulum-v1 the hanging start costs a policy
    whose mean over the training states is -186 some -350 (the target is -300), and the learners' first actor meets
    that start on some seeds. The test (`verify`) counts a first return below the target as the known value it is,
    so a near miss that is not good is refuted in a few episodes, where the next generation's extras cost CMA-ES's
    whole population first. CMA-ES's own samples are verified only when they meet the target: the floor decides
    as the plain one-episode CMA-ES it is."""
    if scale is None:
        return None
    return float(target) - NEAR_MISS * float(scale)


def fallback_scale(values: Sequence[float], target: float) -> float:
    """The spread a bare call's rejection assumes: the size of the returns and the target (the largest absolute
    value; 1 where all are 0)."""
    return max([abs(float(v)) for v in values] + [abs(float(target)), 1.0])

"""The search operators. Each takes plain arrays and an optional imagine
function, so tests can run them on a synthetic objective; `propose` runs
them in the search's z-coordinates (`agents.search_space`).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from genesis_fp16.extras import require

from .evolve_config import EVOLVE, Candidate, EvolveConfig
from .imagination import ImagineFn
from .search_space import SearchSpace


def pool_failing(pool: Sequence[Candidate], target: float) -> bool:
    """The pool is failing while no fully evaluated candidate meets the
    target, one whose confirmation on the validation start states failed aside."""
    return not any(c.meets(target) and c.confirmed is not False for c in pool)


def best_first(score: Optional[float]) -> float:
    """Sort key: the highest score first, an unscored candidate (None) last.
    A score of 0.0 is a score, so no ``score or default`` here."""
    return float("inf") if score is None else -score


def best_of(pool: Sequence[Candidate]) -> Optional[Candidate]:
    # a candidate lost to a failed evaluation (-inf) is never the best
    scored = [c for c in pool if c.real_return is not None and c.real_return > float("-inf")]
    if not scored:
        return None
    # any full evaluation outranks any partial score, however high: a one-episode probe is verified first only
    # when it meets the target (SEDarwinAgent._promotable); a better probe below the target stays unrefined
    # (a high probe under a low full evaluation happens: docs/EVOLUTION.md)
    return max(scored, key=lambda c: (c.full, c.real_return))


def revision(
    pool: Sequence[Candidate], rng: np.random.Generator, *, target: float, n_params: int, imagine: Optional[ImagineFn] = None,
    samples: int = 64, iters: int = 40, sigma: float = 1.0, popsize: int = 16, seed: int = 0,
) -> list[np.ndarray]:
    """New candidates where the pool is failing: a fresh start away from the
    pool's optimum. With a model: the best of ``samples`` random policies by
    imagined return, then CMA-ES inside the model from there. Without: one
    random policy. Returns [] when the pool already meets the target."""
    if not pool_failing(pool, target):
        return []
    starts = rng.normal(0.0, 0.5, size=(samples if imagine is not None else 1, n_params))
    if imagine is None:
        return [starts[0]]
    x0 = starts[int(np.argmax(imagine(starts)))]
    return [cma_in_model(x0, sigma, imagine, iters=iters, popsize=popsize, seed=seed)]


def recombination(a: np.ndarray, b: np.ndarray, rng: np.random.Generator, n: int = 3) -> list[np.ndarray]:
    """Blends of two good candidates: a + w (b - a), w uniform in [0.2, 0.8]."""
    weights = rng.uniform(0.2, 0.8, size=n)
    return [a + w * (b - a) for w in weights]


def refinement(
    x0: np.ndarray, rng: np.random.Generator, *, imagine: Optional[ImagineFn] = None, sigma: float = 0.3,
    iters: int = 30, popsize: int = 16, seed: int = 0,
) -> list[np.ndarray]:
    """Search around a good candidate: CMA-ES inside the world model over
    imagined returns; without a model, one Gaussian step."""
    if imagine is None:
        return [x0 + rng.normal(0.0, sigma, size=x0.shape)]
    return [cma_in_model(x0, sigma, imagine, iters=iters, popsize=popsize, seed=seed)]


def cma_in_model(x0: np.ndarray, sigma: float, imagine: ImagineFn, *, iters: int, popsize: int, seed: int) -> np.ndarray:
    cma = require("cma", EVOLVE)
    es = cma.CMAEvolutionStrategy(np.asarray(x0, dtype=float), sigma, {"popsize": popsize, "seed": seed + 1, "verbose": -9})
    for _ in range(iters):
        xs = es.ask()
        scores = imagine(np.asarray(xs))
        es.tell(xs, [-float(s) for s in scores])
    best = np.asarray(es.result.xbest, dtype=float)
    # CMA-ES never scores its own start point; keep it when the search found nothing better
    start_score = float(imagine(np.asarray(x0, dtype=float)[None])[0])
    return best if -float(es.result.fbest) >= start_score else np.asarray(x0, dtype=float)


def propose(
    pool: Sequence[Candidate], rng: np.random.Generator, cfg: EvolveConfig, generation: int, imagine: Optional[ImagineFn], *, n_params: int,
    space: Optional[SearchSpace] = None,
) -> list[Candidate]:
    """One generation's proposals from the pool: refinement of the best,
    recombination of the two best fully evaluated, revision while the pool is
    failing; ranked by imagined return, or shuffled without a model.
    ``n_params``: the task's policy size (fresh starts of revision). The
    operators work in ``space``'s z-coordinates (None: the raw parameters),
    ``imagine`` takes z-coordinates too; the candidates hold raw parameters."""
    to_z = space.to_z if space is not None else np.asarray
    seed = cfg.seed * 1000 + generation * 10
    proposals: list[tuple[str, np.ndarray]] = []
    best = best_of(pool)
    if best is not None:
        for x in refinement(to_z(best.params), rng, imagine=imagine, sigma=cfg.refine_sigma, iters=cfg.refine_iters, popsize=cfg.popsize,
                            seed=seed):
            proposals.append(("refinement", x))
    full = sorted([c for c in pool if c.full], key=lambda c: best_first(c.real_return))
    if len(full) >= 2:
        for x in recombination(to_z(full[0].params), to_z(full[1].params), rng, n=cfg.recombinations):
            proposals.append(("recombination", x))
    for x in revision(
        pool, rng, target=float(cfg.target if cfg.target is not None else -np.inf), n_params=n_params, imagine=imagine, samples=cfg.revision_samples,
        iters=cfg.revision_iters, sigma=cfg.revision_sigma, popsize=cfg.popsize, seed=seed + 1,
    ):
        proposals.append(("revision", x))
    scores = imagine(np.stack([x for _, x in proposals])) if imagine is not None and proposals else None
    to_raw = space.to_raw if space is not None else np.asarray
    cands = [Candidate(f"g{generation}-{k}-{op}", to_raw(x), op, generation) for k, (op, x) in enumerate(proposals)]
    if scores is not None:
        for c, s in zip(cands, scores):
            c.imagined = float(s)
        cands.sort(key=lambda c: best_first(c.imagined))
    else:
        order = rng.permutation(len(cands))  # nothing to rank by: the ablation picks at random
        cands = [cands[i] for i in order]
    return cands

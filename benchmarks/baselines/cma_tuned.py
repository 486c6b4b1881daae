"""Tuned CMA-ES: pycma as its authors use it on policy search, each candidate
scored on ONE real episode.

A candidate costs one episode: candidate number ``c`` of
the run (counting across generations) starts from training start state
``c mod n_train``, so the population sees the start states in turn and
CMA-ES's own averaging over generations does the rest. Defaults: sigma0 0.5,
pycma's default population (4 + 3 ln n), mean 0, the task's tanh policy
(`PolicySpec`), episodes in the project's worker processes, CMA-ES through
the loop's one driver (`agents.cma_search.CMASearch`).

With ``normalize=True`` the search runs on normalised observations as ARS V2
does: running mean and std of the scaled observations (``obs * obs_scale``) of
every episode spent, updated after each generation (so the candidates of one
generation are compared under one normalisation), folded into the first
layer before the workers run it (``benchmarks.baselines.normalization``).
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Union

import numpy as np

from genesis_fp16.base.extras import require

from agents.cma_search import CMASearch

from agents.evaluation import EvaluationBackend, EvaluationError, make_evaluator
from agents.evaluation_contract import Evaluation
from agents.tasks import Task
from .common import BaselineConfig, Clock, TargetWatch, baseline_report, target_states
from .normalization import RunningStats, fold

PURPOSE = "the tuned CMA-ES baseline"


def run_cma_tuned(
    cfg: Optional[BaselineConfig] = None,
    *,
    sigma0: float = 0.5,
    popsize: Optional[int] = None,
    normalize: bool = False,
    task: Optional[Task] = None,
    evaluator: Optional[EvaluationBackend] = None,
) -> dict[str, Any]:
    """Run CMA-ES on one-episode scores under ``cfg``'s budget; the report's
    method is ``cma_tuned`` or ``cma_tuned_norm`` (see the module doc and
    ``benchmarks.baselines.common`` for the target checks). ``cpu_s`` counts the
    worker processes only of an evaluator made here (they end with the run)."""
    require("gymnasium", PURPOSE)
    cfg = cfg or BaselineConfig()
    resolved = cfg.resolve(task)
    spec, starts = resolved.policy, resolved.start_states(cfg.seed)
    check_states, checked_on = target_states(starts)
    stats = RunningStats(spec.obs_dim) if normalize else None
    scale = np.asarray(spec.obs_scale, dtype=np.float64)

    def raw(x: np.ndarray) -> np.ndarray:
        return fold(spec, x, stats.mean, stats.std) if stats is not None else np.asarray(x, dtype=np.float64)

    clock = Clock()
    own = evaluator is None
    evaluator = evaluator or make_evaluator(
        resolved, workers=cfg.workers, timeout_s=cfg.eval_timeout_s, memory_limit_mb=cfg.eval_memory_mb
    )
    es = CMASearch(
        np.zeros(spec.n_params), sigma0, seed=cfg.seed, popsize=popsize, purpose=PURPOSE
    )  # the loop's one driver
    watch = TargetWatch(resolved.target, every=cfg.check_every or 1)
    episodes = steps = generation = candidate = scored = 0
    failures: list[dict[str, Any]] = []
    try:
        while not cfg.spent(episodes, steps) and not (watch.reached and cfg.stop_at_target):
            xs = es.ask()
            scores: list[float] = []
            seen: list[np.ndarray] = []
            # one call per generation; with an env-step budget one batch of workers at a time, so it is not passed by
            # more
            batch = len(xs) if cfg.budget_steps is None else cfg.workers
            while len(scores) < len(xs) and not cfg.spent(episodes, steps):
                todo = xs[len(scores) : len(scores) + min(batch, cfg.budget - episodes)]
                jobs = [(raw(x), [starts.train[(candidate + j) % len(starts.train)]]) for j, x in enumerate(todo)]
                episodes, candidate = episodes + len(todo), candidate + len(todo)
                for j, res in enumerate(_evaluate(evaluator, jobs)):
                    if isinstance(res, Evaluation):
                        scores.append(res.returns[0])
                        steps += res.env_steps
                        seen += [ep["obs"] for ep in res.episodes]
                        scored += 1
                    else:
                        scores.append(-math.inf)
                        failures.append(
                            {
                                "candidate": f"cma-g{generation}-{len(scores) - 1}",
                                "generation": generation,
                                "episodes": 1,
                                "error": str(res),
                            }
                        )
            if stats is not None and seen:
                stats.update(np.concatenate(seen) * scale)
            if len(scores) < len(
                xs
            ):  # the budget ended inside the generation: its candidates are charged, CMA-ES not told
                break
            es.tell(scores)
            generation += 1
            if watch.due(episodes):
                watch.record(generation, episodes, steps, evaluator.evaluate(raw(es.mean), check_states).mean_return)
        final = raw(es.mean)
        train = evaluator.evaluate(final, starts.train).mean_return
        heldout = evaluator.evaluate(final, starts.heldout).mean_return
    finally:
        if own:
            evaluator.close()
    settings = {
        "sigma0": sigma0,
        "sigma_final": float(es.sigma),
        "popsize": int(es.popsize),
        "normalize": normalize,
        "policy": spec.name,
        "n_params": spec.n_params,
        "generations": generation,
        "episodes_per_candidate": 1,
        "start_states": f"candidate c starts from training state c mod {len(starts.train)}",
        "final_solution": "the CMA-ES mean" + (", normalisation folded into the first layer" if normalize else ""),
    }
    report = baseline_report(
        "cma_tuned_norm" if normalize else "cma_tuned",
        cfg,
        resolved,
        starts,
        watch=watch,
        checked_on=checked_on,
        real_episodes=episodes,
        env_steps=steps,
        train_return=train,
        heldout_return=heldout,
        clock=clock,
        settings=settings,
        failures=failures,
        stop_reason="failed" if episodes and not scored else None,
    )
    report["sigma0"] = sigma0  # the initial step size, a top-level key: the comparison table shows it
    return report


def _evaluate(
    evaluator: EvaluationBackend, jobs: Sequence[tuple[np.ndarray, Any]]
) -> list[Union[Evaluation, Exception]]:
    """Every job's evaluation, or the error it failed with (a failed batch fails each of its jobs)."""
    try:
        return list(evaluator.evaluate_many(jobs, per_job_env_errors=True))
    except EvaluationError as exc:
        return [exc] * len(jobs)

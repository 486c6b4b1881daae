"""The plain CMA-ES baseline: CMA-ES on real returns under the loop's budget."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import asdict
from typing import Any, Callable, Optional

import numpy as np

from genesis_fp16.extras import require
from genesis_fp16.settings import Settings
from genesis_fp16.telemetry import get_logger

from .evaluation import EvaluationBackend, EvaluationError, make_evaluator
from .evolve_config import EVOLVE, EvolveConfig
from .evolve_report import stop_detail
from .mujoco_log import mujoco_log_for
from .tasks import Task

async def run_cma_baseline(config: Optional[EvolveConfig] = None, *, task: Optional[Task] = None, evaluator: Optional[EvaluationBackend] = None,
                           on_generation: Optional[Callable[[dict[str, Any]], None]] = None,
                           settings: Optional[Settings] = None) -> dict[str, Any]:
    """Plain CMA-ES (the ``cma`` package) on real returns under the same
    real-episode budget: each candidate is scored on all training start
    states, exactly the objective the loop's target is defined on. A
    candidate whose evaluation fails (timeout, memory limit, the env raised
    or gave a non-finite return) is charged, scored -inf and recorded in
    ``failed_candidates``; a run in which every candidate failed stops as
    ``failed``."""
    cma = require("cma", EVOLVE)
    require("gymnasium", EVOLVE)
    cfg, resolved = (config or EvolveConfig()).resolve(task)
    log = get_logger("agents.se_darwin", agent="cma_baseline")
    starts = resolved.start_states(cfg.seed)
    mujoco_log = mujoco_log_for(settings) if settings is not None else None  # without settings: MuJoCo's own place
    evaluator = evaluator or make_evaluator(resolved, backend=cfg.backend, workers=cfg.workers, timeout_s=cfg.eval_timeout_s,
                                            memory_limit_mb=cfg.eval_memory_mb, mujoco_log=mujoco_log)
    started = time.perf_counter()
    es = cma.CMAEvolutionStrategy(np.zeros(resolved.n_params), 0.5, {"seed": cfg.seed + 1, "verbose": -9})
    episodes, env_steps, generation, reached_at = 0, 0, 0, None
    failures: list[dict[str, Any]] = []
    best_x, best_f = None, -math.inf
    generations = []
    per_candidate = len(starts.train)
    try:
        while reached_at is None and episodes + per_candidate <= cfg.budget:
            xs = es.ask()
            scores = []
            for x in xs:
                if episodes + per_candidate > cfg.budget:
                    break
                episodes += per_candidate
                try:
                    res = await asyncio.to_thread(evaluator.evaluate, x, starts.train)
                except EvaluationError as exc:
                    cand = f"cma-g{generation}-{len(scores)}"
                    log.warning("evolve.candidate_failed", candidate=cand, error=str(exc))
                    failures.append({"candidate": cand, "generation": generation, "episodes": per_candidate, "error": str(exc)})
                    scores.append(float("-inf"))
                    continue
                env_steps += res.env_steps
                scores.append(res.mean_return)
                if res.mean_return > best_f:
                    best_x, best_f = np.asarray(x), res.mean_return
                if res.mean_return >= cfg.target:
                    reached_at = episodes
                    break
            if len(scores) == len(xs):
                es.tell(xs, [-s if np.isfinite(s) else 1e300 for s in scores])
            record = {
                "generation": generation, "real_episodes": episodes, "env_steps": env_steps,
                "best_return": best_f if best_x is not None else None, "best_full": True,
                "best_episodes": len(starts.train), "wm_val_loss": None, "precision": "none",
            }
            generations.append(record)
            log.info("evolve.generation", generation=generation, real_episodes=episodes, best_return=record["best_return"], wm_val_loss=None,
                     precision="none")
            if on_generation is not None:
                on_generation(record)
            generation += 1
        heldout = await asyncio.to_thread(evaluator.evaluate, best_x, starts.heldout) if best_x is not None else None
    finally:
        evaluator.close()
    report = {
        "mode": "cma",
        "env": cfg.env_id,
        "seed": cfg.seed,
        "budget": cfg.budget,
        "target": cfg.target,
        "real_episodes": episodes,
        "env_steps": env_steps,
        "episodes_to_target": reached_at,
        "target_reached": reached_at is not None,
        "train_return": best_f if best_x is not None else None,
        "heldout_return": heldout.mean_return if heldout is not None else None,
        "heldout_episodes": len(starts.heldout),
        "train_start_states": len(starts.train),
        "precision": "none",
        "wall_s": time.perf_counter() - started,
        "stop_reason": "target" if reached_at is not None else ("budget" if best_x is not None else "failed"),
        "generations": generations,
        "failed_candidates": failures,
        "config": asdict(cfg),
    }
    report["stop_detail"] = stop_detail(report)
    return report

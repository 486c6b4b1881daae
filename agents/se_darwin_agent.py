"""SE-Darwin: an evolution loop whose world model decides what is worth a
real evaluation.

Per generation::

    pool --revision / recombination / refinement--> proposals
    proposals --WorldModel.imagine (batched, cheap)--> ranked
    top-k --real episodes in worker processes (expensive, budgeted)--> returns
    trajectories --ReplayBuffer (one transaction)--> await WorldModel.train()

Generation 0 seeds the model: a few random policies, one real episode each.
The loop stops at the target (mean real return over the training start
states) or when the next real evaluation would exceed the episode budget.
With ``use_world_model=False`` the same operators run without a model
(refinement becomes a Gaussian step, nothing is ranked): the ablation the docs
measure.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from genesis_fp16.telemetry import get_logger
from infrastructure.replay_buffer import ReplayBuffer, trajectories_from_episodes

from . import pendulum_task as task
from .evaluation import EvaluationError, EvaluationTimeout, Evaluator

ImagineFn = Callable[[np.ndarray], np.ndarray]  # (P, D) params -> (P,) predicted mean return


@dataclass
class EvolveConfig:
    """Options of the evolution loop (the CLI's flags map onto these)."""

    env_id: str = task.ENV_ID
    budget: int = 200  # real episodes, the only currency that counts
    seed: int = 0
    precision: Optional[str] = None  # None: settings and the agent's profile decide
    use_world_model: bool = True
    target: float = task.TARGET_RETURN
    init_candidates: int = 8  # generation 0: random policies, one real episode each
    eval_top_k: int = 1  # candidates per generation that get real evaluations
    extra_imagined_starts: int = 16  # random start states only the model sees (regularises the search)
    horizon: int = task.EPISODE_STEPS
    wm_steps: int = 800  # optimizer steps per generation
    popsize: int = 16  # CMA-ES population inside the model
    refine_iters: int = 30
    refine_sigma: float = 0.3
    revision_iters: int = 40
    revision_sigma: float = 1.0
    revision_samples: int = 64
    recombinations: int = 3
    workers: int = 2
    eval_timeout_s: float = 120.0
    eval_memory_mb: Optional[int] = 2048  # address space an evaluation worker may add; None: no limit
    agent: str = "se_darwin"
    wm_agent: str = "world_model"

    def validate(self) -> None:
        problems = []
        if self.env_id != task.ENV_ID:
            problems.append(f"env {self.env_id!r}: the embedded task supports {task.ENV_ID!r} only")
        if self.budget < task.N_TRAIN_STARTS:
            problems.append(f"budget={self.budget}: expected at least {task.N_TRAIN_STARTS} real episodes (one full evaluation)")
        if self.init_candidates > self.budget:
            problems.append(
                f"init_candidates={self.init_candidates}: generation 0 spends one real episode per initial candidate; "
                f"expected at most the budget ({self.budget})"
            )
        if self.precision not in (None, "auto", "fp32", "fp16", "bf16"):
            problems.append(f"precision={self.precision!r}: expected auto, fp32, fp16 or bf16")
        for name in ("init_candidates", "eval_top_k", "popsize", "workers", "horizon"):
            if getattr(self, name) < 1:
                problems.append(f"{name}={getattr(self, name)}: expected >= 1")
        if problems:
            raise ValueError("invalid evolve options: " + "; ".join(problems))


@dataclass
class Candidate:
    id: str
    params: np.ndarray
    operator: str
    generation: int
    imagined: Optional[float] = None
    real_return: Optional[float] = None  # mean over the training start states
    real_episodes: int = 0
    full: bool = False  # evaluated on every training start state


# -- operators -----------------------------------------------------------------------
# Each takes plain arrays and an optional imagine function, so tests can run
# them on a synthetic objective.


def pool_failing(pool: Sequence[Candidate], target: float) -> bool:
    """The pool is failing while no fully evaluated candidate meets the target."""
    return not any(c.full and c.real_return is not None and c.real_return >= target for c in pool)


def best_of(pool: Sequence[Candidate]) -> Optional[Candidate]:
    scored = [c for c in pool if c.real_return is not None]
    if not scored:
        return None
    # a full evaluation outranks a single-episode score of the same value
    return max(scored, key=lambda c: (c.full, c.real_return))


def revision(
    pool: Sequence[Candidate], rng: np.random.Generator, *, target: float, imagine: Optional[ImagineFn] = None,
    samples: int = 64, iters: int = 40, sigma: float = 1.0, popsize: int = 16, seed: int = 0,
) -> list[np.ndarray]:
    """New candidates where the pool is failing: a fresh start away from the
    pool's optimum. With a model: the best of ``samples`` random policies by
    imagined return, then CMA-ES inside the model from there. Without: one
    random policy. Returns [] when the pool already meets the target."""
    if not pool_failing(pool, target):
        return []
    starts = rng.normal(0.0, 0.5, size=(samples if imagine is not None else 1, task.N_PARAMS))
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
    import cma

    es = cma.CMAEvolutionStrategy(np.asarray(x0, dtype=float), sigma, {"popsize": popsize, "seed": seed + 1, "verbose": -9})
    for _ in range(iters):
        xs = es.ask()
        scores = imagine(np.asarray(xs))
        es.tell(xs, [-float(s) for s in scores])
    best = np.asarray(es.result.xbest, dtype=float)
    # CMA-ES never scores its own start point; keep it when the search found nothing better
    start_score = float(imagine(np.asarray(x0, dtype=float)[None])[0])
    return best if -float(es.result.fbest) >= start_score else np.asarray(x0, dtype=float)


# -- the agent -------------------------------------------------------------------------


class SEDarwinAgent:
    """Runs :meth:`evolve`. ``on_generation(record)`` is called after each
    generation (the CLI's progress display)."""

    def __init__(
        self,
        config: Optional[EvolveConfig] = None,
        *,
        settings: Any = None,
        buffer: Optional[ReplayBuffer] = None,
        world_model: Any = None,
        evaluator: Optional[Evaluator] = None,
        on_generation: Optional[Callable[[dict[str, Any]], None]] = None,
    ) -> None:
        from genesis_fp16.settings import load_settings

        self.config = config or EvolveConfig()
        self.config.validate()
        self.settings = settings or load_settings()
        self.run_id = f"seed{self.config.seed}-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
        self.data_agent = f"{self.config.agent}:{self.run_id}"  # one run's data never trains another run's model
        self.buffer = buffer or ReplayBuffer(settings=self.settings)
        self.starts = task.start_states(self.config.seed)
        self.rng = np.random.default_rng(self.config.seed)
        self.world_model = world_model
        if self.config.use_world_model and self.world_model is None:
            self.world_model = self._make_world_model()
        self.evaluator = evaluator or Evaluator(
            self.config.env_id,
            workers=self.config.workers,
            timeout_s=self.config.eval_timeout_s,
            memory_limit_mb=self.config.eval_memory_mb,
        )
        self.on_generation = on_generation
        self.pool: list[Candidate] = []
        self.real_episodes = 0
        self.generations: list[dict[str, Any]] = []
        self._log = get_logger("agents.se_darwin", agent=self.config.agent, run_id=self.run_id)

    def _make_world_model(self) -> Any:
        import torch

        from infrastructure.world_model import WorldModel

        torch.manual_seed(self.config.seed)
        guard = None
        try:
            from genesis_fp16.guard import RollbackGuard  # the rollout issue's guard, when present

            guard = RollbackGuard(self.config.wm_agent, settings=self.settings)
        except ImportError:
            guard = None
        return WorldModel(
            task.OBS_DIM, task.ACT_DIM, buffer=self.buffer, agent=self.config.wm_agent, data_agent=self.data_agent,
            guard=guard, settings=self.settings, precision=self.config.precision, seed=self.config.seed,
            checkpoint_dir=Path(self.settings.state_dir) / "world_model" / self.run_id,
        )

    # -- model-side helpers ---------------------------------------------------------------
    def _imagine_fn(self, generation: int) -> Optional[ImagineFn]:
        if self.world_model is None:
            return None
        from . import pendulum_model

        g = np.random.default_rng([self.config.seed, generation, 7])
        extra = np.stack(
            [g.uniform(-math.pi, math.pi, self.config.extra_imagined_starts), g.uniform(-1, 1, self.config.extra_imagined_starts)],
            axis=1,
        )
        start_obs = task.observation(np.concatenate([self.starts.train, extra])).astype(np.float32)
        wm, horizon = self.world_model, self.config.horizon

        def imagine(params: np.ndarray) -> np.ndarray:
            returns = wm.imagine(pendulum_model.batched_policy, params, start_obs, horizon, project=pendulum_model.project)
            return returns.mean(dim=1).numpy().astype(float)

        return imagine

    def _propose(self, generation: int) -> list[Candidate]:
        cfg = self.config
        imagine = self._imagine_fn(generation)
        seed = cfg.seed * 1000 + generation * 10
        proposals: list[tuple[str, np.ndarray]] = []
        best = best_of(self.pool)
        if best is not None:
            for x in refinement(best.params, self.rng, imagine=imagine, sigma=cfg.refine_sigma, iters=cfg.refine_iters, popsize=cfg.popsize, seed=seed):
                proposals.append(("refinement", x))
        full = sorted([c for c in self.pool if c.full], key=lambda c: -(c.real_return or -1e9))
        if len(full) >= 2:
            for x in recombination(full[0].params, full[1].params, self.rng, n=cfg.recombinations):
                proposals.append(("recombination", x))
        for x in revision(
            self.pool, self.rng, target=cfg.target, imagine=imagine, samples=cfg.revision_samples,
            iters=cfg.revision_iters, sigma=cfg.revision_sigma, popsize=cfg.popsize, seed=seed + 1,
        ):
            proposals.append(("revision", x))
        cands = [Candidate(f"g{generation}-{k}-{op}", x, op, generation) for k, (op, x) in enumerate(proposals)]
        if imagine is not None and cands:
            scores = imagine(np.stack([c.params for c in cands]))
            for c, s in zip(cands, scores):
                c.imagined = float(s)
            cands.sort(key=lambda c: -(c.imagined or -1e18))
        else:
            order = self.rng.permutation(len(cands))  # nothing to rank by: the ablation picks at random
            cands = [cands[i] for i in order]
        return cands

    # -- the loop ------------------------------------------------------------------------------
    async def _real(self, params: np.ndarray, states: np.ndarray) -> Any:
        return await asyncio.to_thread(self.evaluator.evaluate, params, states)

    async def _seed_generation(self) -> list[tuple[Candidate, Any]]:
        cfg = self.config
        params = task.random_params(self.rng, cfg.init_candidates, 1.0)
        n_train = len(self.starts.train)
        cands = []
        for k, p in enumerate(params):
            state = self.starts.train[(k * max(1, n_train // cfg.init_candidates)) % n_train]
            cands.append((Candidate(f"g0-{k}-seed", p, "seed", 0), state))
        out = []
        results = await asyncio.to_thread(self.evaluator.evaluate_many, [(c.params, [s]) for c, s in cands])
        for (cand, _), res in zip(cands, results):
            cand.real_return = res.mean_return
            cand.real_episodes = 1
            cand.full = n_train == 1
            self.real_episodes += 1
            out.append((cand, res))
        return out

    async def evolve(self) -> dict[str, Any]:
        cfg = self.config
        started = time.perf_counter()
        reached_at: Optional[int] = None
        interrupted = False
        generation = 0
        stop_reason = "budget"
        try:
            # generation 0: exploratory policies to seed the model
            seeded = await self._seed_generation()
            await self._commit(0, seeded)
            record = await self._after_generation(0, [c for c, _ in seeded], started)
            if self.config.init_candidates >= 1 and any(c.full and (c.real_return or -1e9) >= cfg.target for c, _ in seeded):
                reached_at = self.real_episodes
            while reached_at is None:
                generation += 1
                if self.real_episodes + len(self.starts.train) > cfg.budget:
                    stop_reason = "budget"
                    break
                cands = await asyncio.to_thread(self._propose, generation)
                evaluated = []
                for cand in cands[: cfg.eval_top_k]:
                    if self.real_episodes + len(self.starts.train) > cfg.budget:
                        break
                    try:
                        res = await self._real(cand.params, self.starts.train)
                    except EvaluationError as exc:  # a timeout or the worker memory limit
                        self.real_episodes += len(self.starts.train)  # spent, even if lost
                        cand.real_return, cand.full = float("-inf"), True
                        event = "evolve.candidate_timeout" if isinstance(exc, EvaluationTimeout) else "evolve.candidate_failed"
                        self._log.warning(event, candidate=cand.id, error=str(exc))
                        self.pool.append(cand)
                        continue
                    cand.real_return, cand.real_episodes, cand.full = res.mean_return, len(res.returns), True
                    self.real_episodes += len(res.returns)
                    evaluated.append((cand, res))
                    if cand.real_return >= cfg.target and reached_at is None:
                        reached_at = self.real_episodes
                await self._commit(generation, evaluated)
                record = await self._after_generation(generation, [c for c, _ in evaluated], started, proposals=cands)
                if reached_at is not None:
                    stop_reason = "target"
        except (asyncio.CancelledError, KeyboardInterrupt):
            interrupted = True
            stop_reason = "interrupted"
            self._log.warning("evolve.interrupted", generation=generation, real_episodes=self.real_episodes, replay_db=str(self.buffer.path))
            raise
        finally:
            if interrupted:
                self.evaluator.terminate()
        best = best_of([c for c in self.pool if c.full]) or best_of(self.pool)
        heldout = await self._real(best.params, self.starts.heldout) if best is not None else None
        self.evaluator.close()
        report = self._report(best, heldout, reached_at, stop_reason, time.perf_counter() - started)
        self._log.info(
            "evolve.finished", **{k: report[k] for k in ("real_episodes", "train_return", "heldout_return", "target_reached", "precision", "wall_s")}
        )
        return report

    async def _commit(self, generation: int, evaluated: Sequence[tuple[Candidate, Any]]) -> None:
        """Outcomes to the replay buffer (one transaction per generation), then
        the pool; then the world model learns from everything so far."""
        trajs = []
        for cand, res in evaluated:
            outcome = "target" if cand.full and (cand.real_return or -1e18) >= self.config.target else ("full" if cand.full else "probe")
            trajs += trajectories_from_episodes(res.episodes, cand.id, outcome)
            self.pool.append(cand)
        if trajs:
            await self.buffer.aappend_generation(self.data_agent, generation, trajs)

    async def _after_generation(self, generation: int, evaluated: Sequence[Candidate], started: float, proposals: Sequence[Candidate] = ()) -> dict[str, Any]:
        wm_report = None
        reached = not pool_failing(self.pool, self.config.target)
        if self.world_model is not None and not reached:
            wm_report = await self.world_model.train(self.config.wm_steps)
        best = best_of(self.pool)
        record = {
            "generation": generation,
            "real_episodes": self.real_episodes,
            "best_return": best.real_return if best else None,
            "best_full": bool(best.full) if best else False,
            "evaluated": [{"id": c.id, "operator": c.operator, "imagined": c.imagined, "real_return": c.real_return} for c in evaluated],
            "proposals": len(proposals),
            "wm_val_loss": wm_report.val_loss if wm_report else None,
            "wm_train_loss": wm_report.train_loss if wm_report else None,
            "wm_wall_s": wm_report.wall_s if wm_report else None,
            "wm_rolled_back": wm_report.rolled_back if wm_report else False,
            "wm_rollback_reason": wm_report.rollback_reason if wm_report else None,
            "fp32_val_loss": wm_report.fp32_val_loss if wm_report else None,
            "precision": wm_report.precision if wm_report else self._precision(),
            "elapsed_s": time.perf_counter() - started,
        }
        self.generations.append(record)
        self._log.info(
            "evolve.generation",
            generation=generation,
            real_episodes=self.real_episodes,
            best_return=record["best_return"],
            wm_val_loss=record["wm_val_loss"],
            precision=record["precision"],
            operators=[c.operator for c in evaluated],
        )
        if self.on_generation is not None:
            self.on_generation(record)
        return record

    def _precision(self) -> str:
        if self.world_model is None:
            return "none"
        return getattr(self.world_model, "precision", "unknown")

    def _report(self, best: Optional[Candidate], heldout: Any, reached_at: Optional[int], stop_reason: str, wall_s: float) -> dict[str, Any]:
        cfg = self.config
        return {
            "mode": "full" if cfg.use_world_model else "no_world_model",
            "env": cfg.env_id,
            "seed": cfg.seed,
            "budget": cfg.budget,
            "target": cfg.target,
            "real_episodes": self.real_episodes,
            "episodes_to_target": reached_at,
            "target_reached": reached_at is not None,
            "train_return": best.real_return if best and best.full else None,
            "heldout_return": heldout.mean_return if heldout is not None else None,
            "heldout_episodes": len(self.starts.heldout),
            "best_candidate": {"id": best.id, "operator": best.operator, "params": [float(v) for v in best.params]} if best else None,
            "precision": self._precision(),
            "wall_s": wall_s,
            "stop_reason": stop_reason,
            "generations": self.generations,
            "run_id": self.run_id,
            "replay_db": str(self.buffer.path),
            "config": asdict(cfg),
        }


# -- the plain CMA-ES baseline -----------------------------------------------------------


async def run_cma_baseline(config: Optional[EvolveConfig] = None, *, evaluator: Optional[Evaluator] = None,
                           on_generation: Optional[Callable[[dict[str, Any]], None]] = None) -> dict[str, Any]:
    """Plain CMA-ES (the ``cma`` package) on real returns under the same
    real-episode budget: each candidate is scored on all training start
    states, exactly the objective the loop's target is defined on."""
    import cma

    cfg = config or EvolveConfig()
    cfg.validate()
    log = get_logger("agents.se_darwin", agent="cma_baseline")
    starts = task.start_states(cfg.seed)
    evaluator = evaluator or Evaluator(cfg.env_id, workers=cfg.workers, timeout_s=cfg.eval_timeout_s, memory_limit_mb=cfg.eval_memory_mb)
    started = time.perf_counter()
    es = cma.CMAEvolutionStrategy(np.zeros(task.N_PARAMS), 0.5, {"seed": cfg.seed + 1, "verbose": -9})
    episodes, generation, reached_at = 0, 0, None
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
                res = await asyncio.to_thread(evaluator.evaluate, x, starts.train)
                episodes += per_candidate
                scores.append(res.mean_return)
                if res.mean_return > best_f:
                    best_x, best_f = np.asarray(x), res.mean_return
                if res.mean_return >= cfg.target:
                    reached_at = episodes
                    break
            if len(scores) == len(xs):
                es.tell(xs, [-s for s in scores])
            record = {"generation": generation, "real_episodes": episodes, "best_return": best_f, "wm_val_loss": None, "precision": "none"}
            generations.append(record)
            log.info("evolve.generation", generation=generation, real_episodes=episodes, best_return=best_f, wm_val_loss=None, precision="none")
            if on_generation is not None:
                on_generation(record)
            generation += 1
        heldout = await asyncio.to_thread(evaluator.evaluate, best_x, starts.heldout) if best_x is not None else None
    finally:
        evaluator.close()
    return {
        "mode": "cma",
        "env": cfg.env_id,
        "seed": cfg.seed,
        "budget": cfg.budget,
        "target": cfg.target,
        "real_episodes": episodes,
        "episodes_to_target": reached_at,
        "target_reached": reached_at is not None,
        "train_return": best_f if best_x is not None else None,
        "heldout_return": heldout.mean_return if heldout is not None else None,
        "heldout_episodes": len(starts.heldout),
        "precision": "none",
        "wall_s": time.perf_counter() - started,
        "stop_reason": "target" if reached_at is not None else "budget",
        "generations": generations,
        "config": asdict(cfg),
    }

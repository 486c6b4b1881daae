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
import os
import time
import uuid
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from genesis_fp16.telemetry import get_logger
from infrastructure.replay_buffer import ReplayBuffer, trajectories_from_episodes

from . import pendulum_task as task
from . import runs
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

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "params": [float(v) for v in self.params]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Candidate":
        return cls(**{**data, "params": np.asarray(data["params"], dtype=float)})


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
    committed generation (the CLI's progress display). :meth:`resume`
    continues an interrupted run from its manifest (see ``agents.runs``)."""

    def __init__(
        self,
        config: Optional[EvolveConfig] = None,
        *,
        settings: Any = None,
        buffer: Optional[ReplayBuffer] = None,
        world_model: Any = None,
        evaluator: Optional[Evaluator] = None,
        on_generation: Optional[Callable[[dict[str, Any]], None]] = None,
        run_id: Optional[str] = None,
    ) -> None:
        from genesis_fp16.settings import load_settings

        self.config = config or EvolveConfig()
        self.config.validate()
        self.settings = settings or load_settings()
        self.run_id = run_id or f"seed{self.config.seed}-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
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
        self.generation = -1  # the last committed generation
        self.reached_at: Optional[int] = None  # real episodes spent when the target was met
        self.resumed_from: Optional[dict[str, Any]] = None
        self._lock = runs.RunLock(Path(self.settings.state_dir), self.run_id)
        self._manifest: dict[str, Any] = {
            "run_id": self.run_id, "data_agent": self.data_agent, "status": "new", "started": time.time(),
            "pid": os.getpid(), "sessions": [],
        }
        self._prior_wall_s = 0.0  # wall time of earlier sessions of this run
        self._log = get_logger("agents.se_darwin", agent=self.config.agent, run_id=self.run_id)

    def _make_world_model(self) -> Any:
        import torch

        from infrastructure.world_model import WorldModel

        from genesis_fp16.guard import RollbackGuard

        torch.manual_seed(self.config.seed)
        guard = RollbackGuard(self.config.wm_agent, settings=self.settings)
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
        """Run (or, after :meth:`resume`, continue) the loop, then the held-out
        evaluation of the best candidate; returns the report."""
        started = time.perf_counter()
        self._begin_session()
        try:
            stop_reason = await self._loop(started)
            best = best_of([c for c in self.pool if c.full]) or best_of(self.pool)
            heldout = await self._real(best.params, self.starts.heldout) if best is not None else None
        except (asyncio.CancelledError, KeyboardInterrupt):
            self._log.warning(
                "evolve.interrupted", generation=self.generation + 1, real_episodes=self.real_episodes, replay_db=str(self.buffer.path)
            )
            self.evaluator.terminate()
            self._end_session("interrupted", started)
            raise
        except BaseException as exc:
            self._end_session("interrupted", started, error=f"{type(exc).__name__}: {exc}")
            raise
        self.evaluator.close()
        report = self._report(best, heldout, self.reached_at, stop_reason, self._wall_s(started))
        self._end_session("finished", started, report=report)
        self._log.info(
            "evolve.finished", **{k: report[k] for k in ("real_episodes", "train_return", "heldout_return", "target_reached", "precision", "wall_s")}
        )
        return report

    async def _loop(self, started: float) -> str:
        """Generations after the last committed one until the target or the
        budget; returns the stop reason."""
        cfg = self.config
        if self.generation < 0:
            # generation 0: exploratory policies to seed the model
            seeded = await self._seed_generation()
            if any(c.full and (c.real_return or -1e9) >= cfg.target for c, _ in seeded):
                self.reached_at = self.real_episodes
            await self._commit(0, seeded)
            await self._after_generation(0, [c for c, _ in seeded], started)
        generation = self.generation
        while self.reached_at is None:
            generation += 1
            if self.real_episodes + len(self.starts.train) > cfg.budget:
                return "budget"
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
                if cand.real_return >= cfg.target and self.reached_at is None:
                    self.reached_at = self.real_episodes
            await self._commit(generation, evaluated)
            await self._after_generation(generation, [c for c, _ in evaluated], started, proposals=cands)
        return "target"

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
        self._save_progress(generation, started)  # committed: a resume continues after this generation
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

    # -- the run manifest (agents.runs): resume and retention ----------------------------
    @property
    def manifest_path(self) -> Path:
        return runs.manifest_path(Path(self.settings.state_dir), self.run_id)

    def _wall_s(self, started: float) -> float:
        """Wall time of every session of this run so far."""
        return self._prior_wall_s + time.perf_counter() - started

    def _write_manifest(self, **fields: Any) -> None:
        self._manifest.update(fields)
        runs.write_manifest(Path(self.settings.state_dir), {**self._manifest, "config": asdict(self.config)})

    def _progress(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "real_episodes": self.real_episodes,
            "reached_at": self.reached_at,
            "rng": self.rng.bit_generator.state,
            "pool": [c.as_dict() for c in self.pool],
            "generations": self.generations,
        }

    def _begin_session(self) -> None:
        if not self._lock.acquire():
            raise runs.RunError(f"run {self.run_id!r} is running in another process; wait for it to end, then resume it")
        self._manifest["sessions"].append(
            {"started": time.time(), "pid": os.getpid(), "from_generation": self.generation, "real_episodes": self.real_episodes}
        )
        try:
            self._write_manifest(status="running", pid=os.getpid(), wall_s=self._prior_wall_s, **self._progress())
        except BaseException:
            self._lock.release()
            raise

    def _save_progress(self, generation: int, started: float) -> None:
        """After a committed generation: a world-model snapshot named after
        it (so the manifest never points at weights of a later, uncommitted
        generation), then the manifest, then the previous snapshot goes."""
        self.generation = generation
        previous = self._manifest.get("world_model_checkpoint")
        snapshot = previous
        if self.world_model is not None and self.world_model.trained:
            snapshot = f"resume-g{generation:04d}.pt"
            self.world_model.save(runs.world_model_dir(Path(self.settings.state_dir), self.run_id) / snapshot)
        self._write_manifest(world_model_checkpoint=snapshot, wall_s=self._wall_s(started), **self._progress())
        if previous and previous != snapshot:
            (runs.world_model_dir(Path(self.settings.state_dir), self.run_id) / previous).unlink(missing_ok=True)

    def _end_session(self, status: str, started: float, *, error: Optional[str] = None, report: Optional[dict[str, Any]] = None) -> None:
        """Record how the session ended and let go of the run; never raises
        (it runs on the way out of a failure too)."""
        update: dict[str, Any] = {"status": status, "ended": time.time(), "wall_s": self._wall_s(started), "error": error}
        snapshot = self._manifest.get("world_model_checkpoint")
        if report is not None:
            update.update(report={k: report[k] for k in _SUMMARY_KEYS}, world_model_checkpoint=None)
        try:
            self._write_manifest(**update)
            if report is not None and snapshot:  # a finished run is never resumed: its snapshot is dead weight
                (runs.world_model_dir(Path(self.settings.state_dir), self.run_id) / snapshot).unlink(missing_ok=True)
        except (runs.RunStorageError, OSError) as exc:
            self._log.warning("evolve.manifest_unwritten", status=status, error=str(exc))
        finally:
            self._lock.release()

    @classmethod
    def resume(
        cls,
        run_id: str,
        *,
        settings: Any = None,
        budget: Optional[int] = None,
        workers: Optional[int] = None,
        options: Optional[dict[str, Any]] = None,
        buffer: Optional[ReplayBuffer] = None,
        evaluator: Optional[Evaluator] = None,
        on_generation: Optional[Callable[[dict[str, Any]], None]] = None,
    ) -> "SEDarwinAgent":
        """The interrupted run ``run_id``, ready to :meth:`evolve` on from its
        last committed generation: its own config (``budget`` may change it,
        ``workers`` too; every other option in ``options``, keyed as in
        :class:`EvolveConfig`, must equal the run's), pool, generator state,
        episodes spent and world-model snapshot. Replay rows of a generation
        that was cut off are deleted: that generation runs again. Raises
        :class:`agents.runs.RunError` when the run cannot be resumed."""
        from genesis_fp16.settings import load_settings

        settings = settings or load_settings()
        state_dir = Path(settings.state_dir)
        manifest = runs.read_manifest(state_dir, run_id)  # unknown id: an error, and no lock file made
        lock = runs.RunLock(state_dir, run_id)
        if not lock.acquire():
            raise runs.RunError(f"run {run_id!r} is running (pid {manifest.get('pid')}); wait for it to end or stop it, then resume it")
        try:
            manifest = runs.read_manifest(state_dir, run_id)  # as it is now that no one else writes it
            if manifest.get("status") == "finished":
                summary = ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in (manifest.get("report") or {}).items())
                raise runs.RunError(f"run {run_id!r} already finished ({summary}); nothing to resume. Start a new run without --resume")
            config = _resumed_config(manifest, budget=budget, workers=workers, options=options or {})
            agent = cls(config, settings=settings, buffer=buffer, evaluator=evaluator, on_generation=on_generation, run_id=run_id)
            agent._lock = lock
            agent._restore(manifest)
        except BaseException:
            lock.release()
            raise
        return agent

    def _restore(self, manifest: dict[str, Any]) -> None:
        from genesis_fp16.checkpoint import CheckpointError

        self.generation = int(manifest["generation"])
        self.real_episodes = int(manifest["real_episodes"])
        self.reached_at = manifest.get("reached_at")
        self.pool = [Candidate.from_dict(c) for c in manifest["pool"]]
        self.generations = list(manifest["generations"])
        self.rng.bit_generator.state = manifest["rng"]
        self._manifest.update({k: manifest[k] for k in ("started", "sessions", "world_model_checkpoint") if k in manifest})
        self._prior_wall_s = float(manifest.get("wall_s") or 0.0)
        if self.generation >= 0 and self.buffer.count(self.data_agent)["trajectories"] == 0:
            raise runs.RunError(
                f"run {self.run_id!r}: its replay data is gone from {self.buffer.path} (pruned, or another state dir); it cannot be resumed"
            )
        discarded = self.buffer.delete_generations_after(self.data_agent, self.generation)
        snapshot = manifest.get("world_model_checkpoint")
        if self.world_model is not None and snapshot:
            path = runs.world_model_dir(Path(self.settings.state_dir), self.run_id) / snapshot
            try:
                self.world_model.load(path)
            except CheckpointError as exc:
                raise runs.RunError(f"run {self.run_id!r}: its world-model snapshot cannot be loaded ({exc}); the run cannot be resumed") from None
            self.world_model.save()  # the model's own checkpoint (a rollback may restore it) matches the committed generation again
        self.resumed_from = {
            "generation": self.generation,
            "real_episodes": self.real_episodes,
            "discarded_trajectories": discarded,
            "session": len(self._manifest["sessions"]) + 1,
        }
        self._log.info("evolve.resumed", **self.resumed_from)

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
            "run_manifest": str(self.manifest_path),
            "resumed": self.resumed_from is not None,
            "resumed_from": self.resumed_from,
            "config": asdict(cfg),
        }


_CONFIG_FIELDS = {f.name for f in fields(EvolveConfig)}
_SUMMARY_KEYS = ("real_episodes", "target_reached", "episodes_to_target", "train_return", "heldout_return", "stop_reason")


def _resumed_config(manifest: dict[str, Any], *, budget: Optional[int], workers: Optional[int], options: dict[str, Any]) -> EvolveConfig:
    """The run's own config, with the budget and workers the caller may change."""
    run_id, saved = manifest["run_id"], dict(manifest["config"])
    unknown = sorted(set(saved) - _CONFIG_FIELDS)
    if unknown:
        raise runs.RunError(f"run {run_id!r}: its manifest has options this version does not know ({', '.join(unknown)}); resume it with the version that started it")
    mismatched = [f"{k}={v!r} (the run has {saved.get(k)!r})" for k, v in options.items() if saved.get(k) != v]
    if mismatched:
        raise runs.RunError(
            f"run {run_id!r} was started with other options: {'; '.join(mismatched)}. A resumed run keeps its own options "
            "(only --budget and --workers may change); resume it without these, or start a new run"
        )
    if budget is not None:
        spent = int(manifest["real_episodes"])
        if budget < spent:
            raise runs.RunError(f"budget={budget}: run {run_id!r} has already spent {spent} real episodes; expected a budget of at least {spent}")
        saved["budget"] = budget
    if workers is not None:
        saved["workers"] = workers
    return EvolveConfig(**saved)


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

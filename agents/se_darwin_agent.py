"""SE-Darwin: an evolution loop whose world model decides what is worth a
real evaluation.

Per generation::

    pool --revision / recombination / refinement--> proposals
    proposals --WorldModel.imagine (batched, cheap)--> ranked
    top-k --real episodes in worker processes (expensive, budgeted)--> returns
    trajectories --ReplayBuffer (one transaction)--> await WorldModel.train()

Generation 0 seeds the model: a few random policies, one real episode each.
The loop stops at the target (mean real return over the training start
states) or when the next real evaluation would exceed the episode budget;
a run in which every real evaluation failed stops as ``failed``.
With ``use_world_model=False`` the same operators run without a model
(refinement becomes a Gaussian step, nothing is ranked): the ablation the docs
measure.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np

from genesis_fp16.extras import require
from genesis_fp16.settings import Settings
from genesis_fp16.threads import torch_threads
from genesis_fp16.telemetry import get_logger
from infrastructure.replay_buffer import ReplayBuffer, trajectories_from_episodes

from . import runs
from .cma_baseline import run_cma_baseline
from .evaluation import Evaluation, EvaluationBackend, EvaluationEnvError, EvaluationError, EvaluationTimeout, Evaluator
from .evolve_config import EVOLVE, Candidate, EvolveConfig, resumed_config
from .evolve_report import generation_record, run_report
from .mujoco_log import mujoco_log_for
from .run_record import RunRecord
from .operators import ImagineFn, best_of, make_imagine, pool_failing, propose, recombination, refinement, revision
from .tasks import ImaginedStarts, Task

if TYPE_CHECKING:  # torch and the model load only when a run uses one
    from infrastructure.world_model import WorldModel

__all__ = [
    "Candidate", "EvolveConfig", "ImagineFn", "SEDarwinAgent", "best_of", "pool_failing", "propose", "recombination", "refinement",
    "revision", "run_cma_baseline",
]


class SEDarwinAgent(RunRecord):
    """Runs `evolve`. ``on_generation(record)`` is called after each
    committed generation (the CLI's progress display). `resume`
    continues an interrupted run from its manifest (see ``agents.runs``).
    ``task``: what to evolve (default: the task ``config.env_id`` names)."""

    def __init__(
        self,
        config: Optional[EvolveConfig] = None,
        *,
        task: Optional[Task] = None,
        settings: Optional[Settings] = None,
        buffer: Optional[ReplayBuffer] = None,
        world_model: Optional[WorldModel] = None,
        evaluator: Optional[EvaluationBackend] = None,
        on_generation: Optional[Callable[[dict[str, Any]], None]] = None,
        run_id: Optional[str] = None,
    ) -> None:
        from genesis_fp16.settings import load_settings

        require("gymnasium", EVOLVE)  # real episodes
        self.config, self.task = (config or EvolveConfig()).resolve(task)  # makes the env once: mujoco is loaded if it is MuJoCo
        if self.config.use_world_model:
            require("cma", EVOLVE)  # the operators' search inside the model
        self.settings = settings or load_settings()
        self.run_id = run_id or f"seed{self.config.seed}-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
        self.data_agent = f"{self.config.agent}:{self.run_id}"  # one run's data never trains another run's model
        self.buffer = buffer or ReplayBuffer(settings=self.settings)
        self.starts = self.task.start_states(self.config.seed)
        self.rng = np.random.default_rng(self.config.seed)
        self.world_model = world_model
        if self.config.use_world_model and self.world_model is None:
            self.world_model = self._make_world_model()
        self._imagined_starts: Optional[ImaginedStarts] = None
        if self.world_model is not None:  # resets only, no real episode; an env failing there fails here, before any
            self._imagined_starts = ImaginedStarts(self.task, self.starts.train, self.config.seed, self.config.extra_imagined_starts)
        self.evaluator = evaluator or self._make_evaluator()
        self.on_generation = on_generation
        self.pool: list[Candidate] = []
        self.real_episodes = 0
        self.env_steps = 0  # real env steps of the episodes that finished
        self.failures: list[dict[str, Any]] = []  # candidates charged and skipped, and why
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

    def _make_evaluator(self) -> EvaluationBackend:
        """The config's backend: the process pool, or Ray tasks on the connected cluster."""
        cfg = self.config
        if cfg.backend == "ray":
            from .ray_evaluation import RayEvaluator

            return RayEvaluator(self.task, workers=cfg.workers, timeout_s=cfg.eval_timeout_s, memory_limit_mb=cfg.eval_memory_mb)
        return Evaluator(self.task, workers=cfg.workers, timeout_s=cfg.eval_timeout_s, memory_limit_mb=cfg.eval_memory_mb,
                         mujoco_log=mujoco_log_for(self.settings))

    def _make_world_model(self) -> WorldModel:
        import torch

        from infrastructure.world_model import WorldModel

        torch.manual_seed(self.config.seed)
        assert self.config.wm_agent is not None  # resolve() names it after the task
        return WorldModel(  # guarded by its own RollbackGuard(wm_agent)
            self.task.policy.obs_dim, self.task.policy.act_dim, done_head=self.task.learns_termination, buffer=self.buffer,
            agent=self.config.wm_agent, data_agent=self.data_agent, settings=self.settings, precision=self.config.precision, seed=self.config.seed,
            checkpoint_dir=Path(self.settings.state_dir) / "world_model" / self.run_id,
        )

    # -- model-side helpers ---------------------------------------------------------------
    def _imagine_fn(self, generation: int) -> Optional[ImagineFn]:
        if self.world_model is None or self._imagined_starts is None or not self._has_data():
            return None  # an untrained model ranks nothing: propose as the ablation does
        cfg = self.config
        horizon = cfg.horizon or self.task.episode_steps
        return make_imagine(self.world_model, self.task, self._imagined_starts, generation=generation, horizon=horizon)

    def _propose(self, generation: int) -> list[Candidate]:
        return propose(self.pool, self.rng, self.config, generation, self._imagine_fn(generation), n_params=self.task.n_params)

    # -- the loop ------------------------------------------------------------------------------
    async def _real(self, params: np.ndarray, states: np.ndarray) -> Evaluation:
        return await asyncio.to_thread(self.evaluator.evaluate, params, states)

    async def _seed_generation(self) -> list[tuple[Candidate, Evaluation]]:
        cfg = self.config
        params = self.task.policy.random_params(self.rng, cfg.init_candidates, 1.0)
        n_train = len(self.starts.train)
        cands = []
        for k, p in enumerate(params):
            state = self.starts.train[(k * max(1, n_train // cfg.init_candidates)) % n_train]
            cands.append((Candidate(f"g0-{k}-seed", p, "seed", 0), state))
        out = []
        # an env that raises loses its own candidate only: the others' episodes ran and count
        results = await asyncio.to_thread(
            functools.partial(self.evaluator.evaluate_many, [(c.params, [s]) for c, s in cands], per_job_env_errors=True)
        )
        for (cand, _), res in zip(cands, results):
            self.real_episodes += 1
            if isinstance(res, EvaluationEnvError):
                self._charge_failure(cand, res, episodes=1)
                continue
            cand.real_return = res.mean_return
            cand.real_episodes = 1
            cand.full = n_train == 1
            self.env_steps += res.env_steps
            out.append((cand, res))
        return out

    async def _real_or_charged(self, cand: Candidate, states: np.ndarray) -> Optional[Evaluation]:
        """A real evaluation, or None when it failed (timeout, memory limit, the
        env raised): the candidate is then scored -inf, kept in the pool and
        the failure recorded; the caller charges its episodes."""
        try:
            return await self._real(cand.params, states)
        except EvaluationError as exc:
            self._charge_failure(cand, exc, episodes=len(states))
            return None

    def _charge_failure(self, cand: Candidate, exc: EvaluationError, *, episodes: int) -> None:
        """Score a failed candidate -inf, keep it in the pool, record why and
        how many real episodes it was charged."""
        cand.real_return, cand.full = float("-inf"), True
        event = "evolve.candidate_timeout" if isinstance(exc, EvaluationTimeout) else "evolve.candidate_failed"
        self._log.warning(event, candidate=cand.id, error=str(exc))
        self.failures.append({"candidate": cand.id, "generation": cand.generation, "episodes": episodes, "error": str(exc)})
        self.pool.append(cand)

    def _has_data(self) -> bool:
        """Whether any real evaluation succeeded: only then has the replay
        buffer a trajectory the world model can learn from."""
        return best_of(self.pool) is not None

    async def evolve(self) -> dict[str, Any]:
        """Run (or, after `resume`, continue) the loop, then the held-out
        evaluation of the best candidate; returns the report."""
        started = time.perf_counter()
        self._begin_session()
        try:
            with torch_threads(self.settings.torch_threads):
                stop_reason = await self._loop(started)
            if not self._has_data():
                stop_reason = "failed"  # the budget went on evaluations that all failed
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
            # any other error (a precision the device cannot run, a bad checkpoint, ...): the
            # workers must not outlive the run, or the caller's interpreter waits on them at exit
            self.evaluator.terminate()
            self.evaluator.close()
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
            if any(c.meets(cfg.target) for c, _ in seeded):
                self.reached_at = self.real_episodes
            await self._commit(0, seeded)
            await self._after_generation(0, [c for c, _ in seeded], started)
        generation = self.generation
        while self.reached_at is None:
            generation += 1
            if self.real_episodes + len(self.starts.train) > cfg.budget:
                return "budget"
            promoted = self._promotable()
            cands = [promoted] if promoted is not None else await asyncio.to_thread(self._propose, generation)
            evaluated = []
            for cand in cands[: cfg.eval_top_k]:
                if self.real_episodes + len(self.starts.train) > cfg.budget or self.reached_at is not None:
                    break
                res = await self._real_or_charged(cand, self.starts.train)
                if res is None:
                    self.real_episodes += len(self.starts.train)  # spent, even if lost
                    continue
                cand.real_return, cand.real_episodes, cand.full = res.mean_return, len(res.returns), True
                self.real_episodes += len(res.returns)
                self.env_steps += res.env_steps
                evaluated.append((cand, res))
                if cand.real_return >= cfg.target and self.reached_at is None:
                    self.reached_at = self.real_episodes
            await self._commit(generation, evaluated)
            await self._after_generation(generation, [c for c, _ in evaluated], started, proposals=[] if promoted else cands)
        return "target"

    def _promotable(self) -> Optional[Candidate]:
        """The best candidate whose single real episode already met the target
        (a generation-0 probe): it gets a full evaluation before anything new
        is proposed, so a lucky probe is verified instead of outranked by
        worse full evaluations (MountainCar: a random policy that finds the flag)."""
        target = self.config.target
        probes = [c for c in self.pool if not c.full and c.real_return is not None and c.real_return >= target]
        return max(probes, key=lambda c: c.real_return) if probes else None

    async def _commit(self, generation: int, evaluated: Sequence[tuple[Candidate, Evaluation]]) -> None:
        """Outcomes to the replay buffer (one transaction per generation) and
        the candidates to the pool."""
        trajs = []
        for cand, res in evaluated:
            outcome = "target" if cand.meets(self.config.target) else ("full" if cand.full else "probe")
            trajs += trajectories_from_episodes(res.episodes, cand.id, outcome)
            if not any(c is cand for c in self.pool):  # a promoted probe is in the pool already
                self.pool.append(cand)
        if trajs:
            await self.buffer.aappend_generation(self.data_agent, generation, trajs)

    async def _after_generation(self, generation: int, evaluated: Sequence[Candidate], started: float, proposals: Sequence[Candidate] = ()) -> None:
        """The world model learns from everything so far (unless the target is
        met), then the generation's record is committed to the manifest."""
        wm_report = None
        reached = not pool_failing(self.pool, self.config.target)
        if self.world_model is not None and not reached and self._has_data():
            wm_report = await self.world_model.train(self.config.wm_steps)
        record = generation_record(
            generation, real_episodes=self.real_episodes, env_steps=self.env_steps, best=best_of(self.pool), evaluated=evaluated,
            proposals=len(proposals), wm_report=wm_report, precision=self._precision(), elapsed_s=time.perf_counter() - started,
        )
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

    # -- the run manifest (agents.runs): resume and retention; writing it is RunRecord's ----------
    def _progress(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "real_episodes": self.real_episodes,
            "env_steps": self.env_steps,
            "failures": self.failures,
            "reached_at": self.reached_at,
            "rng": self.rng.bit_generator.state,
            "pool": [c.as_dict() for c in self.pool],
            "generations": self.generations,
        }

    @classmethod
    def resume(
        cls,
        run_id: str,
        *,
        settings: Optional[Settings] = None,
        budget: Optional[int] = None,
        workers: Optional[int] = None,
        backend: Optional[str] = None,
        options: Optional[dict[str, Any]] = None,
        task: Optional[Task] = None,
        buffer: Optional[ReplayBuffer] = None,
        evaluator: Optional[EvaluationBackend] = None,
        on_generation: Optional[Callable[[dict[str, Any]], None]] = None,
    ) -> "SEDarwinAgent":
        """The interrupted run ``run_id``, ready to `evolve` on from its
        last committed generation: its own config (``budget`` may change it,
        ``workers`` and ``backend`` too; every other option in ``options``, keyed as in
        `EvolveConfig`, must equal the run's; ``task`` for a run of a
        task that is not registered), pool, generator state,
        episodes spent and world-model snapshot. Replay rows of a generation
        that was cut off are deleted: that generation runs again. Raises
        `agents.runs.RunError` when the run cannot be resumed."""
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
            config = resumed_config(manifest, budget=budget, workers=workers, options=options or {}, backend=backend)
            agent = cls(config, task=task, settings=settings, buffer=buffer, evaluator=evaluator, on_generation=on_generation, run_id=run_id)
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
        self.env_steps = int(manifest.get("env_steps") or 0)
        self.failures = list(manifest.get("failures") or [])
        self.reached_at = manifest.get("reached_at")
        self.pool = [Candidate.from_dict(c) for c in manifest["pool"]]
        self.generations = list(manifest["generations"])
        self.rng.bit_generator.state = manifest["rng"]
        self._manifest.update({k: manifest[k] for k in ("started", "sessions", "world_model_checkpoint") if k in manifest})
        self._prior_wall_s = float(manifest.get("wall_s") or 0.0)
        # a run whose every evaluation so far failed has no replay data, and needs none
        if self.generation >= 0 and self._has_data() and self.buffer.count(self.data_agent)["trajectories"] == 0:
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
        return self.world_model.precision

    def _report(self, best: Optional[Candidate], heldout: Optional[Evaluation], reached_at: Optional[int], stop_reason: str, wall_s: float) -> dict[str, Any]:
        return run_report(
            self.config, best=best, heldout=heldout, heldout_episodes=len(self.starts.heldout), real_episodes=self.real_episodes,
            env_steps=self.env_steps, failures=self.failures,
            reached_at=reached_at, precision=self._precision(), wall_s=wall_s, stop_reason=stop_reason,
            generations=self.generations, run_id=self.run_id, replay_db=str(self.buffer.path),
            run_manifest=str(self.manifest_path), resumed_from=self.resumed_from, train_start_states=len(self.starts.train),
        )

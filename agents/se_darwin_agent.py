"""SE-Darwin: an evolution loop whose world model decides what is worth a
real evaluation.

Per generation::

    pool --revision / recombination / refinement, in normalised coordinates--> proposals
    proposals --WorldModel.imagine_uncertain (batched, pessimistic)--> ranked
    top-k --raced real episodes in worker processes (expensive, budgeted)--> returns
    the same start states, imagined again --> how well the model predicted them
    trajectories --ReplayBuffer (one transaction)--> await WorldModel.train()

Only while the model has shown that it ranks (the rank correlation of its
imagined against the real returns of the last audited candidates) do its
proposals get the real episodes; before that, and whenever it falls below,
a generation is a probe generation (`agents.probe_search`): CMA-ES on
one-episode probes, its mean raced, every probe audited.

Generation 0 seeds the model: a few random policies, one real episode each.
The loop stops when a candidate's mean real return over every training start
state meets the target and its mean over the validation start states
confirms it, or when the next real evaluation could exceed a budget (real
episodes, real env steps); a run in which every real evaluation failed
stops as ``failed``. With ``use_world_model=False`` the same operators run
without a model (refinement becomes a Gaussian step, nothing is ranked): the
ablation the docs measure.
"""

from __future__ import annotations

import asyncio
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
from .evaluation import Evaluation, EvaluationBackend, Evaluator
from .evolve_config import EVOLVE, Candidate, EvolveConfig, default_horizon
from .evolve_report import generation_record, last_training, run_report
from .imagination import ImagineFn, Imaginer, audit, make_imagine
from .mujoco_log import mujoco_log_for
from .operators import best_of, pool_failing, propose, recombination, refinement, revision
from .probe_search import ProbeSearch, trust
from .real_episodes import RealEpisodes
from .run_record import RunRecord
from .search_space import ObsStats
from .tasks import ImaginedStarts, Task
from .time_share import TimeShare

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
        self._log = get_logger("agents.se_darwin", agent=self.config.agent, run_id=self.run_id)
        self.buffer = buffer or ReplayBuffer(settings=self.settings)
        self.starts = self.task.start_states(self.config.seed)
        self.rng = np.random.default_rng(self.config.seed)
        self.world_model = world_model
        if self.config.use_world_model and self.world_model is None:
            self.world_model = self._make_world_model()
        self._imagined_starts: Optional[ImaginedStarts] = None
        if self.world_model is not None:  # resets only, no real episode; an env failing there fails here, before any
            self._imagined_starts = ImaginedStarts(self.task, self.starts.train, self.config.seed, self.config.imagine_starts)
        self._imaginer: Optional[Imaginer] = None  # the current generation's
        self._trust_rho: Optional[float] = None  # the rank correlation the last trust decision saw
        self.time = TimeShare()
        self.evaluator = evaluator or self._make_evaluator()
        self.real = RealEpisodes(self.evaluator, self.config, self.starts, self.time, self._log)
        self.obs_stats = ObsStats(self.task.policy.obs_dim)  # the search's coordinates (agents.search_space)
        self.probe = ProbeSearch(seed=self.config.seed, sigma0=self.config.probe_sigma, popsize=self.config.probe_popsize)
        self.on_generation = on_generation
        self.pool: list[Candidate] = []
        self.generations: list[dict[str, Any]] = []
        self.generation = -1  # the last committed generation
        self.reached_at: Optional[int] = None  # real episodes spent when the target was met and confirmed
        self.budget_exhausted: Optional[str] = None  # "episodes" or "env_steps": the budget that stopped the run
        self.unconfirmed: Optional[str] = None  # a candidate that met the target with no budget left to confirm it
        self.resumed_from: Optional[dict[str, Any]] = None
        self._lock = runs.RunLock(Path(self.settings.state_dir), self.run_id)
        self._manifest: dict[str, Any] = {
            "run_id": self.run_id, "data_agent": self.data_agent, "status": "new", "started": time.time(),
            "pid": os.getpid(), "sessions": [],
        }
        self._prior_wall_s = 0.0  # wall time of earlier sessions of this run

    @property
    def real_episodes(self) -> int:
        """Real episodes charged so far (`RealEpisodes`), every session of the run."""
        return self.real.real_episodes

    @property
    def env_steps(self) -> int:
        """Real env steps of the episodes that finished."""
        return self.real.env_steps

    @property
    def failures(self) -> list[dict[str, Any]]:
        """Candidates charged and skipped, and why."""
        return self.real.failures

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
            ensemble=self.config.ensemble, probabilistic=self.config.ensemble > 1,
            checkpoint_dir=Path(self.settings.state_dir) / "world_model" / self.run_id,
        )

    # -- model-side helpers ---------------------------------------------------------------
    def _make_imaginer(self, generation: int) -> Optional[Imaginer]:
        if self.world_model is None or self._imagined_starts is None or not self._has_data():
            return None  # an untrained model ranks nothing: propose as the ablation does
        cfg = self.config
        return make_imagine(self.world_model, self.task, self._imagined_starts, generation=generation, horizon=cfg.horizon or default_horizon(self.task.episode_steps),
                            kappa=cfg.kappa, particles=cfg.particles, seed=cfg.seed, time=self.time)

    def _propose(self, generation: int) -> list[Candidate]:
        """The generation's proposals, searched in the coordinates of the
        observation statistics so far; the time outside imagination is the search's."""
        started, imagined = time.perf_counter(), self.time.seconds["imagine"]
        space = self.obs_stats.space(self.task.policy)
        imaginer = self._imaginer = self._make_imaginer(generation)
        score = None if imaginer is None else (lambda z: imaginer.score(space.to_raw(z)))
        cands = propose(self.pool, self.rng, self.config, generation, score, n_params=self.task.n_params, space=space)
        self.time.add("search", time.perf_counter() - started - (self.time.seconds["imagine"] - imagined))
        return cands

    def _audit(self, evaluated: Sequence[tuple[Candidate, Evaluation]], every: bool = False) -> Optional[dict[str, Any]]:
        """The generation's imagined-vs-real comparison (`agents.imagination.audit`); None without a model."""
        if self._imaginer is None or self._imagined_starts is None:
            return None
        return audit(self._imaginer, self._imagined_starts, [c for c, _ in evaluated], every=every)

    def _has_data(self) -> bool:
        """Whether any real evaluation succeeded: only then has the replay
        buffer a trajectory the world model can learn from."""
        return best_of(self.pool) is not None

    # -- the loop ------------------------------------------------------------------------------
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
            heldout = await asyncio.to_thread(self.evaluator.evaluate, best.params, self.starts.heldout) if best is not None else None
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
        report = self._report(best, heldout, stop_reason, self._wall_s(started))
        self._end_session("finished", started, report=report)
        self._log.info(
            "evolve.finished", **{k: report[k] for k in ("real_episodes", "train_return", "heldout_return", "target_reached", "precision", "wall_s")}
        )
        return report

    async def _loop(self, started: float) -> str:
        """Generations after the last committed one until the target (met on
        every training start state and confirmed on the validation ones) or a
        budget; returns the stop reason."""
        cfg, n_train = self.config, len(self.starts.train)
        assert cfg.target is not None
        if self.generation < 0:
            # generation 0: exploratory policies, one episode each, to seed the model
            clock = self.time.snapshot()
            step = max(1, n_train // cfg.init_candidates)
            params = self.task.policy.random_params(self.rng, cfg.init_candidates, 1.0)
            probes = [(Candidate(f"g0-{k}-seed", p, "seed", 0), (k * step) % n_train) for k, p in enumerate(params)]
            seeded = await self.real.probe(probes)
            self.pool += [c for c, _ in probes if not any(c is s for s, _ in seeded)]  # failed: scored -inf, kept, charged
            for cand, _ in seeded:
                if cand.meets(cfg.target) and self.reached_at is None and self.budget_exhausted is None:
                    await self._confirm(cand, 0)
            await self._commit(0, seeded)
            await self._after_generation(0, [c for c, _ in seeded], started, clock)
        generation = self.generation
        while self.reached_at is None and self.budget_exhausted is None:
            generation += 1
            self.budget_exhausted = self.real.over_budget(n_train)
            if self.budget_exhausted is not None:
                break
            clock = self.time.snapshot()
            promoted = self._promotable()
            if promoted is None and not self._trusted():
                # a round and the race after it must fit; where not, the search's mean is raced alone (its final
                # answer), and once that is done the model's proposals get what is left
                final = self.real.over_budget(self.probe.size(self.task.n_params) + 1 + n_train) is not None
                if not final or self.probe.active():
                    await self._probe_generation(generation, started, clock, final=final)
                    continue
            cands = [promoted] if promoted is not None else await asyncio.to_thread(self._propose, generation)
            evaluated: list[tuple[Candidate, Evaluation]] = []
            for cand in cands[: cfg.eval_top_k]:
                if self.real.over_budget(n_train) is not None or self.reached_at is not None or self.budget_exhausted is not None:
                    break
                await self._race(cand, self._incumbent([c for c, _ in evaluated]), evaluated, generation)
            audit = self._audit(evaluated) if promoted is None else None
            await self._commit(generation, evaluated)
            await self._after_generation(generation, [c for c, _ in evaluated], started, clock, proposals=[] if promoted else cands, audit=audit)
        return "target" if self.reached_at is not None else "budget"

    def _trusted(self) -> bool:
        """Whether the model's proposals get this generation's real episodes (`agents.probe_search.trust`); always
        without a model (the ablation proposes blind) or with ``trust_spearman`` None."""
        cfg = self.config
        if self.world_model is None or cfg.trust_spearman is None:
            return True
        trusted, self._trust_rho = trust(self.generations, threshold=cfg.trust_spearman, window=cfg.trust_window)
        return trusted

    async def _probe_generation(self, generation: int, started: float, clock: dict[str, float], *, final: bool) -> None:
        """A probe round (`agents.probe_search`): the search's mean and population, one real episode each on one
        training start state, CMA-ES told the returns, the mean raced when due; ``final``: the mean raced alone."""
        n_train, space, incumbent = len(self.starts.train), self.obs_stats.space(self.task.policy), self._incumbent([])
        if not self.probe.active():
            self.probe.start(space.to_z((incumbent or best_of(self.pool) or self.pool[0]).params), generation)
        info = {"trust_spearman": self._trust_rho, "sigma": self.probe.sigma, "probes": 0 if final else self.probe.population + 1,
                "segment": len(self.probe.segments) - 1, "final": final}
        state = self.real.order[self.probe.rounds % n_train]  # every probe of a round on one start state: paired, and audited alike
        mean = Candidate(f"g{generation}-mean-probe", space.to_raw(self.probe.mean), "probe_mean", generation)
        imaginer = self._imaginer = self._make_imaginer(generation)
        # while the model ranks at all (correlation > 0), it screens: CMA-ES samples `screen` populations, its imagination picks one
        info["screened"] = screen = self.config.probe_screen if imaginer is not None and not final and (self._trust_rho or 0.0) > 0 else 1
        zs = np.empty((0, self.task.n_params)) if final else self.probe.ask((lambda z: imaginer.score(space.to_raw(z))) if screen > 1 else None, screen)
        probes = [] if final else [(mean, state)] + [
            (Candidate(f"g{generation}-{k}-probe", space.to_raw(z), "probe", generation), state) for k, z in enumerate(zs)]
        self.probe.rounds += 1
        results = await self.real.probe(probes) if probes else []
        self.pool += [c for c, _ in probes if not any(c is r for r, _ in results)]  # failed: scored -inf, kept, charged
        evaluated: list[tuple[Candidate, Evaluation]] = list(results)
        base = incumbent.start_returns()[state] if incumbent is not None else 0.0  # a constant within the round: CMA-ES ranks alike
        gains = [c.real_return - base if c.real_return is not None else -np.inf for c, _ in probes]
        if final:
            self.probe.end()
        else:
            self.probe.tell(generation, gains[1:])
        for cand, _ in results:
            if cand.meets(self.config.target):  # a task with one training start state
                await self._confirm(cand, generation)
        last = final or self.real.over_budget(n_train + len(probes)) is not None  # no later round could race it
        meets = mean.real_return is not None and mean.real_return >= self.config.target
        if (final or self.probe.race_due(incumbent is not None, gains[0], meets=meets, last=last)) and self.reached_at is None \
                and self.budget_exhausted is None and self.real.over_budget(n_train) is None:
            self.probe.raced = self.probe.rounds
            await self._race(Candidate(f"g{generation}-mean", mean.params, "probe_mean", generation), incumbent, evaluated, generation)
        audit = self._audit(evaluated, every=True)
        await self._commit(generation, evaluated)
        await self._after_generation(generation, [c for c, _ in evaluated], started, clock, audit=audit, probe=info)

    async def _race(self, cand: Candidate, incumbent: Optional[Candidate], evaluated: list[tuple[Candidate, Evaluation]],
                    generation: int) -> None:
        """Race ``cand`` against ``incumbent``: evaluated, it joins ``evaluated`` (and is confirmed if it meets the
        target); failed, it joins the pool scored -inf (charged)."""
        res = await self.real.race(cand, incumbent)
        if res is None:
            self.pool.append(cand)
            return
        evaluated.append((cand, res))
        if cand.meets(self.config.target):
            await self._confirm(cand, generation)

    async def _confirm(self, cand: Candidate, generation: int) -> None:
        """A candidate met the target on every training start state: the run
        stops once the validation start states confirm it, or (unconfirmed)
        when the budgets have no room to try."""
        confirmed = await self.real.confirm(cand, generation)
        if confirmed is None:
            self.budget_exhausted = self.real.over_budget(len(self.starts.validation))
            self.unconfirmed = cand.id
        elif confirmed:
            self.reached_at = self.real_episodes

    def _incumbent(self, evaluated: Sequence[Candidate]) -> Optional[Candidate]:
        """The best fully evaluated candidate so far, this generation's included: what a raced candidate must beat."""
        return best_of([c for c in [*self.pool, *evaluated] if c.full])

    def _promotable(self) -> Optional[Candidate]:
        """The best candidate whose single real episode already met the target
        (a generation-0 probe): it gets a full evaluation before anything new
        is proposed, so a lucky probe is verified instead of outranked by
        worse full evaluations (MountainCar: a random policy that finds the flag)."""
        target = self.config.target
        probes = [c for c in self.pool if not c.full and c.real_episodes == 1 and c.real_return is not None and c.real_return >= target]
        return max(probes, key=lambda c: c.real_return) if probes else None

    async def _commit(self, generation: int, evaluated: Sequence[tuple[Candidate, Evaluation]]) -> None:
        """Outcomes to the replay buffer (one transaction per generation), the
        candidates to the pool, their observations to the search's statistics."""
        trajs = []
        scale = np.asarray(self.task.policy.obs_scale, dtype=np.float64)
        for cand, res in evaluated:
            outcome = "target" if cand.meets(self.config.target) else ("full" if cand.full else "probe")
            trajs += trajectories_from_episodes(res.episodes, cand.id, outcome)
            for episode in res.episodes:
                if "obs" in episode:
                    self.obs_stats.update(np.asarray(episode["obs"], dtype=np.float64) * scale)
            if not any(c is cand for c in self.pool):  # a promoted probe is in the pool already
                self.pool.append(cand)
        if trajs:
            await self.buffer.aappend_generation(self.data_agent, generation, trajs)

    async def _after_generation(
        self, generation: int, evaluated: Sequence[Candidate], started: float, clock: dict[str, float], proposals: Sequence[Candidate] = (),
        audit: Optional[dict[str, Any]] = None, probe: Optional[dict[str, Any]] = None,
    ) -> None:
        """The world model learns from everything so far (unless the target is
        met), then the generation's record is committed to the manifest."""
        wm_report = None
        if self.world_model is not None and self.reached_at is None and self._has_data():
            with self.time.measure("model_train"):
                wm_report = await self.world_model.train(self.config.wm_steps)
        record = generation_record(
            generation, real_episodes=self.real_episodes, env_steps=self.env_steps, best=best_of(self.pool), evaluated=evaluated,
            proposals=len(proposals), wm_report=wm_report, precision=self._precision(), elapsed_s=time.perf_counter() - started,
            precision_decision=last_training(self.generations)[1],
            imagination=audit, time=self.time.since(clock), confirmations=[c for c in self.real.confirmations if c["generation"] == generation], probe=probe,
        )
        self._save_progress(generation, started, record)  # committed: a resume continues after this generation
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

    def _precision(self) -> str:
        """What the world model in use trained in (`last_training`), else what its trainer would run now."""
        return "none" if self.world_model is None else (last_training(self.generations)[0] or self.world_model.precision)

    def _report(self, best: Optional[Candidate], heldout: Optional[Evaluation], stop_reason: str, wall_s: float) -> dict[str, Any]:
        return run_report(
            self.config, best=best, heldout=heldout, heldout_episodes=len(self.starts.heldout), real_episodes=self.real_episodes,
            env_steps=self.env_steps, failures=self.failures, confirmations=self.real.confirmations,
            reached_at=self.reached_at, precision=self._precision(), wall_s=wall_s, stop_reason=stop_reason,
            budget_exhausted=self.budget_exhausted if stop_reason == "budget" else None, unconfirmed=self.unconfirmed,
            generations=self.generations, run_id=self.run_id, replay_db=str(self.buffer.path),
            run_manifest=str(self.manifest_path), resumed_from=self.resumed_from, train_start_states=len(self.starts.train),
            validation_start_states=len(self.starts.validation), time_share=self.time.report(wall_s),
        )

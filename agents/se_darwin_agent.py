"""SE-Darwin: CMA-ES carries the population; a critic and the world model,
learning from every real step, refine it by gradient (CEM-RL, Pourchot and
Sigaud 2019; MBPO's short branched rollouts, Janner et al. 2019).

Per generation::

    refinement: copies of the CMA-ES mean, ascended through the critic (and H model steps) --> injected
    CMA-ES --ask--> the population (refined copies first), normalised policy coordinates
    every candidate --ONE real episode, training start state c mod n--> returns --tell--> CMA-ES
    a candidate whose episode meets the target --the other training start states, then validation--> stop
    trajectories --ReplayBuffer (one transaction)--> await WorldModel.train()
        --> short model rollouts branched from real states --> critic.train(real + model transitions)

With ``refined=0`` (or neither critic nor model) the loop is a tuned
one-episode CMA-ES: the floor the refinement must beat. The run stops when a
candidate's mean over every training start state meets the target and the
validation start states confirm it, or when the next generation could exceed
a budget (real episodes, real env steps); a run in which every real
evaluation failed stops as ``failed``, and so does a run whose candidates of
one generation all failed with the same error (a broken env: `agents.fail_fast`),
after that generation. The answer of a run that did not
reach its target is the best of its fully evaluated candidates, the CMA-ES
mean (the tuned yardstick's answer), the refinement's last actor and the
candidate with the best one episode that was never fully evaluated, by
their training return.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

import numpy as np

from genesis_fp16.base.extras import require
from genesis_fp16.base.settings import Settings
from genesis_fp16.base.threads import torch_threads
from infrastructure.replay_buffer import ReplayBuffer, trajectories_from_episodes

from .evaluation import Evaluation, EvaluationBackend, EvaluationError, make_evaluator
from .evolve_config import EVOLVE, Candidate, EvolveConfig, resumed_config
from .evolve_report import candidates_record, generation_record, mode_of, run_report
from .fail_fast import common_error
from .extras import probing, refined_count, won_lately
from .learners import Learners
from .mujoco_log import mujoco_log_for
from .policies import policy_from_run
from .progress import ANSWER, HELDOUT, ProgressFn, RunProgress
from .real_episodes import RealEpisodes
from .run_record import RunRecorder, open_run
from .run_state import RunState, StopReason
from .runs import policy_path
from .tasks import ResolvedTask, Task
from .verify import near_miss_bar, return_scale

if TYPE_CHECKING:  # torch and the learners load only when a run uses them
    from infrastructure.critic import Critic
    from infrastructure.world_model import WorldModel

__all__ = ["Candidate", "EvolveConfig", "RunState", "SEDarwinAgent", "StopReason", "run_cma_baseline"]

ANSWER_EPISODE_BESTS = 3
"""The candidates with the best single episodes, never fully evaluated, that an unconfirmed run's answer weighs on the
training start states (beside the CMA-ES mean and the actor). One episode is one start state: on Hopper-v5 the best one
(a gait that scored 1122 once) fell on most of the others where a policy that stood (1038) held them. Measured on the
first budget of issue 55's table, seeds 1-5, the loop, its floor and the loop without the model (`benchmark_results/
discount_2026-11-29`, `t3_*`): three moved 17 answers, 16 up on the held-out states (Hopper-v5 15k seed 4 1153.2 to
1192.8, HalfCheetah-v5 seed 1 499.2 to 744.1) and one down by 0.5."""

HOPEFUL_EXTRAS = 2
"""The extras of one batch that met the target on their one episode and are verified, best first, until one is
accepted (CMA-ES's samples and a near miss: the best one). An extra is the learners' bid, rarely one of many: on
Pendulum-v1 with FP32 learners, seed 5, the first actor's lucky episode was refuted (its training mean -507) while
the copy of the CMA-ES mean beside it, -245 on its one episode, was never weighed, and the run paid CMA-ES's
population of 15 again (54 real episodes; 35 with the second verified: docs/EVOLUTION.md, "Near misses")."""


class SEDarwinAgent:
    """Runs `evolve`. ``on_generation(record)`` is called after each
    committed generation (the CLI's generation lines); ``on_progress(event)``
    as each real episode finishes and each phase of the run begins, advances
    and ends (`agents.progress`: the CLI's progress bar). ``started``: when the
    run's work began, a `time.perf_counter` value (default: when the
    constructor is entered; the CLI passes its process's start): the wall time
    counts from it, and what comes before `evolve` is its ``start_up``. `resume`
    continues an interrupted run from its manifest (see ``agents.runs``).
    ``task``: what to evolve (default: the task ``config.env_id`` names), or
    that task already resolved (`EvolveConfig.resolve`: the CLI's, taken as it is).
    ``state``: where the run starts from (default: nothing done yet;
    `resume` passes the one it read from the manifest, with the ``recorder``
    of that manifest, and the learners then load their snapshots)."""

    def __init__(
        self,
        config: Optional[EvolveConfig] = None,
        *,
        task: Union[Task, ResolvedTask, None] = None,
        settings: Optional[Settings] = None,
        buffer: Optional[ReplayBuffer] = None,
        world_model: Optional[WorldModel] = None,
        critic: Optional[Critic] = None,
        evaluator: Optional[EvaluationBackend] = None,
        on_generation: Optional[Callable[[dict[str, Any]], None]] = None,
        run_id: Optional[str] = None,
        state: Optional[RunState] = None,
        recorder: Optional[RunRecorder] = None,
        on_progress: Optional[ProgressFn] = None,
        started: Optional[float] = None,
    ) -> None:
        from genesis_fp16.base.settings import load_settings

        self.started = time.perf_counter() if started is None else started

        require("gymnasium", EVOLVE)  # real episodes
        require("cma", EVOLVE)
        self.config, self.task = (config or EvolveConfig()).resolve(
            task
        )  # the task resolved once: the env is made here
        self.settings = settings or load_settings()
        if recorder is not None and run_id not in (None, recorder.run_id):
            raise ValueError(f"run_id={run_id!r}: the recorder records run {recorder.run_id!r}")
        self.run_id = (
            recorder.run_id
            if recorder is not None
            else (run_id or f"seed{self.config.seed}-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}")
        )
        self.state = state if state is not None else RunState.new(self.config, self.task)
        self.recorder = recorder or RunRecorder(self.settings, self.config, self.run_id)
        self.data_agent, self._log = self.recorder.data_agent, self.recorder.log
        self.buffer = buffer or ReplayBuffer(settings=self.settings)
        self.starts = self.task.start_states(self.config.seed)
        self.progress = RunProgress(on_progress, episodes=lambda: self.state.spent.real_episodes)
        self.learners = Learners(
            self.config,
            self.task,
            self.settings,
            self.buffer,
            self.data_agent,
            self.run_id,
            self.state,
            world_model=world_model,
            critic=critic,
            progress=self.progress,
        )
        cfg = self.config
        self.evaluator = evaluator or make_evaluator(
            self.task,
            backend=cfg.backend,
            workers=cfg.workers,
            timeout_s=cfg.eval_timeout_s,
            memory_limit_mb=cfg.eval_memory_mb,
            mujoco_log=mujoco_log_for(self.settings),
        )
        self.real = RealEpisodes(
            self.evaluator, self.config, self.starts, self.time, self._log, self.state.spent, self.progress
        )
        self.on_generation = on_generation
        self.resumed_from: Optional[dict[str, Any]] = (
            self.recorder.resume_learners(self.state, self.learners, self.buffer) if self.recorder.resumed else None
        )

    @classmethod
    def resume(
        cls,
        run_id: str,
        *,
        settings: Optional[Settings] = None,
        budget: Optional[int] = None,
        budget_steps: Optional[int] = None,
        workers: Optional[int] = None,
        backend: Optional[str] = None,
        options: Optional[dict[str, Any]] = None,
        task: Optional[Task] = None,
        buffer: Optional[ReplayBuffer] = None,
        world_model: Optional[WorldModel] = None,
        critic: Optional[Critic] = None,
        evaluator: Optional[EvaluationBackend] = None,
        on_generation: Optional[Callable[[dict[str, Any]], None]] = None,
        on_progress: Optional[ProgressFn] = None,
        started: Optional[float] = None,
    ) -> "SEDarwinAgent":
        """The interrupted run ``run_id``, ready to `evolve` on from its
        last committed generation: its own config (``budget`` and
        ``budget_steps`` may change it, ``workers`` and ``backend`` too; every other option in ``options``, keyed as in
        `EvolveConfig`, must equal the run's; ``task`` for a run of a
        task that is not registered; ``world_model``, ``critic``, ``buffer`` and
        ``evaluator``, ``on_progress`` and ``started`` as in the constructor), and its `RunState` read once from
        the manifest (candidates, CMA-ES, episodes spent, the learners'
        snapshots). Replay rows of a generation that was cut off are deleted:
        that generation runs again. Raises `agents.runs.RunError` when the run
        cannot be resumed."""
        from genesis_fp16.base.settings import load_settings

        started = time.perf_counter() if started is None else started
        settings = settings or load_settings()
        manifest, lock = open_run(settings, run_id)
        try:
            config = resumed_config(
                manifest,
                budget=budget,
                budget_steps=budget_steps,
                workers=workers,
                options=options or {},
                backend=backend,
            )
            config, resolved = config.resolve(task)
            state = RunState.from_manifest(manifest, resolved)
            recorder = RunRecorder(settings, config, run_id, prior=manifest, lock=lock)
            return cls(
                config,
                task=resolved,
                settings=settings,
                buffer=buffer,
                world_model=world_model,
                critic=critic,
                evaluator=evaluator,
                on_generation=on_generation,
                state=state,
                recorder=recorder,
                on_progress=on_progress,
                started=started,
            )
        except BaseException:
            lock.release()
            raise

    world_model = property(
        lambda self: self.learners.world_model,
        doc="The world model (None until the run first trains it, and in the ablation without one).",
    )
    critic = property(
        lambda self: self.learners.critic,
        doc="The critic (None until the run first trains it, and in the ablation without one).",
    )
    generation = property(lambda self: self.state.generation, doc="The last committed generation (-1: none yet).")
    reached_at = property(
        lambda self: self.state.reached_at, doc="Real episodes spent when the target was met and confirmed."
    )
    search = property(lambda self: self.state.search, doc="CMA-ES over the search's coordinates (`RunState.search`).")
    obs_stats = property(lambda self: self.state.obs_stats, doc="The statistics of the search's coordinates.")
    pool = property(lambda self: self.state.pool, doc="Every candidate run, failed ones scored -inf.")
    generations = property(lambda self: self.state.generations, doc="The committed generations' records.")
    time = property(lambda self: self.state.time, doc="Where the run's wall time goes.")
    manifest_path = property(lambda self: self.recorder.manifest_path, doc="The run's manifest file.")

    @property
    def on_progress(self) -> Optional[ProgressFn]:
        """Called with each `agents.progress.ProgressEvent` (None: no events are made)."""
        return self.progress.fn

    @on_progress.setter
    def on_progress(self, fn: Optional[ProgressFn]) -> None:
        self.progress.fn = fn

    @property
    def real_episodes(self) -> int:
        """Real episodes charged so far, every session of the run (`RunState.spent`)."""
        return self.state.spent.real_episodes

    @property
    def env_steps(self) -> int:
        """Real env steps of the episodes that finished."""
        return self.state.spent.env_steps

    @property
    def failures(self) -> list[dict[str, Any]]:
        """Candidates charged and skipped, and why."""
        return self.state.spent.failures

    def committed(self) -> tuple[int, int]:
        """(generations, real episodes) committed to the manifest: what a
        resume continues after (the replay rows of a later generation are
        discarded then)."""
        return self.generation + 1, self.recorder.committed_episodes()

    def cut_off(self) -> int:
        """Real episodes charged since the last commit (a generation cut off: a resume runs it again)."""
        return max(0, self.real_episodes - self.recorder.committed_episodes())

    def _has_data(self) -> bool:
        """Whether any real evaluation succeeded (the replay buffer has a trajectory)."""
        return self.state.has_data()

    def _save_progress(self, generation: int, started: float, record: dict[str, Any]) -> None:
        """Commit ``generation`` to the manifest (`RunRecorder.commit`): a resume continues after it."""
        self.recorder.commit(self.state, self.learners, generation, started, record)

    # -- the loop ------------------------------------------------------------------------------
    async def evolve(self) -> dict[str, Any]:
        """Run (or, after `resume`, continue) the loop, then the held-out
        evaluation of the run's answer; returns the report. The wall time
        counts from ``started`` (the constructor's): the time before this call
        is the session's ``start_up``."""
        started = self.started
        self.time.add("start_up", max(0.0, time.perf_counter() - started))
        self.recorder.begin_session(self.state, self.learners)
        try:
            with torch_threads(self.settings.torch_threads):
                stop = await self._loop(started)
                if not self._has_data():
                    stop = StopReason.FAILED  # the budget went on evaluations that all failed
                best = await self._answer() if stop is not StopReason.FAILED else None
                heldout = await self._heldout(best)
        except (asyncio.CancelledError, KeyboardInterrupt):
            generations, episodes = self.committed()
            self._log.warning(  # the counts the command prints (`committed`, `cut_off`)
                "evolve.interrupted",
                generations_committed=generations,
                real_episodes_committed=episodes,
                cut_off_episodes=self.cut_off(),
                replay_db=str(self.buffer.path),
            )
            self.evaluator.terminate()
            self.recorder.end_session(self.state, "interrupted", started)
            raise
        except BaseException as exc:
            # any other error (a precision the device cannot run, a bad checkpoint, ...): the
            # workers must not outlive the run, or the caller's interpreter waits on them at exit
            self.evaluator.terminate()
            self.evaluator.close()
            self.recorder.end_session(self.state, "interrupted", started, error=f"{type(exc).__name__}: {exc}")
            raise
        self.evaluator.close()
        self.state.stop = stop
        policy_file = self._write_policy(best, heldout, stop)
        report = self._report(best, heldout, stop, self.recorder.wall_s(started), policy_file)
        self.recorder.end_session(self.state, "finished", started, report=report)
        self._log.info(
            "evolve.finished",
            **{
                k: report[k]
                for k in ("real_episodes", "env_steps", "train_return", "heldout_return", "target_reached", "wall_s")
            },
        )
        return report

    async def _heldout(self, best: Optional[Candidate]) -> Optional[Evaluation]:
        """The answer's held-out evaluation; None when there is no answer or it fails (a NaN on a held-out
        start state, a lost worker): the run's spent budget and its answer are kept, the report says None."""
        if best is None:
            return None
        try:
            return await self._outside_budget(HELDOUT, best.params, self.starts.heldout)
        except EvaluationError as exc:
            self._log.warning("evolve.candidate_failed", candidate=best.id, error=f"held-out evaluation: {exc}")
            return None

    async def _outside_budget(self, phase: str, params: np.ndarray, states: np.ndarray) -> Evaluation:
        """Real episodes the budget does not charge (the answer's, the held-out evaluation), reported as ``phase``."""
        self.progress.generation = max(0, self.generation)
        with self.progress.phase(phase, len(states), "episodes") as p:
            told = self.real.told(p)
            return await asyncio.to_thread(functools.partial(self.evaluator.evaluate, params, states, **told))

    async def _loop(self, started: float) -> StopReason:
        """Generations after the last committed one until the target is met
        and confirmed, the next generation could exceed a budget, or every
        candidate of a generation failed with the same error (`agents.fail_fast`)."""
        if self.resumed_from is not None and self.real.exhausted() is None:
            self.state.budget_exhausted = None  # resumed with a larger budget: the run goes on
        while self.state.reached_at is None:
            if self.state.budget_exhausted is None:
                # not one more episode, nor one more step for a cut one: no generation to run
                self.state.budget_exhausted = self.real.exhausted()
            if self.state.budget_exhausted is not None:
                return StopReason.BUDGET
            generation = self.generation + 1
            if await self._generation(generation, started):
                return StopReason.FAILED
        return StopReason.TARGET

    async def _generation(self, generation: int, started: float) -> bool:
        """Run and commit ``generation``; whether every one of its candidates failed with the same error (the run
        stops then: `agents.fail_fast`)."""
        self.progress.generation = generation
        clock = self.time.snapshot()
        space = self.obs_stats.space(self.task.policy)
        last = [c for c in self.pool if c.generation == generation - 1 and c.returns and math.isfinite(c.returns[0])]
        elite = space.to_z(max(last, key=lambda c: c.returns[0]).params) if last else None
        # extras: fewer, down to none, while they do not win
        count = refined_count(self.generations, self.config.refined, self.config.episode_steps)
        # the refinement's length follows the steps its critic last learned from (the last record: a resume alike)
        learned = self.generations[-1].get("new_steps") if self.generations else None
        refined = (
            await self.learners.refine(self.search.mean, space, generation, elite, count, new_steps=learned)
            if count and self._has_data()
            else []
        )
        zs = self.search.ask()
        extras = [
            Candidate(f"g{generation}-x{k}-{op}", space.to_raw(z), op, generation) for k, (z, op) in enumerate(refined)
        ]
        own = [Candidate(f"g{generation}-{k}-cma", space.to_raw(z), "cma", generation) for k, z in enumerate(zs)]
        evaluated: list[tuple[Candidate, Evaluation]] = []
        ran_extras, ran_own = await self._run_generation(extras, own, evaluated, generation)
        # a population cut short (budget, or a target met by an extra), or whose last episode the step budget cut, is
        # not told
        if len(ran_own) == len(own) and not any(c.cut for c in ran_own):

            def score(c: Candidate) -> float:
                return c.real_return if c.real_return is not None else -math.inf

            joined = self.search.tell(
                [score(c) for c in own],
                [(z, score(c)) for (z, _), c in zip(refined, ran_extras)],
                trusted=won_lately(self.generations),
            )
            for i, cand in enumerate(ran_extras):
                cand.joined = i in joined
        cands = ran_extras + ran_own
        failed_alike = all(c.real_return == -math.inf for c in cands) and (
            common_error(self.failures, [c.id for c in cands]) is not None
        )
        await self._commit(generation, evaluated)
        reports: dict[str, Any] = {}
        # the learners' cost follows what they return: they learn only for a generation that will run refined candidates
        new_steps = sum(res.env_steps for _, res in evaluated)
        upcoming = refined_count(
            [*self.generations, candidates_record(cands)], self.config.refined, self.config.episode_steps
        )
        if self.state.reached_at is None and self._has_data() and upcoming and not failed_alike:
            space = self.obs_stats.space(self.task.policy)
            scored = [c for c in cands if c.returns and math.isfinite(c.returns[0])]
            best = space.to_z(max(scored, key=lambda c: c.returns[0]).params) if scored else None
            reports = await self.learners.learn(self.search.mean, space, generation, new_steps=new_steps, elite=best)
        record = generation_record(
            generation,
            real_episodes=self.real_episodes,
            env_steps=self.env_steps,
            new_steps=new_steps,
            candidates=cands,
            sigma=self.search.sigma,
            reports=reports,
            elapsed_s=time.perf_counter() - started,
            time=self.time.since(clock),
            confirmations=[c for c in self.real.confirmations if c["generation"] == generation],
        )
        self._save_progress(generation, started, record)  # committed: a resume continues after this generation
        self._log.info(
            "evolve.generation",
            generation=generation,
            real_episodes=self.real_episodes,
            env_steps=self.env_steps,
            best_return=record["best_return"],
            refined_best=record["refined_best"],
            cma_best=record["cma_best"],
            wm_val_loss=record["wm_val_loss"],
            critic_val_loss=record["critic_val_loss"],
        )
        if self.on_generation is not None:
            self.on_generation(record)
        return failed_alike

    def _ongoing(self) -> bool:
        """Whether more candidates may run: no target confirmed, no budget exhausted."""
        return self.state.reached_at is None and self.state.budget_exhausted is None

    async def _run_generation(
        self,
        extras: list[Candidate],
        own: list[Candidate],
        evaluated: list[tuple[Candidate, Evaluation]],
        generation: int,
    ) -> tuple[list[Candidate], list[Candidate]]:
        """Run a generation's extras and CMA-ES's samples; returns those of each that ran. The extras first (their
        own start states), then CMA-ES's samples on the start states the floor gives them: a refined candidate that
        meets the target is verified before the population runs, and ends the run once confirmed. Probes
        (`agents.extras.probing`) that the budget may not hold beside the whole population (at the run's longest
        episode so far) run after it, on what it leaves: the floor's samples keep their share of the budget's end.
        Either way the extras stand first in the pool and the replay buffer (``evaluated``), so a generation the
        budget held whole is the one it would have been."""
        done = sum(c.refined for c in self.pool)
        longest = max((c.steps for c in self.pool), default=None) or None
        probes_last = bool(extras) and probing(self.generations) and not self.real.fits(len(extras) + len(own), longest)
        if probes_last:
            self._log.info("evolve.probes_last", generation=generation, extras=len(extras), population=len(own))
        ran_extras = [] if probes_last else await self._run(extras, done, evaluated, generation)
        ran_own: list[Candidate] = []
        if self._ongoing():
            ran_own = await self._run(own, self.state.candidates_run, evaluated, generation)
            self.state.candidates_run += len(ran_own)
        if probes_last:
            if self._ongoing():
                ran_extras = await self._run(extras, done, evaluated, generation)
            if ran := len(ran_own) + len(ran_extras):
                self.state.pool[-ran:] = ran_extras + ran_own
            evaluated.sort(key=lambda pair: not pair[0].refined)
        return ran_extras, ran_own

    async def _run(
        self, cands: list[Candidate], first: int, evaluated: list[tuple[Candidate, Evaluation]], generation: int
    ) -> list[Candidate]:
        """One episode for each of ``cands`` (candidate k on training start state
        ``order[(first + k) mod n]``), then the verification of the best that met
        the target; returns the candidates that ran (all but what the budget
        cut), now in the pool, their episodes added to ``evaluated``. When the
        step budget has less than a full episode left, the next episode runs
        on what is left: an env that ends it sooner gives a judged episode,
        else it is ``cut`` (its data is kept, its return is not judged), so
        every step of the budget is spent."""
        order, n_train = self.real.order, len(self.starts.train)
        if not cands:
            return []
        if self.real.over_budget(len(cands)) is None:  # all of them fit even at full-length episodes: one batch
            evaluated += await self.real.episodes([(c, order[(first + k) % n_train]) for k, c in enumerate(cands)])
            ran = list(cands)
        # the budget may end inside it: one candidate at a time, each charged its real steps (the same cut whatever
        # --workers), the last on the steps left
        else:
            ran = []
            while len(ran) < len(cands) and (over := self.real.exhausted()) is None:
                left = None if self.real.fits(1) else self.real.steps_left()
                job = (cands[len(ran)], order[(first + len(ran)) % n_train])
                evaluated += await self.real.episodes([job], max_steps=left)
                ran.append(cands[len(ran)])
            if len(ran) < len(cands):
                self.state.budget_exhausted = over
        self.state.pool += ran
        await self._verify(ran, evaluated, generation)
        return ran

    async def _verify(
        self, cands: list[Candidate], evaluated: list[tuple[Candidate, Evaluation]], generation: int
    ) -> None:
        """The best candidate whose one episode met the target runs on
        the other training start states (while it can still make it); one that
        meets it there goes to the validation start states, and the run stops
        once they confirm it; of extras, the next that met it runs when the
        first is refuted (`HOPEFUL_EXTRAS`). Where none met it, the best extra
        within `agents.verify.near_miss_bar` of it (a near miss: a good policy
        on a hard start state) is verified alike."""
        target = self.real.target
        scale = return_scale([c.returns[0] for c in self.pool if c.returns])  # the spread of the run's episodes so far

        def at_least(bar: float, pool: list[Candidate]) -> list[Candidate]:
            return sorted(
                (c for c in pool if c.real_return is not None and c.real_return >= bar), key=lambda c: -c.real_return
            )

        hopeful = at_least(target, cands)
        # extras that met it: the best two, one after the other; CMA-ES's samples (the floor's rule) and near misses:
        # the best one (a lucky episode on an easy start state costs 2-4 episodes to refute)
        limit = HOPEFUL_EXTRAS if hopeful and all(c.refined for c in hopeful) else 1
        bar = near_miss_bar(target, scale)
        if not hopeful and bar is not None:
            hopeful = at_least(bar, [c for c in cands if c.refined])
            if hopeful:
                self._log.info(
                    "evolve.near_miss",
                    candidate=hopeful[0].id,
                    generation=generation,
                    real_return=hopeful[0].real_return,
                    bar=bar,
                    target=target,
                )
        for cand in hopeful[:limit]:
            # stage by stage while each stage fits the budgets (the sequential test may need few of them)
            res = await self.real.verify(cand, scale)
            if res is not None and res.returns:
                evaluated.append((cand, res))
            # a stage the budgets cannot hold leaves the candidate unconfirmed; the run goes on with the steps left
            # (the population, then cut episodes) and stops when they are spent
            if self.real.cut:
                self.state.unconfirmed = self.state.unconfirmed or cand.id  # one that met on every state stays named
                return
            if not cand.meets(target):
                continue
            confirmed = await self.real.confirm(cand, generation, scale)
            if confirmed is None:
                self.state.unconfirmed = cand.id
                return
            if confirmed:
                self.state.reached_at, self.state.answer = self.real_episodes, cand.id
                return

    async def _commit(self, generation: int, evaluated: list[tuple[Candidate, Evaluation]]) -> None:
        """The generation's episodes to the replay buffer (one transaction) and
        their observations to the search's statistics."""
        trajs = []
        scale = np.asarray(self.task.policy.obs_scale, dtype=np.float64)
        for cand, res in evaluated:
            outcome = "target" if cand.meets(self.real.target) else ("full" if cand.full else "episode")
            trajs += trajectories_from_episodes(res.episodes, cand.id, outcome)
            if cand.operator != "cma":  # the search's coordinates follow its own samples, as the floor's do
                continue
            for episode in res.episodes:
                if "obs" in episode:
                    self.obs_stats.update(np.asarray(episode["obs"], dtype=np.float64) * scale)
        if trajs:
            await self.buffer.aappend_generation(self.data_agent, generation, trajs)

    async def _answer(self) -> Optional[Candidate]:
        """The run's answer: the confirmed candidate; else the best by training
        return of the fully evaluated candidates, the CMA-ES mean, the
        refinement's last actor and the `ANSWER_EPISODE_BESTS` candidates with
        the run's best single episodes that were never fully evaluated (these
        run on the training start states here, as the tuned yardstick's mean
        is, outside the budget)."""
        if self.state.answer is not None:
            return next(c for c in self.pool if c.id == self.state.answer)
        finals = [
            Candidate(
                f"g{self.generation}-mean",
                self.obs_stats.space(self.task.policy).to_raw(self.search.mean),
                "cma_mean",
                self.generation,
            )
        ]
        if self.learners.actor is not None:
            finals.append(Candidate(f"g{self.generation}-actor", self.learners.actor, "refined:actor", self.generation))
        partial = [c for c in self.pool if not c.full and c.real_return is not None and math.isfinite(c.real_return)]
        # the one-episode bests the budget never verified (a target out of reach verifies nothing)
        for top in sorted(partial, key=lambda c: -c.real_return)[:ANSWER_EPISODE_BESTS]:
            finals.append(Candidate(top.id, top.params, top.operator, top.generation))
        for cand in finals:
            try:
                res = await self._outside_budget(ANSWER, cand.params, self.starts.train)
            except EvaluationError as exc:  # not an answer then; the run's own candidates are charged, these are not
                self._log.warning("evolve.candidate_failed", candidate=cand.id, error=str(exc))
                continue
            cand.starts, cand.returns = list(range(len(self.starts.train))), [float(r) for r in res.returns]
            cand.real_return, cand.real_episodes, cand.full = res.mean_return, len(res.returns), True
        scored = [
            c for c in [*finals, *self.pool] if c.full and c.real_return is not None and math.isfinite(c.real_return)
        ]
        return max(scored, key=lambda c: c.real_return) if scored else None

    def _report(
        self,
        best: Optional[Candidate],
        heldout: Optional[Evaluation],
        stop: StopReason,
        wall_s: float,
        policy_file: Optional[str] = None,
    ) -> dict[str, Any]:
        return run_report(
            self.config,
            best=best,
            policy_file=policy_file,
            heldout=heldout,
            heldout_episodes=len(self.starts.heldout),
            real_episodes=self.real_episodes,
            env_steps=self.env_steps,
            failures=self.failures,
            confirmations=self.real.confirmations,
            reached_at=self.state.reached_at,
            wall_s=wall_s,
            stop_reason=stop.value,
            budget_exhausted=self.state.budget_exhausted if stop is StopReason.BUDGET else None,
            unconfirmed=self.state.unconfirmed,
            generations=self.generations,
            run_id=self.run_id,
            replay_db=str(self.buffer.path),
            run_manifest=str(self.manifest_path),
            resumed_from=self.resumed_from,
            train_start_states=len(self.starts.train),
            validation_start_states=len(self.starts.validation),
            time_share=self.time.report(wall_s),
            learners=self.learners.summary(self.generations),
        )

    def _write_policy(
        self, best: Optional[Candidate], heldout: Optional[Evaluation], stop: StopReason
    ) -> Optional[str]:
        """The answer as a policy file in the run's folder (`agents.policies`,
        `agents.runs.policy_path`), written atomically; its path, or None without
        an answer or when it could not be written (logged: the report still
        holds the answer's parameters)."""
        if best is None:
            return None
        reached = self.state.reached_at is not None
        policy = policy_from_run(
            self.task,
            best.params,
            run={
                "run_id": self.run_id,
                "seed": self.config.seed,
                "mode": mode_of(self.config),
                "candidate": best.id,
                "operator": best.operator,
                "generation": best.generation,
                "confirmed": reached and best.id == self.state.answer,
                "target_reached": reached,
                "stop_reason": stop.value,
                "real_episodes": self.real_episodes,
            },
            returns={
                "train": best.real_return if best.full or best.accepted else None,
                "train_states_run": len(best.returns),
                "validation": best.validation_return,
                "heldout": heldout.mean_return if heldout is not None else None,
                "heldout_returns": [float(r) for r in heldout.returns] if heldout is not None else None,
            },
            heldout_seed=self.config.seed,
            heldout_states=self.starts.heldout,
        )
        path = policy_path(Path(self.settings.state_dir), self.run_id)
        try:
            policy.save(path)
        except OSError as exc:
            self._log.warning("evolve.policy_unwritten", path=str(path), error=str(exc))
            return None
        return str(path)


async def run_cma_baseline(config: Optional[EvolveConfig] = None, **kwargs: Any) -> dict[str, Any]:
    """``--baseline cma``: the loop with nothing learned, a tuned one-episode
    CMA-ES on normalised observations (the floor), under ``config``'s budgets."""
    from dataclasses import replace

    cfg = replace(config or EvolveConfig(), use_world_model=False, use_critic=False, refined=0)
    return await SEDarwinAgent(cfg, **kwargs).evolve()

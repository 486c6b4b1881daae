"""How an evolution run records itself in its manifest (``agents.runs``):
sessions, committed progress (and reading it back on resume) and the
learners' snapshots. A base of `agents.se_darwin_agent.SEDarwinAgent`."""

from __future__ import annotations

import copy
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar

import numpy as np

from genesis_fp16.settings import Settings
from infrastructure.replay_buffer import ReplayBuffer

from . import runs
from .evaluation import EvaluationBackend
from .evolve_config import Candidate, EvolveConfig, resumed_config
from .evolve_report import SUMMARY_KEYS
from .cma_search import CMASearch
from .learners import Learners
from .real_episodes import RealEpisodes
from .run_state import RunState
from .search_space import ObsStats
from .tasks import ResolvedTask, Task
from .time_share import TimeShare

if TYPE_CHECKING:
    import structlog

    from infrastructure.critic import Critic
    from infrastructure.world_model import WorldModel


_Run = TypeVar("_Run", bound="RunRecord")


class RunRecord:
    """The manifest side of a run; the agent provides these attributes and `_progress`."""

    settings: Settings
    config: EvolveConfig
    task: ResolvedTask
    run_id: str
    data_agent: str
    buffer: ReplayBuffer
    learners: Learners
    state: RunState
    real: RealEpisodes
    pool: list[Candidate]
    generations: list[dict[str, Any]]
    obs_stats: ObsStats
    search: CMASearch
    time: TimeShare
    resumed_from: Optional[dict[str, Any]]
    _lock: runs.RunLock
    _manifest: dict[str, Any]
    _prior_wall_s: float
    _log: "structlog.stdlib.BoundLogger"

    # -- resume -------------------------------------------------------------------------------
    @classmethod
    def resume(
        cls: type[_Run],
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
    ) -> _Run:
        """The interrupted run ``run_id``, ready to `evolve` on from its
        last committed generation: its own config (``budget`` and
        ``budget_steps`` may change it, ``workers`` and ``backend`` too; every other option in ``options``, keyed as in
        `EvolveConfig`, must equal the run's; ``task`` for a run of a
        task that is not registered; ``world_model``, ``critic``, ``buffer`` and
        ``evaluator`` as in the constructor), candidates, CMA-ES,
        episodes spent and the learners' snapshots. Replay rows of a generation
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
                done = ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in (manifest.get("report") or {}).items())
                raise runs.RunError(f"run {run_id!r} already finished ({done}); nothing to resume. Start a new run without --resume")
            config = resumed_config(manifest, budget=budget, budget_steps=budget_steps, workers=workers, options=options or {}, backend=backend)
            agent = cls(config, task=task, settings=settings, buffer=buffer, world_model=world_model, critic=critic, evaluator=evaluator,
                        on_generation=on_generation, run_id=run_id)
            agent._lock = lock
            agent._restore(manifest)
        except BaseException:
            lock.release()
            raise
        return agent

    def _has_data(self) -> bool:
        raise NotImplementedError

    def _progress(self, generation: Optional[int] = None, generations: Optional[list[dict[str, Any]]] = None) -> dict[str, Any]:
        """What a resume needs, as of the last committed generation (or of
        ``generation`` with its ``generations`` records, about to be committed).
        The lists are copies: the manifest on disk and in memory never share a
        list that a later generation grows."""
        state = self.state.as_dict()
        if generation is not None:
            state["generation"] = generation
        # deep copies: `CMASearch.record()` hands out its growing ``told`` list and `RealEpisodes.progress()` its
        # ``failures`` and ``confirmations``; shared, a generation cut off after CMA-ES was told would reach the
        # manifest `_end_session` writes, and a resume would replay a generation it then runs again
        return copy.deepcopy({
            "generation": state["generation"],
            "state": state,
            **self.real.progress(),
            "pool": [c.as_dict() for c in self.pool],
            "generations": list(self.generations if generations is None else generations),
            "obs_stats": self.obs_stats.as_dict(),
            "search": self.search.record(),
            "actor": None if self.learners.actor is None else [float(v) for v in self.learners.actor],
            "time": self.time.snapshot(),
            "decisions": self._decisions(),
        })

    def _decisions(self) -> dict[str, Any]:
        """Each learner's precision decision so far (manifest key -> `PrecisionDecision.as_dict`): part of the
        run's state, so a resume trains on them instead of deciding (measuring) again."""
        out = {}
        for key, learner in self._learners_of():
            decision = learner.decision if learner._training is not None else learner._reused_decision
            if decision is not None:
                out[key] = decision.as_dict()
        return out

    def _learners_of(self) -> list[tuple[str, Any]]:
        """(manifest key, learner) of each learned part this run trains and has trained."""
        pairs = [("world_model_checkpoint", self.learners.world_model), ("critic_checkpoint", self.learners.critic)]
        return [(key, learner) for key, learner in pairs if learner is not None]

    def _restore(self, manifest: dict[str, Any]) -> None:
        """The state `_progress` wrote; the replay rows of a cut-off generation deleted, the learners' snapshots loaded."""
        from genesis_fp16.checkpoint import CheckpointError
        from genesis_fp16.decision import PrecisionDecision
        from genesis_fp16.threads import torch_threads

        try:  # read_manifest checked each field's type; what only the task can say (sizes) is checked here
            self.state = RunState.from_dict(manifest["state"])
            self.search = CMASearch.replay(manifest["search"])
            self.real.restore(manifest)
            actor = manifest.get("actor")
            self.learners.actor = None if actor is None else np.asarray(actor, dtype=np.float64)
            self.pool = [Candidate.from_dict(c) for c in manifest["pool"]]
            self.generations = list(manifest["generations"])
            self.obs_stats = ObsStats.from_dict(self.task.policy.obs_dim, manifest["obs_stats"])
        except (KeyError, TypeError, ValueError) as exc:
            raise runs.RunError(f"{self.manifest_path}: {exc}; the run cannot be resumed") from None
        self.time.seconds.update(TimeShare(manifest["time"]).seconds)  # the object the evaluations already hold
        keys = ("started", "sessions", "world_model_checkpoint", "critic_checkpoint", "real_episodes", "decisions")
        self._manifest.update({k: manifest[k] for k in keys if k in manifest})
        self._prior_wall_s = float(manifest.get("wall_s") or 0.0)
        # a run whose every evaluation so far failed has no replay data, and needs none
        if self.generation >= 0 and self._has_data() and self.buffer.count(self.data_agent)["trajectories"] == 0:
            raise runs.RunError(
                f"run {self.run_id!r}: its replay data is gone from {self.buffer.path} (pruned, or another state dir); it cannot be resumed"
            )
        discarded = self.buffer.delete_generations_after(self.data_agent, self.generation)
        decisions = manifest.get("decisions") or {}
        if not isinstance(decisions, dict):
            raise runs.RunError(f"run {self.run_id!r}: its manifest's field 'decisions' is not an object; the run cannot be resumed")
        with torch_threads(self.settings.torch_threads):  # as the run trains: a workload's cache key counts its threads
            for key, learner in self._learners_of():
                if key in decisions:
                    try:
                        learner.reuse_decision(PrecisionDecision.from_dict(decisions[key]))
                    except ValueError as exc:
                        raise runs.RunError(f"run {self.run_id!r}: its manifest's decisions.{key}: {exc}; the run cannot be resumed") from None
                snapshot = manifest.get(key)
                if not snapshot:
                    continue
                path = runs.world_model_dir(Path(self.settings.state_dir), self.run_id) / snapshot
                try:
                    learner.load(path)
                except CheckpointError as exc:
                    raise runs.RunError(f"run {self.run_id!r}: its {key.replace('_checkpoint', '').replace('_', ' ')} snapshot cannot be "
                                        f"loaded ({exc}); the run cannot be resumed") from None
                learner.save()  # the learner's own checkpoint (a rollback may restore it) matches the committed generation again
        self.resumed_from = {
            "generation": self.generation, "real_episodes": self.real.real_episodes, "discarded_trajectories": discarded,
            "session": len(self._manifest["sessions"]) + 1,
        }
        self._log.info("evolve.resumed", **self.resumed_from)

    def committed(self) -> tuple[int, int]:
        """(generations, real episodes) committed to the manifest: what a
        resume continues after (the replay rows of a later generation are
        discarded then)."""
        return self.generation + 1, int(self._manifest.get("real_episodes") or 0)

    @property
    def manifest_path(self) -> Path:
        return runs.manifest_path(Path(self.settings.state_dir), self.run_id)

    def _wall_s(self, started: float) -> float:
        """Wall time of every session of this run so far."""
        return self._prior_wall_s + time.perf_counter() - started

    def _write_manifest(self, **fields: Any) -> None:
        """The manifest with ``fields``, written whole; kept in memory only
        once it is on disk, so a failed write leaves the last committed one
        for `_end_session` to write again."""
        manifest = {**self._manifest, **fields}
        runs.write_manifest(Path(self.settings.state_dir), {**manifest, "config": asdict(self.config)})
        self._manifest = manifest

    def _begin_session(self) -> None:
        if not self._lock.acquire():
            raise runs.RunError(f"run {self.run_id!r} is running in another process; wait for it to end, then resume it")
        self._manifest["sessions"].append(
            {"started": time.time(), "pid": os.getpid(), "from_generation": self.generation, "real_episodes": self.real.real_episodes}
        )
        try:
            self._write_manifest(status="running", pid=os.getpid(), wall_s=self._prior_wall_s, **self._progress())
        except BaseException:
            self._lock.release()
            raise

    def _save_progress(self, generation: int, started: float, record: dict[str, Any]) -> None:
        """Commit ``generation`` (its ``record`` the last of the run's
        generation records): each learner's snapshot named after it (so the
        manifest never points at weights of a later, uncommitted generation),
        then the manifest, then the previous snapshots go. The run state is
        one unit: the generation and its record join the run only once the
        manifest holding both is written (a full disk in between leaves the
        last committed generation, and a resume runs this one again)."""
        generations = [*self.generations, record]
        folder = runs.world_model_dir(Path(self.settings.state_dir), self.run_id)
        snapshots: dict[str, Any] = {}
        for key, learner in self._learners_of():
            snapshots[key] = self._manifest.get(key)
            if learner.trained:
                snapshots[key] = f"{key.removesuffix('_checkpoint')}-g{generation:04d}.pt"
                learner.save(folder / snapshots[key])
        previous = {key: self._manifest.get(key) for key in snapshots}
        self._write_manifest(wall_s=self._wall_s(started), **snapshots, **self._progress(generation, generations))
        self.state.generation, self.generations = generation, generations
        for key, old in previous.items():
            if old and old != snapshots[key]:
                (folder / old).unlink(missing_ok=True)

    def _end_session(self, status: str, started: float, *, error: Optional[str] = None, report: Optional[dict[str, Any]] = None) -> None:
        """Record how the session ended and let go of the run; never raises
        (it runs on the way out of a failure too)."""
        update: dict[str, Any] = {"status": status, "ended": time.time(), "wall_s": self._wall_s(started), "error": error}
        snapshots = [self._manifest.get(key) for key in ("world_model_checkpoint", "critic_checkpoint")]
        if report is not None:
            update.update(report={k: report[k] for k in SUMMARY_KEYS}, world_model_checkpoint=None, critic_checkpoint=None)
        try:
            self._write_manifest(**update)
            for snapshot in snapshots if report is not None else []:  # a finished run is never resumed: its snapshots are dead weight
                if snapshot:
                    (runs.world_model_dir(Path(self.settings.state_dir), self.run_id) / snapshot).unlink(missing_ok=True)
        except (runs.RunStorageError, OSError) as exc:
            self._log.warning("evolve.manifest_unwritten", status=status, error=str(exc))
        finally:
            self._lock.release()


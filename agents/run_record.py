"""How an evolution run records itself in its manifest (``agents.runs``):
its sessions, each committed generation with the learners' snapshots, how a
session ended, and the run lock that keeps a second process off the run.

The agent holds one `RunRecorder`. What it records is the agent's `RunState`
(`agents.run_state`), passed in at each call: the recorder keeps no progress
of its own, only the manifest as last written (a session that ends after a
generation was cut off writes that, never the cut-off generation's progress).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from genesis_fp16.base.settings import Settings
from genesis_fp16.base.telemetry import get_logger

from . import runs
from .evolve_config import EvolveConfig
from .evolve_report import SUMMARY_KEYS
from .run_state import SNAPSHOT_KEYS, RunState

if TYPE_CHECKING:
    from infrastructure.replay_buffer import ReplayBuffer
    from infrastructure.learner import GuardedLearner

    from .learners import Learners


def open_run(settings: Settings, run_id: str) -> tuple[runs.Manifest, runs.RunLock]:
    """The manifest of the interrupted run ``run_id`` and its lock, held (release
    it if the resume goes no further). Raises `agents.runs.RunError` for an
    unknown run, one another process runs, or one that finished."""
    state_dir = Path(settings.state_dir)
    manifest = runs.read_manifest(state_dir, run_id)  # unknown id: an error, and no lock file made
    lock = runs.RunLock(state_dir, run_id)
    if not lock.acquire():
        raise runs.RunError(
            f"run {run_id!r} is running (pid {manifest.get('pid')}); wait for it to end or stop it, then resume it"
        )
    try:
        manifest = runs.read_manifest(state_dir, run_id)  # as it is now that no one else writes it
        if manifest.get("status") == "finished":
            done = ", ".join(
                f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                for k, v in (manifest.get("report") or {}).items()
            )
            raise runs.RunError(
                f"run {run_id!r} already finished ({done}); nothing to resume. Start a new run without --resume"
            )
    except BaseException:
        lock.release()
        raise
    return manifest, lock


LEARNER_OF = dict(zip(SNAPSHOT_KEYS, ("world_model", "critic")))
"""The learner each snapshot key names (`agents.learners.Learners.build`)."""


def learned_parts(learners: Learners) -> list[tuple[str, GuardedLearner]]:
    """(manifest key, learner) of each learned part the run has built (`SNAPSHOT_KEYS`; one not built yet has
    nothing to save or decide)."""
    pairs = ((key, getattr(learners, name)) for key, name in LEARNER_OF.items())
    return [(key, learner) for key, learner in pairs if learner is not None]


class RunRecorder:
    """The manifest of run ``run_id`` of ``config``: `begin_session`,
    `commit` after each generation, `end_session`. ``prior``: the manifest of
    a resumed run (`open_run`), whose start time, sessions and wall time go
    on, with its ``lock`` held."""

    def __init__(
        self,
        settings: Settings,
        config: EvolveConfig,
        run_id: str,
        *,
        prior: Optional[dict[str, Any]] = None,
        lock: Optional[runs.RunLock] = None,
    ) -> None:
        self.settings, self.config, self.run_id = settings, config, run_id
        self.state_dir = Path(settings.state_dir)
        self.data_agent = f"{config.agent}:{run_id}"  # one run's data never trains another run's model
        self.log = get_logger("agents.se_darwin", agent=config.agent, run_id=run_id)
        self.lock = lock or runs.RunLock(self.state_dir, run_id)
        self.resumed = prior is not None
        self._manifest: dict[str, Any] = {
            "run_id": run_id,
            "data_agent": self.data_agent,
            "status": "new",
            "started": time.time(),
            "pid": os.getpid(),
            "sessions": [],
        }
        self._manifest.update(
            {k: prior[k] for k in ("started", "sessions", "real_episodes") if prior is not None and k in prior}
        )
        self.prior_wall_s = float((prior or {}).get("wall_s") or 0.0)
        """Wall time of the run's earlier sessions."""

    @property
    def manifest_path(self) -> Path:
        return runs.manifest_path(self.state_dir, self.run_id)

    @property
    def snapshot_dir(self) -> Path:
        """The run's folder of learner snapshots."""
        return runs.world_model_dir(self.state_dir, self.run_id)

    def committed_episodes(self) -> int:
        """Real episodes as of the manifest last written."""
        return int(self._manifest.get("real_episodes") or 0)

    def wall_s(self, started: float) -> float:
        """Wall time of every session of this run so far (this one since ``started``, a `time.perf_counter`)."""
        return self.prior_wall_s + time.perf_counter() - started

    def _write(self, **fields: Any) -> None:
        """The manifest with ``fields``, written whole; kept in memory only
        once it is on disk, so a failed write leaves the last committed one
        for `end_session` to write again."""
        manifest = {**self._manifest, **fields}
        runs.write_manifest(self.state_dir, {**manifest, "config": asdict(self.config)})
        self._manifest = manifest

    @staticmethod
    def _note_decisions(state: RunState, learners: Learners) -> None:
        """Each built learner's precision decision into ``state`` (a resume trains on them instead of deciding
        again); one not built keeps the decision ``state`` has for it, if any."""
        decided = [(key, learner.decision) for key, learner in learned_parts(learners)]
        state.decisions = {
            **state.decisions,
            **{key: decision.as_dict() for key, decision in decided if decision is not None},
        }

    def begin_session(self, state: RunState, learners: Learners) -> None:
        """Take the run's lock and record a session starting from ``state``."""
        if not self.lock.acquire():
            raise runs.RunError(
                f"run {self.run_id!r} is running in another process; wait for it to end, then resume it"
            )
        self._manifest["sessions"].append(
            {
                "started": time.time(),
                "pid": os.getpid(),
                "from_generation": state.generation,
                "real_episodes": state.spent.real_episodes,
            }
        )
        try:
            self._note_decisions(state, learners)
            self._write(status="running", pid=os.getpid(), wall_s=self.prior_wall_s, **state.as_manifest())
        except BaseException:
            self.lock.release()
            raise

    def commit(
        self, state: RunState, learners: Learners, generation: int, started: float, record: dict[str, Any]
    ) -> None:
        """Commit ``generation`` (its ``record`` the last of the run's
        generation records): each learner's snapshot named after it (so the
        manifest never points at weights of a later, uncommitted generation),
        then the manifest, then the previous snapshots go. The generation, its
        record and the snapshots join ``state`` only once the manifest holding
        them is written (a full disk in between leaves the last committed
        generation, and a resume runs this one again)."""
        generations = [*state.generations, record]
        snapshots = dict(state.snapshots)
        for key, learner in learned_parts(learners):
            if learner.trained:
                snapshots[key] = f"{key.removesuffix('_checkpoint')}-g{generation:04d}.pt"
                learner.save(self.snapshot_dir / snapshots[key])
        self._note_decisions(state, learners)
        self._write(
            wall_s=self.wall_s(started),
            **state.as_manifest(generation=generation, generations=generations, snapshots=snapshots),
        )
        previous, state.generation, state.generations, state.snapshots = (
            state.snapshots,
            generation,
            generations,
            snapshots,
        )
        for key, old in previous.items():
            if old and old != snapshots[key]:
                (self.snapshot_dir / old).unlink(missing_ok=True)

    def end_session(
        self,
        state: RunState,
        status: str,
        started: float,
        *,
        error: Optional[str] = None,
        report: Optional[dict[str, Any]] = None,
    ) -> None:
        """Record how the session ended (the progress as last committed) and
        let go of the run; never raises (it runs on the way out of a failure
        too). A finished run (``report``) is never resumed: its snapshots go."""
        update: dict[str, Any] = {
            "status": status,
            "ended": time.time(),
            "wall_s": self.wall_s(started),
            "error": error,
        }
        snapshots = [name for name in state.snapshots.values() if name] if report is not None else []
        if report is not None:
            update.update(report={k: report[k] for k in SUMMARY_KEYS}, **dict.fromkeys(SNAPSHOT_KEYS))
            update["state"] = {
                **self._manifest.get("state", {}),
                "stop": None if state.stop is None else state.stop.value,
            }
        try:
            self._write(**update)
            for snapshot in snapshots:
                (self.snapshot_dir / snapshot).unlink(missing_ok=True)
            if report is not None:
                state.snapshots = dict.fromkeys(SNAPSHOT_KEYS)
        except (runs.RunStorageError, OSError) as exc:
            self.log.warning("evolve.manifest_unwritten", status=status, error=str(exc))
        finally:
            self.lock.release()

    def resume_learners(self, state: RunState, learners: Learners, buffer: ReplayBuffer) -> dict[str, Any]:
        """Bring what lives outside the state to a resumed ``state``: the replay
        rows of a generation cut off after the last committed one deleted (it
        runs again), each learner's precision decision reused and its snapshot
        loaded. Returns where the run resumes from (``resumed_from``)."""
        from genesis_fp16.base.threads import torch_threads
        from genesis_fp16.training.checkpoint import CheckpointError

        # a run whose every evaluation so far failed has no replay data, and needs none
        if state.generation >= 0 and state.has_data() and buffer.count(self.data_agent)["trajectories"] == 0:
            raise runs.RunError(
                f"run {self.run_id!r}: its replay data is gone from {buffer.path} (pruned, or another state dir); it "
                "cannot be resumed"
            )
        discarded = buffer.delete_generations_after(self.data_agent, state.generation)
        with torch_threads(self.settings.torch_threads):  # as the run trains: a workload's cache key counts its threads
            for key, name in LEARNER_OF.items():
                snapshot = state.snapshots.get(key)
                if not snapshot:  # never trained: built when the run first trains it
                    continue
                learner = learners.build(name)  # on the run's own decision (`Learners`)
                if learner is None:
                    continue
                try:
                    learner.load(self.snapshot_dir / snapshot)
                except CheckpointError as exc:
                    raise runs.RunError(
                        f"run {self.run_id!r}: its {key.replace('_checkpoint', '').replace('_', ' ')} snapshot cannot "
                        "be "
                        f"loaded ({exc}); the run cannot be resumed"
                    ) from None
                # the learner's own checkpoint (a rollback may restore it) matches the committed generation again
                learner.save()
        resumed_from = {
            "generation": state.generation,
            "real_episodes": state.spent.real_episodes,
            "discarded_trajectories": discarded,
            "session": len(self._manifest["sessions"]) + 1,
        }
        self.log.info("evolve.resumed", **resumed_from)
        return resumed_from

"""How an evolution run records itself in its manifest (``agents.runs``):
sessions, committed progress and world-model snapshots. A base of
`agents.se_darwin_agent.SEDarwinAgent`."""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from genesis_fp16.settings import Settings

from . import runs
from .evolve_config import EvolveConfig
from .evolve_report import SUMMARY_KEYS

if TYPE_CHECKING:
    import structlog

    from infrastructure.world_model import WorldModel


class RunRecord:
    """The manifest side of a run; the agent provides these attributes and `_progress`."""

    settings: Settings
    config: EvolveConfig
    run_id: str
    world_model: Optional[WorldModel]
    generation: int
    real_episodes: int
    _lock: runs.RunLock
    _manifest: dict[str, Any]
    _prior_wall_s: float
    _log: "structlog.stdlib.BoundLogger"

    def _progress(self) -> dict[str, Any]:
        raise NotImplementedError

    @property
    def manifest_path(self) -> Path:
        return runs.manifest_path(Path(self.settings.state_dir), self.run_id)

    def _wall_s(self, started: float) -> float:
        """Wall time of every session of this run so far."""
        return self._prior_wall_s + time.perf_counter() - started

    def _write_manifest(self, **fields: Any) -> None:
        self._manifest.update(fields)
        runs.write_manifest(Path(self.settings.state_dir), {**self._manifest, "config": asdict(self.config)})

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
            update.update(report={k: report[k] for k in SUMMARY_KEYS}, world_model_checkpoint=None)
        try:
            self._write_manifest(**update)
            if report is not None and snapshot:  # a finished run is never resumed: its snapshot is dead weight
                (runs.world_model_dir(Path(self.settings.state_dir), self.run_id) / snapshot).unlink(missing_ok=True)
        except (runs.RunStorageError, OSError) as exc:
            self._log.warning("evolve.manifest_unwritten", status=status, error=str(exc))
        finally:
            self._lock.release()


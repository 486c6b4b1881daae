"""Run records: one small JSON manifest per ``evolve`` run, so an interrupted
run can be continued (``evolve --resume``) and old runs listed and pruned
(``genesis-fp16 state``).

Under the state dir::

    runs/<run_id>/run.json   the manifest: config, the last committed generation,
                             real episodes, the pool, the numpy generator's state
    runs/<run_id>/lock       held (flock) by the process running the run
    runs/<run_id>/policy.json  the run's answer as a policy file (``agents.policies``), once it finished
    world_model/<run_id>/    the run's world-model checkpoints
    replay.sqlite            its trajectories, agent "<agent>:<run_id>"

The manifest is JSON (never a pickle), versioned and written atomically after
each committed generation; it is the commit record: replay rows of a later
generation belong to a generation that was cut off and are dropped on resume.
A run is running while a process holds its lock: the kernel releases a flock
when the process dies (even ``kill -9``), so a stale "running" needs no pid
guessing.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from genesis_fp16.base import untrusted
from genesis_fp16.base.errors import strict_json_value
from genesis_fp16.rollout.ledger import LEDGER_FILE
from infrastructure.replay_buffer import DEFAULT_FILENAME as REPLAY_FILE
from infrastructure.replay_buffer import ReplayBuffer

from .manifest_fields import (  # noqa: F401  (re-exported: agents.runs is where callers find them)
    MISSING,
    MANIFEST_VERSION,
    RESUME_FIELDS,
    Manifest,
    UNRESUMABLE,
    ManifestFieldError,
    RunError,
    check_fields,
    is_int,
    is_number,
    is_numbers,
    shown,
)

try:  # POSIX; without it a run is never seen as running by another process
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

MANIFEST_FORMAT = "genesis-fp16.run"
RUNS_DIR = "runs"
MANIFEST_FILE = "run.json"
LOCK_FILE = "lock"
POLICY_FILE = "policy.json"
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
MANIFEST_MAX_BYTES = 128 * 1024 * 1024
"""A larger run manifest is not read (one this code writes holds a few KiB per real episode)."""
MANIFEST_MAX_DEPTH = 32
"""Deeper nesting is not a manifest this code writes (it nests at most 6 deep)."""
_UNREADABLE = "this run cannot be resumed (`genesis-fp16 state prune` can delete it)"


class RunStorageError(RuntimeError):
    """The run manifest could not be written; the message names the file."""


def manifest_path(state_dir: Path, run_id: str) -> Path:
    return Path(state_dir) / RUNS_DIR / run_id / MANIFEST_FILE


def policy_path(state_dir: Path, run_id: str) -> Path:
    """Where a finished run's answer is written as a policy file (`agents.policies`)."""
    return Path(state_dir) / RUNS_DIR / run_id / POLICY_FILE


def world_model_dir(state_dir: Path, run_id: str) -> Path:
    return Path(state_dir) / "world_model" / run_id


def check_run_id(run_id: str) -> str:
    if not _RUN_ID.match(run_id):
        raise RunError(
            f"run id {run_id!r}: expected letters, digits, '.', '_' and '-' only (e.g. seed0-20250101T120000-1a2b3c); "
            "`genesis-fp16 state list` lists the runs"
        )
    return run_id


# -- the manifest ---------------------------------------------------------------------


def _decode(value: Any) -> Any:
    if isinstance(value, str) and value in _NON_FINITE:
        return _NON_FINITE[value]
    if isinstance(value, dict):
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def write_manifest(state_dir: Path, manifest: dict[str, Any]) -> Path:
    path = manifest_path(state_dir, manifest["run_id"])
    from genesis_fp16.base.storage import atomic_write_bytes  # here: `state list` reads runs and must not import torch

    data = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, **manifest, "updated": time.time()}
    try:
        return atomic_write_bytes(
            path, (json.dumps(strict_json_value(data), indent=1, allow_nan=False) + "\n").encode("utf-8")
        )
    except OSError as exc:
        # the cause stays chained: callers tell a full disk from other faults by it
        raise RunStorageError(f"{path}: cannot write the run manifest ({exc})") from exc


def read_manifest(state_dir: Path, run_id: str) -> dict[str, Any]:
    """The manifest of ``run_id``; `RunError` if it is missing or unreadable."""
    path = manifest_path(state_dir, check_run_id(run_id))
    try:
        data = untrusted.read_json(
            path, "run manifest", _UNREADABLE, max_bytes=MANIFEST_MAX_BYTES, max_depth=MANIFEST_MAX_DEPTH
        )
    except FileNotFoundError:
        if world_model_dir(state_dir, run_id).is_dir():
            raise RunError(
                f"run {run_id!r} has data in {state_dir} but no manifest (it was started by a version that kept none); "
                "it cannot be resumed. `genesis-fp16 state prune` can delete it"
            ) from None
        raise RunError(
            f"no run {run_id!r} in {Path(state_dir) / RUNS_DIR}; `genesis-fp16 state list` lists the runs"
        ) from None
    except untrusted.UntrustedFileError as exc:
        raise RunError(f"{path}: the run manifest {exc.problem}; {_UNREADABLE}") from None
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        raise RunError(f"{path}: not a genesis-fp16 run manifest (expected format {MANIFEST_FORMAT!r})")
    if not isinstance(data.get("version"), int) or data["version"] > MANIFEST_VERSION:
        raise RunError(
            f"{path}: run manifest version {data.get('version')!r}; this code reads version {MANIFEST_VERSION} and "
            "older"
        )
    manifest = Manifest(_decode(data))
    manifest.path = path
    from .manifest_check import check_manifest

    try:
        check_manifest(manifest)
    except ManifestFieldError as exc:
        raise RunError(f"{path}: {exc}; {UNRESUMABLE}") from None
    return manifest


class RunLock:
    """An exclusive, non-blocking flock on ``runs/<run_id>/lock`` for as long
    as a process runs (or prunes) the run."""

    def __init__(self, state_dir: Path, run_id: str) -> None:
        self.path = Path(state_dir) / RUNS_DIR / run_id / LOCK_FILE
        self._fd: Optional[int] = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> bool:
        """True if this process now holds the lock; False if another one does."""
        if self._fd is not None:
            return True
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise RunStorageError(
                f"{self.path}: cannot create the run's lock file ({exc}); is the state dir writable?"
            ) from None
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
        self._fd = fd
        return True

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor drops the flock

    def __del__(self) -> None:
        self.release()


def is_running(state_dir: Path, run_id: str) -> bool:
    """Whether another open file description holds the run's lock. The lock
    file is opened read-only (flock needs no write access), so a run in a
    read-only state dir is still told apart from a running one."""
    path = RunLock(state_dir, run_id).path
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO in its place does not hang the probe
    except OSError:  # no lock file (never run here, or pruned), or unreadable: nothing holds it
        return False
    try:
        if fcntl is None:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False
    finally:
        os.close(fd)  # drops the probe's flock


def effective_status(state_dir: Path, manifest: Optional[dict[str, Any]], run_id: str) -> str:
    """running (a process holds the lock), interrupted, finished, or unknown
    (no readable manifest). A manifest that still says running without a
    holder belongs to a process that died."""
    if is_running(state_dir, run_id):
        return "running"
    if manifest is None:
        return "unknown"
    status = str(manifest.get("status", "unknown"))
    return "interrupted" if status == "running" else status


# -- listing and pruning -----------------------------------------------------------------

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """ "12h", "7d", "30m", "90s", "2w" -> seconds."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"duration {text!r}: expected a number and a unit s, m, h, d or w (e.g. 12h, 7d)")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


@dataclass
class RunInfo:
    """One run as found on disk: by its manifest, its world-model folder or
    its replay rows (``<agent>:<run_id>``); any of them may be missing."""

    run_id: str
    status: str
    started: Optional[float]
    real_episodes: Optional[int]
    generation: Optional[int]
    data_agents: list[str] = field(default_factory=list)
    replay_bytes: int = 0
    replay_trajectories: int = 0
    world_model_bytes: int = 0
    manifest_bytes: int = 0
    problem: Optional[str] = None
    """Why its manifest, which is there, cannot be read (status ``unreadable``): the file, what is wrong, the fix."""

    @property
    def bytes(self) -> int:
        return self.replay_bytes + self.world_model_bytes + self.manifest_bytes

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "bytes": self.bytes}


def _tree_bytes(path: Path) -> int:
    if not path.is_dir():
        return 0
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _files_bytes(paths: Sequence[Path]) -> int:
    return sum(p.stat().st_size for p in paths if p.is_file())


def replay_buffer_if_present(state_dir: Path, *, read_only: bool = False) -> Optional[ReplayBuffer]:
    """The state dir's replay buffer, without creating one where there is none
    (``read_only``: opened for reading, so a read-only state dir can be listed)."""
    path = Path(state_dir) / REPLAY_FILE
    return ReplayBuffer(path, read_only=read_only) if path.is_file() else None


def _started_from_id(run_id: str) -> Optional[float]:
    """The start time in an id like ``seed0-20250101T120000-1a2b3c`` (local time)."""
    match = re.search(r"-(\d{8}T\d{6})-", run_id)
    if match is None:
        return None
    try:
        return time.mktime(time.strptime(match.group(1), "%Y%m%dT%H%M%S"))
    except (ValueError, OverflowError):
        return None


def list_runs(state_dir: Path) -> list[RunInfo]:
    """Every run in ``state_dir``, newest first. A run whose manifest cannot
    be read is listed too, its status ``unreadable`` and ``problem`` saying why."""
    state_dir = Path(state_dir)
    manifests: dict[str, Optional[dict[str, Any]]] = {}
    problems: dict[str, str] = {}
    runs_root = state_dir / RUNS_DIR
    for folder in sorted(runs_root.iterdir()) if runs_root.is_dir() else []:
        if not os.path.lexists(folder / MANIFEST_FILE):  # anything there (a FIFO, a dangling link) is read, and named
            continue
        try:
            manifests[folder.name] = read_manifest(state_dir, folder.name)
        except RunError as exc:  # one bad manifest does not hide the other runs
            manifests[folder.name], problems[folder.name] = None, str(exc)
    usage: dict[str, dict[str, Any]] = {}
    buffer = replay_buffer_if_present(state_dir, read_only=True)
    if buffer is not None:
        usage = buffer.usage()
    by_run: dict[str, list[str]] = {}
    for agent in usage:
        prefix, sep, run_id = agent.rpartition(":")
        if sep and prefix and _RUN_ID.match(run_id):
            by_run.setdefault(run_id, []).append(agent)
    for run_id, manifest in manifests.items():
        if manifest is not None and manifest.get("data_agent") in usage:
            by_run.setdefault(run_id, [])
            if manifest["data_agent"] not in by_run[run_id]:
                by_run[run_id].append(manifest["data_agent"])
    wm_root = state_dir / "world_model"
    wm_dirs = {p.name for p in wm_root.iterdir() if p.is_dir() and _RUN_ID.match(p.name)} if wm_root.is_dir() else set()
    found = []
    for run_id in set(manifests) | set(by_run) | wm_dirs:
        manifest = manifests.get(run_id)
        agents = sorted(by_run.get(run_id, []))
        replay = [usage[a] for a in agents]
        started = manifest.get("started") if manifest else None
        if started is None:
            started = _started_from_id(run_id)
        if started is None and replay:
            started = min(u["first_created"] for u in replay)
        if started is None and run_id in wm_dirs:
            started = (wm_root / run_id).stat().st_mtime
        status = effective_status(state_dir, manifest, run_id)
        found.append(
            RunInfo(
                run_id=run_id,
                status="unreadable" if run_id in problems and status == "unknown" else status,
                started=started,
                real_episodes=manifest.get("real_episodes") if manifest else None,
                generation=manifest.get("generation") if manifest else None,
                data_agents=agents,
                replay_bytes=sum(u["bytes"] for u in replay),
                replay_trajectories=sum(u["trajectories"] for u in replay),
                world_model_bytes=_tree_bytes(world_model_dir(state_dir, run_id)),
                manifest_bytes=_tree_bytes(runs_root / run_id),
                problem=problems.get(run_id),
            )
        )
    return sorted(found, key=lambda r: (r.started or 0.0, r.run_id), reverse=True)


def storage_totals(state_dir: Path) -> dict[str, int]:
    """Bytes on disk of the files that grow: the event log (with rotated
    parts), the replay database, the rollout ledger (never pruned), the
    world-model folders and the run manifests."""
    state_dir = Path(state_dir)

    def db(name: str) -> int:
        return _files_bytes([state_dir / name, state_dir / f"{name}-wal", state_dir / f"{name}-shm"])

    return {
        "events": _files_bytes(sorted(state_dir.glob("events.jsonl*"))),
        "replay_db": db(REPLAY_FILE),
        "ledger": db(LEDGER_FILE),
        "world_models": _tree_bytes(state_dir / "world_model"),
        "manifests": _tree_bytes(state_dir / RUNS_DIR),
    }


def select_for_pruning(
    found: Sequence[RunInfo], *, keep: Optional[int], older_than_s: Optional[float], now: float
) -> list[RunInfo]:
    """Runs past the ``keep`` newest and (when given) started more than
    ``older_than_s`` ago; running runs never."""
    if keep is None and older_than_s is None:
        raise ValueError("nothing to select: give --keep N and/or --older-than DURATION")
    newest_first = sorted(found, key=lambda r: (r.started or 0.0, r.run_id), reverse=True)
    chosen = newest_first[keep:] if keep is not None else newest_first
    if older_than_s is not None:
        chosen = [r for r in chosen if (r.started or 0.0) < now - older_than_s]
    return [r for r in chosen if r.status != "running"]


@dataclass
class PruneResult:
    deleted: list[RunInfo]
    skipped_running: list[str]
    replay_rows: int
    freed_bytes: int
    replay_db_before: int
    replay_db_after: int


def prune(state_dir: Path, chosen: Sequence[RunInfo], *, vacuum: bool = False) -> PruneResult:
    """Delete ``chosen`` runs: their replay rows (one transaction), then
    their manifests and world-model folders. Each run's lock is held while it
    goes, so a run resumed meanwhile is skipped, never half deleted. The
    rollout ledger and the event log are never touched."""
    state_dir = Path(state_dir)
    locks, deleted, skipped = [], [], []
    try:
        for run in chosen:
            if (state_dir / RUNS_DIR / run.run_id).is_dir():
                lock = RunLock(state_dir, run.run_id)
                if not lock.acquire():
                    skipped.append(run.run_id)
                    continue
                locks.append(lock)
            deleted.append(run)
        before = storage_totals(state_dir)["replay_db"]
        buffer = replay_buffer_if_present(state_dir)
        rows = buffer.delete_agents([a for r in deleted for a in r.data_agents]) if buffer is not None else 0
        for run in deleted:
            shutil.rmtree(world_model_dir(state_dir, run.run_id), ignore_errors=True)
            shutil.rmtree(state_dir / RUNS_DIR / run.run_id, ignore_errors=True)
        if vacuum and buffer is not None:
            buffer.vacuum()
        after = storage_totals(state_dir)["replay_db"]
    finally:
        for lock in locks:
            lock.release()
    return PruneResult(deleted, skipped, rows, sum(r.bytes for r in deleted), before, after)

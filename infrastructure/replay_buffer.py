"""SQLite (WAL) trajectory store.

One row per trajectory: agent, generation, candidate, return, outcome and its
transitions (observation, action, reward, next observation, done) stored as
raw little-endian arrays with their shapes; nothing is pickled, so reading a
foreign database can never run code.

* A generation is appended in one transaction: a process killed between (or
  during) generations loses at most the generation it had not committed.
* A locked database is retried (`genesis_fp16.base.storage.retry_locked`, the ledger's policy too), on top of
  SQLite's own busy timeout.
* A file that is not an SQLite database, or whose schema is broken, raises
  `ReplayBufferError` naming the file; a read-only file, a full disk
  or an I/O error says so (``kind``), never that the file is corrupt.
* The ``a*`` methods run the query in a worker thread (``asyncio.to_thread``)
  so long reads never block the event loop. Each call opens its own
  connection, so threads and processes can share one file.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from genesis_fp16.base import storage
from genesis_fp16.base.settings import Settings, env_name
from genesis_fp16.base.telemetry import get_logger

from .replay_rows import SCHEMA, COLUMNS, SCHEMA_VERSION, refuse_non_finite, row_to_trajectory, trajectory_row
from .trajectory import Trajectory, trajectories_from_episodes

__all__ = [
    "DEFAULT_FILENAME",
    "SCHEMA_VERSION",
    "ReplayBuffer",
    "ReplayBufferError",
    "Trajectory",
    "trajectories_from_episodes",
]

DEFAULT_FILENAME = "replay.sqlite"


class ReplayBufferError(storage.StorageError):
    """The replay database cannot be used; the message names the file,
    `kind` says why: `corrupt`, `read_only`, `full`, `permission`, `locked`
    or `io` (`genesis_fp16.base.storage.KINDS`)."""


class ReplayBuffer:
    """Trajectory store at `path` (default `<state_dir>/replay.sqlite`): an
    SQLite file that threads and processes may share. Trajectories are
    appended a generation at a time and read back most recent first; each has
    an id (`Trajectory.id`) by which `delete_trajectories` removes it. Raises
    `ReplayBufferError` when the file cannot be used."""

    def __init__(
        self,
        path: Union[str, Path, None] = None,
        *,
        settings: Optional[Settings] = None,
        busy_timeout_s: float = 5.0,
        read_only: bool = False,
    ) -> None:
        """``read_only``: open an existing database for reading only, creating
        and migrating nothing (works in a read-only state dir); a write then
        raises `ReplayBufferError` of kind ``read_only``."""
        dir_name = None  # how messages name the directory: the variable when it came from settings
        if path is None:
            from genesis_fp16.base.settings import load_settings

            settings = settings or load_settings()
            path = Path(settings.state_dir) / DEFAULT_FILENAME
            dir_name = env_name("state_dir")
        self.path = Path(path)
        self.busy_timeout_s = busy_timeout_s
        self.read_only = read_only
        self._log = get_logger("infrastructure.replay_buffer", path=str(self.path))
        try:
            storage.prepare_dir(self.path.parent, name=dir_name, create=not read_only, writable=not read_only)
        except storage.StorageError as exc:
            raise ReplayBufferError(str(exc), exc.kind) from None
        if read_only:
            self._run(self._check_schema_version)
        else:
            self._init_schema()

    # -- connections ---------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        try:
            if self.read_only:
                return storage.connect_read_only(self.path, timeout=self.busy_timeout_s)
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None)
        except sqlite3.Error as exc:
            raise self._fault(exc) from None
        return conn

    def _fault(self, exc: Exception) -> ReplayBufferError:
        kind = storage.fault_kind(exc, self.path)
        if kind in (
            "read_only",
            "full",
            "permission",
            "locked",
            "io",
        ):  # the file may be fine: do not advise moving it aside
            return ReplayBufferError(
                storage.describe(kind, "replay database", self.path, exc, lost="nothing of this call was committed"),
                kind,
            )
        return ReplayBufferError(
            f"{self.path}: the replay database is corrupt or not an SQLite file ({exc}); "
            "move it aside (the loop starts a fresh one) or restore it from a copy",
            "corrupt",
        )

    @storage.retry_locked
    def _init_schema(self) -> None:
        conn = self._connect()
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")  # a committed generation survives power loss too
            conn.executescript(SCHEMA)
            conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            self._check_schema_version(conn)
        except sqlite3.DatabaseError as exc:
            if storage.is_locked(exc):
                raise
            raise self._fault(exc) from None
        finally:
            conn.close()

    def _check_schema_version(self, conn: sqlite3.Connection) -> None:
        row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None or int(row[0]) > SCHEMA_VERSION:
            raise ReplayBufferError(
                f"{self.path}: replay schema version {row and row[0]!r} is newer than this code reads "
                f"({SCHEMA_VERSION})",
                "corrupt",
            )

    def _run(self, fn, *, write: bool = False):  # type: ignore[no-untyped-def]
        @storage.retry_locked
        def attempt():  # type: ignore[no-untyped-def]
            conn = self._connect()
            try:
                conn.execute("PRAGMA synchronous=FULL")
                if write:
                    conn.execute("BEGIN IMMEDIATE")
                    try:
                        result = fn(conn)
                    except BaseException:
                        if conn.in_transaction:  # SQLite already rolled back by itself on e.g. SQLITE_FULL
                            conn.execute("ROLLBACK")
                        raise
                    conn.execute("COMMIT")
                    return result
                return fn(conn)
            except sqlite3.DatabaseError as exc:
                if storage.is_locked(exc):
                    raise
                raise self._fault(exc) from None
            finally:
                conn.close()

        return attempt()

    # -- writes ----------------------------------------------------------------
    def append_generation(self, agent: str, generation: int, trajectories: Sequence[Trajectory]) -> list[int]:
        """Append a generation's trajectories in one transaction; returns their ids.

        Raises:
            ValueError: a trajectory holds NaN or inf (as float32) in obs,
                action, reward or next_obs; nothing of the generation is written.
            ReplayBufferError: the database cannot be written.
        """
        refuse_non_finite(agent, generation, trajectories)
        now = time.time()
        rows = [trajectory_row(agent, generation, traj, now) for traj in trajectories]

        def write(conn: sqlite3.Connection) -> list[int]:
            ids = []
            for row in rows:
                cur = conn.execute(
                    "INSERT INTO trajectories (agent, generation, candidate, return, outcome, length, obs_dim, act_dim,"
                    " obs, action, reward, next_obs, done, created) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    row,
                )
                ids.append(int(cur.lastrowid))
            return ids

        ids = self._run(write, write=True)
        self._log.debug("replay.appended", agent=agent, generation=generation, trajectories=len(ids))
        return ids

    def append(self, agent: str, generation: int, trajectory: Trajectory) -> int:
        """Append one trajectory (its own transaction); returns its id. Raises
        as `append_generation` does (a non-finite array: `ValueError`)."""
        return self.append_generation(agent, generation, [trajectory])[0]

    # -- reads -------------------------------------------------------------------

    def sample(
        self,
        agent: str,
        *,
        limit: Optional[int] = None,
        min_generation: Optional[int] = None,
        max_transitions: Optional[int] = None,
    ) -> list[Trajectory]:
        """Trajectories of ``agent``, most recent first: at most ``limit``
        trajectories, from ``min_generation`` on, stopping once
        ``max_transitions`` transitions are collected."""
        query = f"SELECT {COLUMNS} FROM trajectories WHERE agent = ?"
        args: list[Any] = [agent]
        if min_generation is not None:
            query += " AND generation >= ?"
            args.append(int(min_generation))
        query += " ORDER BY id DESC"
        if limit is not None:
            query += " LIMIT ?"
            args.append(int(limit))

        def read(conn: sqlite3.Connection) -> list[Trajectory]:
            out: list[Trajectory] = []
            total = 0
            for row in conn.execute(query, args):
                traj = row_to_trajectory(row)
                out.append(traj)
                total += traj.obs.shape[0]
                if max_transitions is not None and total >= max_transitions:
                    break
            return out

        return self._run(read)

    def count(self, agent: Optional[str] = None) -> dict[str, int]:
        """{"trajectories": n, "transitions": m, "generations": g} for ``agent`` (or all)."""
        where, args = ("WHERE agent = ?", [agent]) if agent is not None else ("", [])

        def read(conn: sqlite3.Connection) -> dict[str, int]:
            n, m, g = conn.execute(
                f"SELECT COUNT(*), COALESCE(SUM(length), 0), COUNT(DISTINCT generation) FROM trajectories {where}", args
            ).fetchone()
            return {"trajectories": int(n), "transitions": int(m), "generations": int(g)}

        return self._run(read)

    def agents(self) -> list[str]:
        """The agent names that have trajectories, sorted."""
        return self._run(
            lambda conn: [r[0] for r in conn.execute("SELECT DISTINCT agent FROM trajectories ORDER BY agent")]
        )

    def export(self, path: Union[str, Path], agent: Optional[str] = None) -> Path:
        """Write trajectories as JSON lines (atomically): one object per
        trajectory with its metadata and transitions as lists."""
        agents = [agent] if agent is not None else self.agents()
        lines = []
        for name in agents:
            for traj in reversed(self.sample(name)):
                lines.append(
                    json.dumps(
                        {
                            "id": traj.id,
                            "agent": traj.agent,
                            "generation": traj.generation,
                            "candidate": traj.candidate,
                            "return": traj.return_,
                            "outcome": traj.outcome,
                            "obs": traj.obs.tolist(),
                            "action": traj.action.tolist(),
                            "reward": traj.reward.tolist(),
                            "next_obs": traj.next_obs.tolist(),
                            "done": traj.done.tolist(),
                        }
                    )
                )
        from genesis_fp16.base.storage import atomic_write  # here: `state list` opens buffers and must not import torch

        text = "\n".join(lines) + ("\n" if lines else "")
        return atomic_write(path, lambda fh: fh.write(text.encode("utf-8")))

    # -- async wrappers ------------------------------------------------------------
    async def aappend_generation(self, agent: str, generation: int, trajectories: Sequence[Trajectory]) -> list[int]:
        """`append_generation` in a worker thread."""
        return await asyncio.to_thread(self.append_generation, agent, generation, list(trajectories))

    async def asample(self, agent: str, **kwargs: Any) -> list[Trajectory]:
        """`sample` in a worker thread; the same keyword arguments."""
        return await asyncio.to_thread(self.sample, agent, **kwargs)

    async def acount(self, agent: Optional[str] = None) -> dict[str, int]:
        """`count` in a worker thread."""
        return await asyncio.to_thread(self.count, agent)

    # -- retention (genesis-fp16 state, evolve --resume) -----------------------------
    ROW_OVERHEAD_BYTES = 64  # SQLite record header, the other columns and the index entries, roughly

    def usage(self) -> dict[str, dict[str, Any]]:
        """Per agent: trajectories, generations, approximate bytes (array
        blobs plus `ROW_OVERHEAD_BYTES` a row) and the first and last
        ``created`` time."""

        def read(conn: sqlite3.Connection) -> dict[str, dict[str, Any]]:
            rows = conn.execute(
                "SELECT agent, COUNT(*), COUNT(DISTINCT generation),"
                " SUM(length(obs) + length(action) + length(reward) + length(next_obs) + length(done) + "
                "length(candidate)),"
                " MIN(created), MAX(created) FROM trajectories GROUP BY agent"
            )
            return {
                agent: {
                    "trajectories": int(n),
                    "generations": int(g),
                    "bytes": int(b or 0) + n * self.ROW_OVERHEAD_BYTES,
                    "first_created": first,
                    "last_created": last,
                }
                for agent, n, g, b, first, last in rows
            }

        return self._run(read)

    def delete_agents(self, agents: Sequence[str]) -> int:
        """Delete every trajectory of ``agents`` in one transaction; returns
        the number of rows deleted. The file keeps its size (free pages are
        reused) until `vacuum`."""
        names = list(agents)

        def write(conn: sqlite3.Connection) -> int:
            return sum(conn.execute("DELETE FROM trajectories WHERE agent = ?", (name,)).rowcount for name in names)

        deleted = self._run(write, write=True) if names else 0
        self._log.info("replay.deleted", agents=len(names), trajectories=deleted)
        return deleted

    def delete_trajectories(self, ids: Sequence[int]) -> int:
        """Delete the trajectories with these ids (`Trajectory.id`, as
        `append_generation` returned them and errors name them), all or none.

        Args:
            ids: trajectory ids, of any agents.

        Returns:
            The number of trajectories deleted (`len(set(ids))`).

        Raises:
            ValueError: an id is not in the buffer; nothing is deleted.
            ReplayBufferError: the database cannot be written.
        """
        wanted = sorted({int(i) for i in ids})

        def write(conn: sqlite3.Connection) -> int:
            marks = ",".join("?" * len(wanted))
            found = {row[0] for row in conn.execute(f"SELECT id FROM trajectories WHERE id IN ({marks})", wanted)}
            unknown = [i for i in wanted if i not in found]
            if unknown:  # raised inside the transaction, so nothing of this call is deleted
                raise ValueError(
                    f"{self.path}: no trajectory with id {', '.join(map(str, unknown))}; nothing was deleted. "
                    "Ids are those append_generation returned (Trajectory.id on what sample() reads)"
                )
            return conn.execute(f"DELETE FROM trajectories WHERE id IN ({marks})", wanted).rowcount

        deleted = self._run(write, write=True) if wanted else 0
        self._log.info("replay.trajectories_deleted", ids=wanted, trajectories=deleted)
        return deleted

    def delete_generations_after(self, agent: str, generation: int) -> int:
        """Delete ``agent``'s trajectories of generations after ``generation``
        (one transaction); returns the number of rows deleted."""

        def write(conn: sqlite3.Connection) -> int:
            return conn.execute(
                "DELETE FROM trajectories WHERE agent = ? AND generation > ?", (agent, int(generation))
            ).rowcount

        return self._run(write, write=True)

    def vacuum(self) -> None:
        """Give free pages back to the file system: VACUUM, then truncate the WAL."""

        def run(conn: sqlite3.Connection) -> None:
            conn.execute("VACUUM")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

        self._run(run)

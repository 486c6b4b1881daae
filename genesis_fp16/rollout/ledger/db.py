"""The rollout ledger's SQLite file: connections, the schema, transactions,
and one error type for every fault.

Every write is one ``BEGIN IMMEDIATE`` transaction on a fresh connection, so
concurrent processes serialise on SQLite's own lock; a writer that still finds
the database locked after the busy timeout retries (`storage.retry_locked`, the
replay buffer's policy too). A ledger that cannot be written (a read-only file,
directory or mount) is still read: reads open it read-only, and a write fails
with one `LedgerError` saying it is read-only, never that it is corrupt. On a
full disk reads open it read-only too (`storage.connect_for_reading`), and a
write fails saying the disk is full. Something other than a regular file at
its path (a directory, a FIFO, a device) is one `LedgerError` naming it
(`check_ledger_path`), before anything is opened.
"""

from __future__ import annotations

import functools
import os
import sqlite3
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, TypeVar

from genesis_fp16.base import storage
from genesis_fp16.base import untrusted
from genesis_fp16.base.names import check_agent_name
from genesis_fp16.base.storage import StorageError
from genesis_fp16.rollout.ledger.schema import SCHEMA, SCHEMA_VERSION, migrate

LEDGER_FILE = "rollout.sqlite"


class LedgerError(StorageError):
    """The ledger could not be read or written; the message names the file,
    ``kind`` says why (see `genesis_fp16.base.storage.KINDS`)."""


def check_ledger_path(path: Path) -> None:
    """Raise `LedgerError` (kind ``path``) when something other than a regular
    file is at the ledger's ``path`` (a directory, a FIFO, a device), naming
    it; nothing there (or a dangling link, which SQLite follows to create the file) passes."""
    if os.path.exists(path) and not os.path.isfile(path):
        raise LedgerError(
            f"rollout ledger {path} {untrusted.not_regular(path)} (an SQLite database); move it aside: "
            "without a ledger every agent is unmanaged (its settings and profile decide)",
            "path",
        )


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


_F = TypeVar("_F", bound=Callable[..., Any])


def ledger_call(fn: _F) -> _F:
    """Retry a locked ledger (`storage.retry_locked`), then turn any SQLite
    error left into one `LedgerError` that says what kind of fault it is.
    For methods of a `LedgerFile` or of a `Store` over one."""
    retried = storage.retry_locked(fn)

    @functools.wraps(fn)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return retried(self, *args, **kwargs)
        except sqlite3.Error as exc:
            raise self.db._fault(exc) from None

    return call  # type: ignore[return-value]


class LedgerFile:
    """The ledger's SQLite file at ``path``. ``dir_name`` is how messages name
    its directory (the setting's variable when the path came from settings)."""

    def __init__(self, path: Path, dir_name: Optional[str] = None) -> None:
        self.path = Path(path)
        self._dir_name = dir_name
        self._initialised = False
        self._version = 0

    @property
    def db(self) -> "LedgerFile":
        return self

    def _read_only_error(self, detail: object) -> LedgerError:
        return LedgerError(
            f"rollout ledger {self.path} is read-only: {detail}; reads (rollout status, rollout history) still work; "
            "to change stages make the file and its directory writable",
            "read_only",
        )

    def _fault(self, exc: sqlite3.Error) -> LedgerError:
        kind = storage.fault_kind(exc, self.path)
        if kind == "read_only":
            return self._read_only_error(exc)
        if kind in ("full", "permission", "locked", "io"):
            return LedgerError(
                storage.describe(kind, "rollout ledger", self.path, exc, lost="nothing of this change was written"),
                kind,
            )
        return LedgerError(
            f"{self.path}: rollout ledger is not a usable SQLite database ({exc}); restore it from a copy, "
            "or move it aside to start an empty ledger (every agent unmanaged)",
            "corrupt",
        )

    def _connect(self, write: bool) -> sqlite3.Connection:
        """A connection for one transaction. A ledger this process cannot write
        is opened read-only for reads and refused here for writes; without a
        ledger file in an unwritable directory, reads see an empty ledger."""
        try:
            storage.prepare_dir(self.path.parent, name=self._dir_name, create=False, writable=False)
        except StorageError as exc:
            raise LedgerError(str(exc), exc.kind) from None
        check_ledger_path(self.path)
        # WAL needs the file and its directory (the -wal and -shm files) writable
        reason = storage.unwritable_reason(self.path) or storage.unwritable_reason(self.path.parent)
        if reason is None and not write and self.path.is_file():
            conn = storage.connect_for_reading(self.path)  # on a full disk: read-only, as in a read-only directory
            conn.execute("PRAGMA busy_timeout=10000")
        elif reason is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
            conn.execute("PRAGMA busy_timeout=10000")
        elif write:
            raise self._read_only_error(reason)
        elif self.path.is_file():
            conn = storage.connect_read_only(self.path)
        else:
            conn = sqlite3.connect(":memory:", isolation_level=None)
            conn.executescript(SCHEMA)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.row_factory = sqlite3.Row
        return conn

    @ledger_call
    def initialise(self) -> None:
        if self._initialised:
            return
        conn = self._connect(write=False)
        try:
            # the common case (an existing, current ledger) needs no write lock
            self._version = conn.execute("PRAGMA user_version").fetchone()[0]
            if self._version == SCHEMA_VERSION:
                self._initialised = True
                return
            if self._version > SCHEMA_VERSION:
                raise LedgerError(
                    f"rollout ledger {self.path} has schema version {self._version}, newer than this genesis-fp16 "
                    f"reads ({SCHEMA_VERSION}); upgrade genesis-fp16, or move the file aside to start an empty ledger",
                    "corrupt",
                )
            if storage.unwritable_reason(self.path) or storage.unwritable_reason(self.path.parent):
                # an older ledger that cannot be migrated is still read; what it lacks reads as empty
                self._initialised = True
                return
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("BEGIN IMMEDIATE")
            migrate(conn)
            conn.execute("COMMIT")
            self._version = SCHEMA_VERSION
        except BaseException:
            if conn.in_transaction:  # SQLite rolls back by itself on e.g. a full disk
                conn.execute("ROLLBACK")
            raise
        finally:
            conn.close()
        self._initialised = True

    def has_current_schema(self) -> bool:
        """False only for an older ledger this process could not migrate (read-only)."""
        self.initialise()
        return self._version >= SCHEMA_VERSION

    @contextmanager
    def transaction(self, write: bool) -> Iterator[sqlite3.Connection]:
        self.initialise()
        conn = self._connect(write)
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        finally:
            conn.close()

    def rows_for(self, select: str, agent: Optional[str]) -> list[Any]:
        """``select`` (a whole table, no WHERE) for one agent or all, oldest first."""
        args: tuple[Any, ...] = ()
        if agent is not None:
            select += " WHERE agent = ?"
            args = (check_agent_name(agent),)
        with self.transaction(write=False) as conn:
            return conn.execute(select + " ORDER BY id", args).fetchall()


class Store:
    """One kind of record in the ledger, over its `LedgerFile`."""

    def __init__(self, db: LedgerFile) -> None:
        self.db = db

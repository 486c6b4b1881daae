"""The rollout ledger: per-agent stage of reduced precision, with history.

Stages: ``off`` (FP32), ``shadow`` (reduced precision, an FP32 reference is
measured beside it), ``on`` (reduced precision) and ``rolled_back`` (FP32
until a person re-enables it). An agent the ledger has never seen has no stage
(``None``): settings and its profile decide alone.

The ledger is SQLite in ``<state_dir>/rollout.sqlite`` in WAL mode. Every
write is one ``BEGIN IMMEDIATE`` transaction on a fresh connection, so
concurrent processes serialise on SQLite's own lock; a writer that still finds
the database locked after the busy timeout retries with backoff (tenacity).

A ledger that cannot be written (a read-only file, directory or mount) is
still read: reads open it read-only, and a write fails with one
`LedgerError` saying it is read-only, never that it is corrupt.
"""

from __future__ import annotations

import functools
import json
import math
import sqlite3
from contextlib import contextmanager
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, TypeVar, Union

from tenacity import retry, retry_if_exception, stop_after_attempt, wait_random_exponential

from . import storage
from .names import check_agent_name
from .settings import Settings, env_name, load_settings
from .storage import StorageError
from .telemetry import get_logger

LEDGER_FILE = "rollout.sqlite"


class TextEnum(str, Enum):
    """A ``str`` Enum that prints as its value, so messages, JSON and the
    ledger's columns hold the plain string."""

    def __str__(self) -> str:
        return str(self.value)

    __format__ = str.__format__


class Stage(TextEnum):
    """An agent's rollout stage."""

    OFF = "off"
    SHADOW = "shadow"
    ON = "on"
    ROLLED_BACK = "rolled_back"


class Severity(TextEnum):
    """How bad a guard finding is: P0 rolls back now, P1 rolls back, P2 warns."""

    P0 = "P0"
    P1 = "P1"
    P2 = "P2"


STAGES = tuple(s.value for s in Stage)
SEVERITIES = tuple(s.value for s in Severity)
# quality checks beside the shadow gaps: an FP32 canary's val-loss gap (stage on),
# a policy canary's KL / deltas (PPO), the inference-side gap (val loss with and without autocast)
QUALITY_KINDS = ("canary", "policy_canary", "inference_gap")
# the guard's confirmation windows, one per kind of FP32 reference (the policy canary shares "canary")
WINDOW_KINDS = ("shadow", "canary")

# to_stage NULL: a reset (the agent is unmanaged again), as from_stage NULL is a new agent
_HISTORY_COLUMNS = """
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    agent TEXT NOT NULL,
    at TEXT NOT NULL,
    actor TEXT NOT NULL,
    from_stage TEXT,
    to_stage TEXT,
    reason TEXT NOT NULL,
    severity TEXT
"""
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS stages (
    agent TEXT PRIMARY KEY,
    stage TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    actor TEXT NOT NULL,
    reason TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS history ({_HISTORY_COLUMNS});
CREATE TABLE IF NOT EXISTS shadow_gaps (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    agent TEXT NOT NULL,
    at TEXT NOT NULL,
    val_loss REAL NOT NULL,
    fp32_val_loss REAL NOT NULL,
    gap REAL,
    precision TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS recommendations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    agent TEXT NOT NULL,
    at TEXT NOT NULL,
    severity TEXT,
    changes TEXT NOT NULL,
    reason TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS quality_checks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    agent TEXT NOT NULL,
    at TEXT NOT NULL,
    kind TEXT NOT NULL,
    precision TEXT,
    alarm INTEGER,
    metrics TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS good_checkpoints (
    agent TEXT PRIMARY KEY,
    path TEXT NOT NULL,
    at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS guard_windows (
    agent TEXT NOT NULL,
    kind TEXT NOT NULL,
    outcomes TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (agent, kind)
);
CREATE TABLE IF NOT EXISTS canary_calls (
    agent TEXT PRIMARY KEY,
    calls INTEGER NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tuning_applied (
    agent TEXT NOT NULL,
    profiles TEXT NOT NULL,
    through TEXT NOT NULL,
    at TEXT NOT NULL,
    changes TEXT NOT NULL,
    PRIMARY KEY (agent, profiles)
);
CREATE TABLE IF NOT EXISTS calibrations (
    key TEXT PRIMARY KEY,
    at TEXT NOT NULL,
    precision TEXT NOT NULL,
    record TEXT NOT NULL
);
"""
# PRAGMA user_version of a ledger with the schema above. 0 is a ledger written
# before versioning (to_stage NOT NULL, no guard_windows / canary_calls /
# tuning_applied), 2 one without calibrations: `_migrate` brings them here.
SCHEMA_VERSION = 3


class LedgerError(StorageError):
    """The ledger could not be read or written; the message names the file,
    ``kind`` says why (see `genesis_fp16.storage.KINDS`)."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def _is_locked(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)


# SQLite's busy timeout handles most contention; this covers the cases it does
# not (a lock held past the timeout, WAL recovery after a crashed writer).
_retry_locked = retry(
    retry=retry_if_exception(_is_locked),
    wait=wait_random_exponential(multiplier=0.05, max=1.0),
    stop=stop_after_attempt(12),
    reraise=True,
)

_F = TypeVar("_F", bound=Callable[..., Any])


def _ledger_call(fn: _F) -> _F:
    """Retry a locked ledger (above), then turn any SQLite error left into one
    `LedgerError` that says what kind of fault it is."""
    retried = _retry_locked(fn)

    @functools.wraps(fn)
    def call(self: "RolloutLedger", *args: Any, **kwargs: Any) -> Any:
        try:
            return retried(self, *args, **kwargs)
        except sqlite3.Error as exc:
            raise self._fault(exc) from None

    return call  # type: ignore[return-value]


def _real_in(value: float) -> Any:
    """SQLite binds NaN as NULL, which the NOT NULL loss columns refuse: keep it as the text 'nan'."""
    return "nan" if math.isnan(value) else value


def _gap_row(row: Any) -> dict[str, Any]:
    out = dict(row)
    for key in ("val_loss", "fp32_val_loss"):
        if isinstance(out.get(key), str):
            out[key] = float(out[key])
    return out


def _value(item: Any) -> Any:
    """An Enum as its plain value (for SQLite and event fields); anything else as it is."""
    return item.value if isinstance(item, Enum) else item


def _check_window_kind(kind: str) -> str:
    if kind not in WINDOW_KINDS:
        raise ValueError(f"guard window kind {kind!r}: allowed values are {', '.join(WINDOW_KINDS)}")
    return str(kind)


def _profiles_key(path: Union[str, Path]) -> str:
    return str(Path(path).expanduser().resolve())


def _calibration_row(text: str) -> Optional[dict[str, Any]]:
    """A stored calibration, or None for a row that is not a JSON object (never trusted further)."""
    try:
        record = json.loads(text)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _check_row(row: Any) -> dict[str, Any]:
    return dict(row, alarm=None if row["alarm"] is None else bool(row["alarm"]), metrics=json.loads(row["metrics"]))




class RolloutLedger:
    """Persistent per-agent rollout stages. ``RolloutLedger(path)`` or
    ``RolloutLedger(settings=...)`` / `from_settings`."""

    def __init__(self, path: Union[str, Path, None] = None, *, settings: Optional[Settings] = None) -> None:
        # how messages name the directory: the variable when it came from settings
        self._dir_name: Optional[str] = None
        if path is None:
            settings = settings or load_settings()
            path = Path(settings.state_dir) / LEDGER_FILE
            self._dir_name = env_name("state_dir")
        self.path = Path(path)
        self._log = get_logger("genesis_fp16.rollout")
        self._initialised = False
        self._version = 0

    @classmethod
    def from_settings(cls, settings: Optional[Settings] = None) -> "RolloutLedger":
        """The ledger of ``settings`` (default: ``load_settings()``): ``<state_dir>/rollout.sqlite``."""
        return cls(settings=settings or load_settings())

    # -- connection ------------------------------------------------------------
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
            return LedgerError(storage.describe(kind, "rollout ledger", self.path, exc, lost="nothing of this change was written"), kind)
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
        # WAL needs the file and its directory (the -wal and -shm files) writable
        reason = storage.unwritable_reason(self.path) or storage.unwritable_reason(self.path.parent)
        if reason is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
            conn.execute("PRAGMA busy_timeout=10000")
        elif write:
            raise self._read_only_error(reason)
        elif self.path.is_file():
            conn = storage.connect_read_only(self.path)
        else:
            conn = sqlite3.connect(":memory:", isolation_level=None)
            conn.executescript(_SCHEMA)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.row_factory = sqlite3.Row
        return conn

    @_ledger_call
    def _init(self) -> None:
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
            self._migrate(conn)
            conn.execute("COMMIT")
            self._version = SCHEMA_VERSION
        except BaseException:
            if conn.in_transaction:  # SQLite rolls back by itself on e.g. a full disk
                conn.execute("ROLLBACK")
            raise
        finally:
            conn.close()
        self._initialised = True

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        """Bring the ledger to `SCHEMA_VERSION` inside the caller's write
        transaction (another process may have done it while this one waited)."""
        if conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
            return
        old_history = [r[1:4] for r in conn.execute("PRAGMA table_info(history)")]
        for statement in filter(str.strip, _SCHEMA.split(";")):
            conn.execute(statement)
        if ("to_stage", "TEXT", 1) in old_history:
            # a reset returns an agent to no stage: history.to_stage becomes nullable
            # (SQLite cannot drop a NOT NULL in place: copy into a new table)
            conn.execute(f"CREATE TABLE history_v2 ({_HISTORY_COLUMNS})")
            conn.execute("INSERT INTO history_v2 SELECT id, agent, at, actor, from_stage, to_stage, reason, severity FROM history")
            conn.execute("DROP TABLE history")
            conn.execute("ALTER TABLE history_v2 RENAME TO history")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _has_current_schema(self) -> bool:
        """False only for an older ledger this process could not migrate (read-only)."""
        self._init()
        return self._version >= SCHEMA_VERSION

    @contextmanager
    def _transaction(self, write: bool) -> Iterator[sqlite3.Connection]:
        self._init()
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

    # -- reads -----------------------------------------------------------------
    def _rows_for(self, select: str, agent: Optional[str]) -> list[Any]:
        """``select`` (a whole table, no WHERE) for one agent or all, oldest first."""
        args: tuple[Any, ...] = ()
        if agent is not None:
            select += " WHERE agent = ?"
            args = (check_agent_name(agent),)
        with self._transaction(write=False) as conn:
            return conn.execute(select + " ORDER BY id", args).fetchall()

    @_ledger_call
    def stage(self, agent: str) -> Optional[Stage]:
        """The agent's stage, or None when the ledger does not manage it (never seen, or reset)."""
        agent = check_agent_name(agent)
        with self._transaction(write=False) as conn:
            row = conn.execute("SELECT stage FROM stages WHERE agent = ?", (agent,)).fetchone()
        return self._stage_of(row["stage"]) if row else None

    def _stage_of(self, value: Optional[str]) -> Optional[Stage]:
        if value is None:
            return None
        try:
            return Stage(value)
        except ValueError:
            raise LedgerError(
                f"rollout ledger {self.path} holds stage {value!r}; expected one of {', '.join(STAGES)}: "
                "set the agent's stage again (genesis-fp16 rollout enable|disable|reset AGENT)",
                "corrupt",
            ) from None

    @_ledger_call
    def history(self, agent: Optional[str] = None) -> list[dict[str, Any]]:
        """Every stage change, oldest first: when, actor, from_stage, to_stage,
        reason, severity. A stage None is no stage (a new agent, or a reset)."""
        rows = self._rows_for("SELECT agent, at, actor, from_stage, to_stage, reason, severity FROM history", agent)
        return [
            {"agent": r["agent"], "when": r["at"], "actor": r["actor"], "from_stage": self._stage_of(r["from_stage"]),
             "to_stage": self._stage_of(r["to_stage"]), "reason": r["reason"],
             "severity": None if r["severity"] is None else Severity(r["severity"])}
            for r in rows
        ]

    @_ledger_call
    def status(self) -> list[dict[str, Any]]:
        """One row per managed agent: stage, since when, who, why, the last
        good checkpoint, and the latest quality check of each kind
        (``last_checks``: ``shadow_gap`` and each of `QUALITY_KINDS`, each
        with its time ``at``, or None; ``last_shadow_gap`` is the first)."""
        with self._transaction(write=False) as conn:
            rows = conn.execute("SELECT agent, stage, updated_at, actor, reason FROM stages ORDER BY agent").fetchall()
            out = []
            for r in rows:
                gap = conn.execute(
                    "SELECT at, val_loss, fp32_val_loss, gap, precision FROM shadow_gaps WHERE agent = ? ORDER BY id DESC LIMIT 1",
                    (r["agent"],),
                ).fetchone()
                checks: dict[str, Any] = {"shadow_gap": _gap_row(gap) if gap else None}
                for kind in QUALITY_KINDS:
                    row = conn.execute(
                        "SELECT at, kind, precision, alarm, metrics FROM quality_checks WHERE agent = ? AND kind = ? "
                        "ORDER BY id DESC LIMIT 1",
                        (r["agent"], kind),
                    ).fetchone()
                    checks[kind] = _check_row(row) if row else None
                good = conn.execute("SELECT path FROM good_checkpoints WHERE agent = ?", (r["agent"],)).fetchone()
                out.append(
                    {
                        "agent": r["agent"],
                        "stage": self._stage_of(r["stage"]),
                        "since": r["updated_at"],
                        "actor": r["actor"],
                        "reason": r["reason"],
                        "last_shadow_gap": checks["shadow_gap"],
                        "last_checks": checks,
                        "last_good_checkpoint": good["path"] if good else None,
                    }
                )
        return out

    @_ledger_call
    def shadow_gaps(self, agent: str) -> list[dict[str, Any]]:
        with self._transaction(write=False) as conn:
            rows = conn.execute(
                "SELECT at, val_loss, fp32_val_loss, gap, precision FROM shadow_gaps WHERE agent = ? ORDER BY id",
                (check_agent_name(agent),),
            ).fetchall()
        return [_gap_row(r) for r in rows]

    @_ledger_call
    def quality_checks(self, agent: Optional[str] = None, kind: Optional[str] = None) -> list[dict[str, Any]]:
        """Recorded quality checks, oldest first: agent, at, kind, precision, alarm (bool or None), metrics."""
        rows = self._rows_for("SELECT agent, at, kind, precision, alarm, metrics FROM quality_checks", agent)
        return [_check_row(r) for r in rows if kind is None or r["kind"] == kind]

    @_ledger_call
    def recommendations(self, agent: Optional[str] = None) -> list[dict[str, Any]]:
        rows = self._rows_for("SELECT agent, at, severity, changes, reason FROM recommendations", agent)
        return [dict(r, changes=json.loads(r["changes"])) for r in rows]

    @_ledger_call
    def last_good_checkpoint(self, agent: str) -> Optional[Path]:
        with self._transaction(write=False) as conn:
            row = conn.execute("SELECT path FROM good_checkpoints WHERE agent = ?", (check_agent_name(agent),)).fetchone()
        return Path(row["path"]) if row else None

    # -- writes ----------------------------------------------------------------
    @_ledger_call
    def _set_stage(
        self, agent: str, to_stage: Optional[Union[Stage, str]], actor: str, reason: str, severity: Optional[Union[Severity, str]] = None
    ) -> dict[str, Any]:
        """Write ``to_stage`` (None: forget the agent's stage) and its history
        row. Any stage change also clears the agent's canary schedule and
        confirmation windows: they belong to the stage they were counted in."""
        agent = check_agent_name(agent)
        if to_stage is not None and to_stage not in STAGES:
            raise ValueError(f"stage {to_stage!r}: allowed values are {', '.join(STAGES)}")
        if severity is not None and severity not in SEVERITIES:
            raise ValueError(f"severity {severity!r}: allowed values are {', '.join(SEVERITIES)} or None")
        to_stage = None if to_stage is None else Stage(to_stage)
        severity = None if severity is None else Severity(severity)
        at = _now()
        with self._transaction(write=True) as conn:
            row = conn.execute("SELECT stage FROM stages WHERE agent = ?", (agent,)).fetchone()
            from_stage = self._stage_of(row["stage"]) if row else None
            if to_stage is None:
                conn.execute("DELETE FROM stages WHERE agent = ?", (agent,))
            else:
                conn.execute(
                    "INSERT INTO stages (agent, stage, updated_at, actor, reason) VALUES (?, ?, ?, ?, ?) "
                    "ON CONFLICT(agent) DO UPDATE SET stage=excluded.stage, updated_at=excluded.updated_at, "
                    "actor=excluded.actor, reason=excluded.reason",
                    (agent, to_stage.value, at, actor, reason),
                )
            conn.execute(
                "INSERT INTO history (agent, at, actor, from_stage, to_stage, reason, severity) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (agent, at, actor, _value(from_stage), _value(to_stage), reason, _value(severity)),
            )
            conn.execute("DELETE FROM guard_windows WHERE agent = ?", (agent,))
            conn.execute("DELETE FROM canary_calls WHERE agent = ?", (agent,))
        entry = {"agent": agent, "when": at, "actor": actor, "from_stage": from_stage, "to_stage": to_stage,
                 "reason": reason, "severity": severity}
        level = "warning" if to_stage == Stage.ROLLED_BACK else "info"
        # the event carries the history row (its own timestamp stands for "when")
        fields = {key: _value(value) for key, value in entry.items() if key != "when"}
        getattr(self._log, level)("rollout.stage_changed", **fields, ledger=str(self.path))
        return entry

    def enable(self, agent: str, shadow: bool = False, actor: str = "cli", reason: str = "") -> dict[str, Any]:
        """Move ``agent`` to ``shadow`` (FP32 reference measured beside it) or ``on``."""
        stage = Stage.SHADOW if shadow else Stage.ON
        return self._set_stage(agent, stage, actor, reason or f"enabled ({stage})")

    def disable(self, agent: str, actor: str = "cli", reason: str = "") -> dict[str, Any]:
        """Move ``agent`` to ``off`` (FP32)."""
        return self._set_stage(agent, Stage.OFF, actor, reason or "disabled")

    def rollback(
        self, agent: str, reason: str, actor: str = "guard", severity: Optional[Union[Severity, str]] = None
    ) -> dict[str, Any]:
        """Move ``agent`` to ``rolled_back`` (FP32 until re-enabled)."""
        if not reason or not reason.strip():
            raise ValueError("rollback needs a reason (what went wrong), e.g. --reason 'val loss 30% over FP32'")
        return self._set_stage(agent, Stage.ROLLED_BACK, actor, reason, severity)

    def reset(self, agent: str, actor: str = "cli", reason: str = "") -> dict[str, Any]:
        """Return ``agent`` to the settings' default: its stage is forgotten
        (`stage` is None, as for an agent never seen), its history kept with a
        row whose ``to_stage`` is None. An agent the ledger does not manage is
        a ValueError naming the agents it does."""
        agent = check_agent_name(agent)
        if self.stage(agent) is None:
            known = [row["agent"] for row in self.status()]
            raise ValueError(
                f"agent {agent!r} has no stage in the rollout ledger {self.path}: nothing to reset; "
                f"agents with a stage: {', '.join(known) or 'none'}"
            )
        return self._set_stage(agent, None, actor, reason or "reset to the settings' default")

    # -- the guard's state across processes ---------------------------------------------
    @_ledger_call
    def guard_window(self, agent: str, kind: str) -> list[bool]:
        """The outcomes (True: an alarm) of ``agent``'s last FP32-reference
        checks of ``kind`` (`WINDOW_KINDS`), oldest first; cleared by any stage change."""
        agent, kind = check_agent_name(agent), _check_window_kind(kind)
        if not self._has_current_schema():
            return []
        with self._transaction(write=False) as conn:
            row = conn.execute("SELECT outcomes FROM guard_windows WHERE agent = ? AND kind = ?", (agent, kind)).fetchone()
        return [bool(v) for v in json.loads(row["outcomes"])] if row else []

    @_ledger_call
    def push_guard_outcome(self, agent: str, kind: str, alarm: bool, keep: int) -> list[bool]:
        """Append one outcome to ``agent``'s window of ``kind``, keep the last
        ``keep``, and return the window (one transaction, so two processes
        never lose each other's outcome)."""
        agent, kind = check_agent_name(agent), _check_window_kind(kind)
        if keep < 1:
            raise ValueError(f"push_guard_outcome: keep={keep}; expected a window of at least 1")
        with self._transaction(write=True) as conn:
            row = conn.execute("SELECT outcomes FROM guard_windows WHERE agent = ? AND kind = ?", (agent, kind)).fetchone()
            window = ([bool(v) for v in json.loads(row["outcomes"])] if row else []) + [bool(alarm)]
            window = window[-keep:]
            conn.execute(
                "INSERT INTO guard_windows (agent, kind, outcomes, updated_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(agent, kind) DO UPDATE SET outcomes=excluded.outcomes, updated_at=excluded.updated_at",
                (agent, kind, json.dumps(window), _now()),
            )
        return window

    @_ledger_call
    def clear_guard_windows(self, agent: str) -> None:
        """Forget ``agent``'s confirmation windows (the next trainer starts new ones)."""
        with self._transaction(write=True) as conn:
            conn.execute("DELETE FROM guard_windows WHERE agent = ?", (check_agent_name(agent),))

    @_ledger_call
    def count_canary_call(self, agent: str) -> int:
        """Count one reduced-precision training call of ``agent`` in stage on
        and return the count (1, 2, ...) since its last stage change."""
        agent = check_agent_name(agent)
        with self._transaction(write=True) as conn:
            conn.execute(
                "INSERT INTO canary_calls (agent, calls, updated_at) VALUES (?, 1, ?) "
                "ON CONFLICT(agent) DO UPDATE SET calls = calls + 1, updated_at = excluded.updated_at",
                (agent, _now()),
            )
            return int(conn.execute("SELECT calls FROM canary_calls WHERE agent = ?", (agent,)).fetchone()["calls"])

    @_ledger_call
    def canary_calls(self, agent: str) -> int:
        """How many calls `count_canary_call` has counted for ``agent`` since its last stage change."""
        agent = check_agent_name(agent)
        if not self._has_current_schema():
            return 0
        with self._transaction(write=False) as conn:
            row = conn.execute("SELECT calls FROM canary_calls WHERE agent = ?", (agent,)).fetchone()
        return int(row["calls"]) if row else 0

    # -- what `genesis-fp16 tune --apply` has already applied ------------------------------
    @_ledger_call
    def tuning_applied_through(self, agent: str, profiles: Union[str, Path]) -> Optional[str]:
        """The timestamp of the newest event of ``agent`` already turned into a
        change of the profile file ``profiles``; None when none was."""
        agent = check_agent_name(agent)
        if not self._has_current_schema():
            return None
        with self._transaction(write=False) as conn:
            row = conn.execute(
                "SELECT through FROM tuning_applied WHERE agent = ? AND profiles = ?", (agent, _profiles_key(profiles))
            ).fetchone()
        return row["through"] if row else None

    @_ledger_call
    def record_tuning_applied(self, agent: str, profiles: Union[str, Path], through: str, changes: dict[str, Any]) -> None:
        """Remember that ``agent``'s events up to ``through`` were applied to ``profiles`` as ``changes``."""
        with self._transaction(write=True) as conn:
            conn.execute(
                "INSERT INTO tuning_applied (agent, profiles, through, at, changes) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT(agent, profiles) DO UPDATE SET through=excluded.through, at=excluded.at, changes=excluded.changes",
                (check_agent_name(agent), _profiles_key(profiles), through, _now(), json.dumps(changes, sort_keys=True)),
            )

    # -- what `precision=auto` measured (genesis_fp16.calibration) -----------------------
    @_ledger_call
    def calibration(self, key: str) -> Optional[dict[str, Any]]:
        """The calibration recorded for workload ``key``, or None."""
        if not self._has_current_schema():
            return None
        with self._transaction(write=False) as conn:
            row = conn.execute("SELECT record FROM calibrations WHERE key = ?", (str(key),)).fetchone()
        return _calibration_row(row["record"]) if row else None

    @_ledger_call
    def calibrations(self) -> list[dict[str, Any]]:
        """Every recorded calibration, oldest first."""
        if not self._has_current_schema():
            return []
        with self._transaction(write=False) as conn:
            rows = conn.execute("SELECT record FROM calibrations ORDER BY at, key").fetchall()
        return [r for r in (_calibration_row(row["record"]) for row in rows) if r is not None]

    @_ledger_call
    def record_calibration(self, record: dict[str, Any]) -> None:
        """Keep a calibration (a JSON object with ``key``, ``at`` and ``precision``), replacing the workload's last."""
        text = json.dumps(record, sort_keys=True, allow_nan=False)
        with self._transaction(write=True) as conn:
            conn.execute(
                "INSERT INTO calibrations (key, at, precision, record) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET at=excluded.at, precision=excluded.precision, record=excluded.record",
                (str(record["key"]), str(record["at"]), str(record["precision"]), text),
            )

    @_ledger_call
    def clear_calibrations(self) -> int:
        """Forget every calibration (`genesis-fp16 doctor --recalibrate`); returns how many there were."""
        if not self._has_current_schema():
            return 0
        with self._transaction(write=True) as conn:
            return conn.execute("DELETE FROM calibrations").rowcount

    @_ledger_call
    def record_shadow_gap(self, agent: str, val_loss: float, fp32_val_loss: float, precision: str) -> dict[str, Any]:
        """Record one shadow measurement; ``gap`` is ``(val_loss - fp32) / fp32``
        (0.25 = reduced precision is 25% worse), None when the FP32 loss is 0 or not finite."""
        agent = check_agent_name(agent)
        val_loss, fp32_val_loss = float(val_loss), float(fp32_val_loss)
        gap = (val_loss - fp32_val_loss) / fp32_val_loss if fp32_val_loss > 0 and math.isfinite(fp32_val_loss) else None
        if gap is not None and not math.isfinite(gap):
            gap = None
        at = _now()
        with self._transaction(write=True) as conn:
            conn.execute(
                "INSERT INTO shadow_gaps (agent, at, val_loss, fp32_val_loss, gap, precision) VALUES (?, ?, ?, ?, ?, ?)",
                (agent, at, _real_in(val_loss), _real_in(fp32_val_loss), gap, str(precision)),
            )
        self._log.info(
            "rollout.shadow_gap", agent=agent, val_loss=val_loss, fp32_val_loss=fp32_val_loss, gap=gap, precision=str(precision)
        )
        return {"agent": agent, "at": at, "val_loss": val_loss, "fp32_val_loss": fp32_val_loss, "gap": gap, "precision": str(precision)}

    @_ledger_call
    def record_quality_check(
        self, agent: str, kind: str, metrics: dict[str, Any], precision: Optional[str] = None, alarm: Optional[bool] = None
    ) -> dict[str, Any]:
        """Record one quality check (``kind`` in `QUALITY_KINDS`); ``metrics``
        are JSON numbers (a non-finite one is stored as null)."""
        agent = check_agent_name(agent)
        if kind not in QUALITY_KINDS:
            raise ValueError(f"quality check kind {kind!r}: allowed values are {', '.join(QUALITY_KINDS)}")
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
        at = _now()
        with self._transaction(write=True) as conn:
            conn.execute(
                "INSERT INTO quality_checks (agent, at, kind, precision, alarm, metrics) VALUES (?, ?, ?, ?, ?, ?)",
                (agent, at, kind, precision, None if alarm is None else int(bool(alarm)), json.dumps(clean, sort_keys=True)),
            )
        self._log.info("rollout.quality_check", agent=agent, kind=kind, precision=precision, alarm=alarm, **clean)
        return {"agent": agent, "at": at, "kind": kind, "precision": precision, "alarm": alarm, "metrics": clean}

    @_ledger_call
    def record_recommendation(self, agent: str, changes: dict[str, Any], reason: str, severity: Optional[str] = None) -> None:
        with self._transaction(write=True) as conn:
            conn.execute(
                "INSERT INTO recommendations (agent, at, severity, changes, reason) VALUES (?, ?, ?, ?, ?)",
                (check_agent_name(agent), _now(), severity, json.dumps(changes, sort_keys=True), reason),
            )

    @_ledger_call
    def set_last_good_checkpoint(self, agent: str, path: Union[str, Path]) -> None:
        with self._transaction(write=True) as conn:
            conn.execute(
                "INSERT INTO good_checkpoints (agent, path, at) VALUES (?, ?, ?) "
                "ON CONFLICT(agent) DO UPDATE SET path=excluded.path, at=excluded.at",
                (check_agent_name(agent), str(Path(path).resolve()), _now()),
            )


_STAGES: dict[tuple[str, str], tuple[tuple[storage.FileStamp, Optional[storage.FileStamp]], Optional[Stage]]] = {}
"""(ledger path, agent) -> (the stamps of the ledger and of its write-ahead log when read, the stage read)."""


def current_stage(agent: str, settings: Settings) -> Optional[Stage]:
    """off | shadow | on | rolled_back, or None for an agent the ledger does not
    manage. Never creates the ledger: without the file every agent is unmanaged.
    Read again only when the ledger file or its write-ahead log changed since
    the last read (a trainer resolves its policy at every training call: PPO
    once per iteration, where a read costs a few milliseconds)."""
    check_agent_name(agent)
    path = Path(settings.state_dir) / LEDGER_FILE
    ledger = storage.file_stamp(path)  # before reading: a write during the read is seen at the next call
    if ledger is None:
        return None
    stamp = (ledger, storage.file_stamp(path.with_name(path.name + "-wal")))  # every committed write changes one of them
    key = (str(path), agent)
    cached = _STAGES.get(key)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    stage = RolloutLedger(path).stage(agent)
    _STAGES[key] = (stamp, stage)
    return stage

"""The rollout ledger's tables, its schema version, and the migration from older ledgers."""

from __future__ import annotations

import sqlite3

# to_stage NULL: a reset (the agent is unmanaged again), as from_stage NULL is a new agent
HISTORY_COLUMNS = """
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    agent TEXT NOT NULL,
    at TEXT NOT NULL,
    actor TEXT NOT NULL,
    from_stage TEXT,
    to_stage TEXT,
    reason TEXT NOT NULL,
    severity TEXT
"""
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS stages (
    agent TEXT PRIMARY KEY,
    stage TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    actor TEXT NOT NULL,
    reason TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS history ({HISTORY_COLUMNS});
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
# `calibrations` was version 3's per-state-dir cache of auto's decisions, replaced by
# the host-level cache (genesis_fp16.precision.measure); kept so a version-3 ledger needs no migration.
# PRAGMA user_version of a ledger with the schema above. 0 is a ledger written
# before versioning (to_stage NOT NULL, no guard_windows / canary_calls /
# tuning_applied), 2 one without calibrations: `migrate` brings them here.
SCHEMA_VERSION = 3


def migrate(conn: sqlite3.Connection) -> None:
    """Bring the ledger to `SCHEMA_VERSION` inside the caller's write
    transaction (another process may have done it while this one waited)."""
    if conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
        return
    old_history = [r[1:4] for r in conn.execute("PRAGMA table_info(history)")]
    for statement in filter(str.strip, SCHEMA.split(";")):
        conn.execute(statement)
    if ("to_stage", "TEXT", 1) in old_history:
        # a reset returns an agent to no stage: history.to_stage becomes nullable
        # (SQLite cannot drop a NOT NULL in place: copy into a new table)
        conn.execute(f"CREATE TABLE history_v2 ({HISTORY_COLUMNS})")
        conn.execute(
            "INSERT INTO history_v2 SELECT id, agent, at, actor, from_stage, to_stage, reason, severity FROM history"
        )
        conn.execute("DROP TABLE history")
        conn.execute("ALTER TABLE history_v2 RENAME TO history")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

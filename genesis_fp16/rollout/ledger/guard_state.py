"""The guard's state across processes: each agent's confirmation windows and its canary schedule.

Both belong to the stage they were counted in: a stage change forgets them (`forget`)."""

from __future__ import annotations

import json
import sqlite3

from genesis_fp16.base.names import check_agent_name
from genesis_fp16.rollout.ledger.db import Store, ledger_call, now

# the guard's confirmation windows, one per kind of FP32 reference (the policy canary shares "canary")
WINDOW_KINDS = ("shadow", "canary")


def _check_window_kind(kind: str) -> str:
    if kind not in WINDOW_KINDS:
        raise ValueError(f"guard window kind {kind!r}: allowed values are {', '.join(WINDOW_KINDS)}")
    return str(kind)


class GuardStateStore(Store):
    """The ``guard_windows`` and ``canary_calls`` tables."""

    @staticmethod
    def forget(conn: sqlite3.Connection, agent: str) -> None:
        """Within the caller's transaction (a stage change): drop ``agent``'s windows and canary count."""
        conn.execute("DELETE FROM guard_windows WHERE agent = ?", (agent,))
        conn.execute("DELETE FROM canary_calls WHERE agent = ?", (agent,))

    @ledger_call
    def guard_window(self, agent: str, kind: str) -> list[bool]:
        """The outcomes (True: an alarm) of ``agent``'s last FP32-reference
        checks of ``kind`` (`WINDOW_KINDS`), oldest first; cleared by any stage change."""
        agent, kind = check_agent_name(agent), _check_window_kind(kind)
        if not self.db.has_current_schema():
            return []
        with self.db.transaction(write=False) as conn:
            row = conn.execute(
                "SELECT outcomes FROM guard_windows WHERE agent = ? AND kind = ?", (agent, kind)
            ).fetchone()
        return [bool(v) for v in json.loads(row["outcomes"])] if row else []

    @ledger_call
    def push_guard_outcome(self, agent: str, kind: str, alarm: bool, keep: int) -> list[bool]:
        """Append one outcome to ``agent``'s window of ``kind``, keep the last
        ``keep``, and return the window (one transaction, so two processes
        never lose each other's outcome)."""
        agent, kind = check_agent_name(agent), _check_window_kind(kind)
        if keep < 1:
            raise ValueError(f"push_guard_outcome: keep={keep}; expected a window of at least 1")
        with self.db.transaction(write=True) as conn:
            row = conn.execute(
                "SELECT outcomes FROM guard_windows WHERE agent = ? AND kind = ?", (agent, kind)
            ).fetchone()
            window = ([bool(v) for v in json.loads(row["outcomes"])] if row else []) + [bool(alarm)]
            window = window[-keep:]
            conn.execute(
                "INSERT INTO guard_windows (agent, kind, outcomes, updated_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(agent, kind) DO UPDATE SET outcomes=excluded.outcomes, updated_at=excluded.updated_at",
                (agent, kind, json.dumps(window), now()),
            )
        return window

    @ledger_call
    def clear_guard_windows(self, agent: str) -> None:
        """Forget ``agent``'s confirmation windows (the next trainer starts new ones)."""
        with self.db.transaction(write=True) as conn:
            conn.execute("DELETE FROM guard_windows WHERE agent = ?", (check_agent_name(agent),))

    @ledger_call
    def count_canary_call(self, agent: str) -> int:
        """Count one reduced-precision training call of ``agent`` in stage on
        and return the count (1, 2, ...) since its last stage change."""
        agent = check_agent_name(agent)
        with self.db.transaction(write=True) as conn:
            conn.execute(
                "INSERT INTO canary_calls (agent, calls, updated_at) VALUES (?, 1, ?) "
                "ON CONFLICT(agent) DO UPDATE SET calls = calls + 1, updated_at = excluded.updated_at",
                (agent, now()),
            )
            return int(conn.execute("SELECT calls FROM canary_calls WHERE agent = ?", (agent,)).fetchone()["calls"])

    @ledger_call
    def canary_calls(self, agent: str) -> int:
        """How many calls `count_canary_call` has counted for ``agent`` since its last stage change."""
        agent = check_agent_name(agent)
        if not self.db.has_current_schema():
            return 0
        with self.db.transaction(write=False) as conn:
            row = conn.execute("SELECT calls FROM canary_calls WHERE agent = ?", (agent,)).fetchone()
        return int(row["calls"]) if row else 0

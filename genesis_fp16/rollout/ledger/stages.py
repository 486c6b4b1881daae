"""Each agent's rollout stage and the history of its changes."""

from __future__ import annotations

import sqlite3
from enum import Enum
from typing import Any, Callable, Optional, Union

from genesis_fp16.base.names import check_agent_name
from genesis_fp16.base.telemetry import get_logger
from genesis_fp16.rollout.ledger.db import LedgerError, LedgerFile, Store, ledger_call, now


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


def plain(item: Any) -> Any:
    """An Enum as its plain value (for SQLite and event fields); anything else as it is."""
    return item.value if isinstance(item, Enum) else item


class StageStore(Store):
    """The ``stages`` and ``history`` tables. ``on_change(conn, agent)`` runs
    inside every stage change's transaction: what was counted in the old stage
    (the guard's windows, the canary schedule) is forgotten with it."""

    def __init__(self, db: LedgerFile, on_change: Callable[[sqlite3.Connection, str], None]) -> None:
        super().__init__(db)
        self._on_change = on_change
        self._log = get_logger("genesis_fp16.rollout.ledger")

    @ledger_call
    def stage(self, agent: str) -> Optional[Stage]:
        """The agent's stage, or None when the ledger does not manage it (never seen, or reset)."""
        agent = check_agent_name(agent)
        with self.db.transaction(write=False) as conn:
            row = conn.execute("SELECT stage FROM stages WHERE agent = ?", (agent,)).fetchone()
        return self.stage_of(row["stage"]) if row else None

    def stage_of(self, value: Optional[str]) -> Optional[Stage]:
        if value is None:
            return None
        try:
            return Stage(value)
        except ValueError:
            raise LedgerError(
                f"rollout ledger {self.db.path} holds stage {value!r}; expected one of {', '.join(STAGES)}: "
                "set the agent's stage again (genesis-fp16 rollout enable|disable|reset AGENT)",
                "corrupt",
            ) from None

    @ledger_call
    def history(self, agent: Optional[str] = None) -> list[dict[str, Any]]:
        """Every stage change, oldest first: when, actor, from_stage, to_stage,
        reason, severity. A stage None is no stage (a new agent, or a reset)."""
        rows = self.db.rows_for("SELECT agent, at, actor, from_stage, to_stage, reason, severity FROM history", agent)
        return [
            {
                "agent": r["agent"],
                "when": r["at"],
                "actor": r["actor"],
                "from_stage": self.stage_of(r["from_stage"]),
                "to_stage": self.stage_of(r["to_stage"]),
                "reason": r["reason"],
                "severity": None if r["severity"] is None else Severity(r["severity"]),
            }
            for r in rows
        ]

    @ledger_call
    def agents(self) -> list[str]:
        """The agents with a stage, by name."""
        with self.db.transaction(write=False) as conn:
            return [r["agent"] for r in conn.execute("SELECT agent FROM stages ORDER BY agent")]

    @ledger_call
    def set_stage(
        self,
        agent: str,
        to_stage: Optional[Union[Stage, str]],
        actor: str,
        reason: str,
        severity: Optional[Union[Severity, str]] = None,
    ) -> dict[str, Any]:
        """Write ``to_stage`` (None: forget the agent's stage) and its history
        row, and forget what was counted in the old stage (``on_change``)."""
        agent = check_agent_name(agent)
        if to_stage is not None and to_stage not in STAGES:
            raise ValueError(f"stage {to_stage!r}: allowed values are {', '.join(STAGES)}")
        if severity is not None and severity not in SEVERITIES:
            raise ValueError(f"severity {severity!r}: allowed values are {', '.join(SEVERITIES)} or None")
        to_stage = None if to_stage is None else Stage(to_stage)
        severity = None if severity is None else Severity(severity)
        at = now()
        with self.db.transaction(write=True) as conn:
            row = conn.execute("SELECT stage FROM stages WHERE agent = ?", (agent,)).fetchone()
            from_stage = self.stage_of(row["stage"]) if row else None
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
                "INSERT INTO history (agent, at, actor, from_stage, to_stage, reason, severity) VALUES (?, ?, ?, ?, "
                "?, ?, ?)",
                (agent, at, actor, plain(from_stage), plain(to_stage), reason, plain(severity)),
            )
            self._on_change(conn, agent)
        entry = {
            "agent": agent,
            "when": at,
            "actor": actor,
            "from_stage": from_stage,
            "to_stage": to_stage,
            "reason": reason,
            "severity": severity,
        }
        level = "warning" if to_stage == Stage.ROLLED_BACK else "info"
        # the event carries the history row (its own timestamp stands for "when")
        fields = {key: plain(value) for key, value in entry.items() if key != "when"}
        getattr(self._log, level)("rollout.stage_changed", **fields, ledger=str(self.db.path))
        return entry

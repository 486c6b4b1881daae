"""What ``precision=auto`` measured per workload (`genesis_fp16.calibration`),
and what ``genesis-fp16 tune --apply`` has already applied to a profile file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Union

from ..names import check_agent_name
from .db import Store, ledger_call, now


def _profiles_key(path: Union[str, Path]) -> str:
    return str(Path(path).expanduser().resolve())


def _calibration_row(text: str) -> Optional[dict[str, Any]]:
    """A stored calibration, or None for a row that is not a JSON object (never trusted further)."""
    try:
        record = json.loads(text)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


class CalibrationStore(Store):
    """The ``calibrations`` table, one record per workload key."""

    @ledger_call
    def calibration(self, key: str) -> Optional[dict[str, Any]]:
        """The calibration recorded for workload ``key``, or None."""
        if not self.db._has_current_schema():
            return None
        with self.db._transaction(write=False) as conn:
            row = conn.execute("SELECT record FROM calibrations WHERE key = ?", (str(key),)).fetchone()
        return _calibration_row(row["record"]) if row else None

    @ledger_call
    def calibrations(self) -> list[dict[str, Any]]:
        """Every recorded calibration, oldest first."""
        if not self.db._has_current_schema():
            return []
        with self.db._transaction(write=False) as conn:
            rows = conn.execute("SELECT record FROM calibrations ORDER BY at, key").fetchall()
        return [r for r in (_calibration_row(row["record"]) for row in rows) if r is not None]

    @ledger_call
    def record_calibration(self, record: dict[str, Any]) -> None:
        """Keep a calibration (a JSON object with ``key``, ``at`` and ``precision``), replacing the workload's last."""
        text = json.dumps(record, sort_keys=True, allow_nan=False)
        with self.db._transaction(write=True) as conn:
            conn.execute(
                "INSERT INTO calibrations (key, at, precision, record) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET at=excluded.at, precision=excluded.precision, record=excluded.record",
                (str(record["key"]), str(record["at"]), str(record["precision"]), text),
            )

    @ledger_call
    def clear_calibrations(self) -> int:
        """Forget every calibration (`genesis-fp16 doctor --recalibrate`); returns how many there were."""
        if not self.db._has_current_schema():
            return 0
        with self.db._transaction(write=True) as conn:
            return conn.execute("DELETE FROM calibrations").rowcount


class TuningStore(Store):
    """The ``tuning_applied`` table: per agent and profile file, the newest event already applied."""

    @ledger_call
    def tuning_applied_through(self, agent: str, profiles: Union[str, Path]) -> Optional[str]:
        """The timestamp of the newest event of ``agent`` already turned into a
        change of the profile file ``profiles``; None when none was."""
        agent = check_agent_name(agent)
        if not self.db._has_current_schema():
            return None
        with self.db._transaction(write=False) as conn:
            row = conn.execute(
                "SELECT through FROM tuning_applied WHERE agent = ? AND profiles = ?", (agent, _profiles_key(profiles))
            ).fetchone()
        return row["through"] if row else None

    @ledger_call
    def record_tuning_applied(self, agent: str, profiles: Union[str, Path], through: str, changes: dict[str, Any]) -> None:
        """Remember that ``agent``'s events up to ``through`` were applied to ``profiles`` as ``changes``."""
        with self.db._transaction(write=True) as conn:
            conn.execute(
                "INSERT INTO tuning_applied (agent, profiles, through, at, changes) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT(agent, profiles) DO UPDATE SET through=excluded.through, at=excluded.at, changes=excluded.changes",
                (check_agent_name(agent), _profiles_key(profiles), through, now(), json.dumps(changes, sort_keys=True)),
            )

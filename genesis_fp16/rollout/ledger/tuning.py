"""What ``genesis-fp16 tune --apply`` has already applied to a profile file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Union

from genesis_fp16.base.names import check_agent_name
from genesis_fp16.rollout.ledger.db import Store, ledger_call, now


def _profiles_key(path: Union[str, Path]) -> str:
    return str(Path(path).expanduser().resolve())


class TuningStore(Store):
    """The ``tuning_applied`` table: per agent and profile file, the newest event already applied."""

    @ledger_call
    def tuning_applied_through(self, agent: str, profiles: Union[str, Path]) -> Optional[str]:
        """The timestamp of the newest event of ``agent`` already turned into a
        change of the profile file ``profiles``; None when none was."""
        agent = check_agent_name(agent)
        if not self.db.has_current_schema():
            return None
        with self.db.transaction(write=False) as conn:
            row = conn.execute(
                "SELECT through FROM tuning_applied WHERE agent = ? AND profiles = ?", (agent, _profiles_key(profiles))
            ).fetchone()
        return row["through"] if row else None

    @ledger_call
    def record_tuning_applied(
        self, agent: str, profiles: Union[str, Path], through: str, changes: dict[str, Any]
    ) -> None:
        """Remember that ``agent``'s events up to ``through`` were applied to ``profiles`` as ``changes``."""
        with self.db.transaction(write=True) as conn:
            conn.execute(
                "INSERT INTO tuning_applied (agent, profiles, through, at, changes) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT(agent, profiles) DO UPDATE SET through=excluded.through, at=excluded.at, "
                "changes=excluded.changes",
                (check_agent_name(agent), _profiles_key(profiles), through, now(), json.dumps(changes, sort_keys=True)),
            )

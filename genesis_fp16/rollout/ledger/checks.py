"""What the guard measured and kept: shadow gaps, quality checks, tuning
recommendations, and each agent's last good checkpoint."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Any, Optional, Union

from genesis_fp16.base.names import check_agent_name
from genesis_fp16.base.telemetry import get_logger
from genesis_fp16.rollout.ledger.db import LedgerFile, Store, ledger_call, now

# quality checks beside the shadow gaps: an FP32 canary's val-loss gap (stage on),
# a policy canary's KL / deltas (PPO), the inference-side gap (val loss with and without autocast),
# and each guarded training call's outcome (its precision and where that came from, skipped steps, rollback),
# so `rollout status` lists every agent that trained, enrolled or not
QUALITY_KINDS = ("canary", "policy_canary", "inference_gap", "training")


def _real_in(value: float) -> Any:
    """SQLite binds NaN as NULL, which the NOT NULL loss columns refuse: keep it as the text 'nan'."""
    return "nan" if math.isnan(value) else value


def _gap_row(row: Any) -> dict[str, Any]:
    out = dict(row)
    for key in ("val_loss", "fp32_val_loss"):
        if isinstance(out.get(key), str):
            out[key] = float(out[key])
    return out


def _check_row(row: Any) -> dict[str, Any]:
    return dict(row, alarm=None if row["alarm"] is None else bool(row["alarm"]), metrics=json.loads(row["metrics"]))


class CheckStore(Store):
    """The ``shadow_gaps``, ``quality_checks``, ``recommendations`` and ``good_checkpoints`` tables."""

    def __init__(self, db: LedgerFile) -> None:
        super().__init__(db)
        self._log = get_logger("genesis_fp16.rollout.ledger")

    def latest(self, conn: sqlite3.Connection, agent: str) -> tuple[dict[str, Any], Optional[str]]:
        """Within the caller's transaction: ``agent``'s latest check of each
        kind (``shadow_gap`` and each of `QUALITY_KINDS`, or None) and its last good checkpoint."""
        gap = conn.execute(
            "SELECT at, val_loss, fp32_val_loss, gap, precision FROM shadow_gaps WHERE agent = ? ORDER BY id DESC "
            "LIMIT 1",
            (agent,),
        ).fetchone()
        checks: dict[str, Any] = {"shadow_gap": _gap_row(gap) if gap else None}
        for kind in QUALITY_KINDS:
            row = conn.execute(
                "SELECT at, kind, precision, alarm, metrics FROM quality_checks WHERE agent = ? AND kind = ? "
                "ORDER BY id DESC LIMIT 1",
                (agent, kind),
            ).fetchone()
            checks[kind] = _check_row(row) if row else None
        good = conn.execute("SELECT path FROM good_checkpoints WHERE agent = ?", (agent,)).fetchone()
        return checks, good["path"] if good else None

    @ledger_call
    def shadow_gaps(self, agent: str) -> list[dict[str, Any]]:
        """The agent's shadow measurements, oldest first: at, val_loss, fp32_val_loss, gap, precision."""
        with self.db.transaction(write=False) as conn:
            rows = conn.execute(
                "SELECT at, val_loss, fp32_val_loss, gap, precision FROM shadow_gaps WHERE agent = ? ORDER BY id",
                (check_agent_name(agent),),
            ).fetchall()
        return [_gap_row(r) for r in rows]

    @ledger_call
    def quality_checks(self, agent: Optional[str] = None, kind: Optional[str] = None) -> list[dict[str, Any]]:
        """Recorded quality checks, oldest first: agent, at, kind, precision, alarm (bool or None), metrics."""
        rows = self.db.rows_for("SELECT agent, at, kind, precision, alarm, metrics FROM quality_checks", agent)
        return [_check_row(r) for r in rows if kind is None or r["kind"] == kind]

    @ledger_call
    def recommendations(self, agent: Optional[str] = None) -> list[dict[str, Any]]:
        """Recorded tuning recommendations, oldest first: agent, at, severity, changes, reason."""
        rows = self.db.rows_for("SELECT agent, at, severity, changes, reason FROM recommendations", agent)
        return [dict(r, changes=json.loads(r["changes"])) for r in rows]

    @ledger_call
    def last_good_checkpoint(self, agent: str) -> Optional[Path]:
        """The last checkpoint the guard called good for ``agent``, or None."""
        with self.db.transaction(write=False) as conn:
            row = conn.execute(
                "SELECT path FROM good_checkpoints WHERE agent = ?", (check_agent_name(agent),)
            ).fetchone()
        return Path(row["path"]) if row else None

    @ledger_call
    def record_shadow_gap(self, agent: str, val_loss: float, fp32_val_loss: float, precision: str) -> dict[str, Any]:
        """Record one shadow measurement; ``gap`` is ``(val_loss - fp32) / fp32``
        (0.25 = reduced precision is 25% worse), None when the FP32 loss is 0 or not finite."""
        agent = check_agent_name(agent)
        val_loss, fp32_val_loss = float(val_loss), float(fp32_val_loss)
        gap = (val_loss - fp32_val_loss) / fp32_val_loss if fp32_val_loss > 0 and math.isfinite(fp32_val_loss) else None
        if gap is not None and not math.isfinite(gap):
            gap = None
        at = now()
        with self.db.transaction(write=True) as conn:
            conn.execute(
                "INSERT INTO shadow_gaps (agent, at, val_loss, fp32_val_loss, gap, precision) VALUES (?, ?, ?, ?, ?, "
                "?)",
                (agent, at, _real_in(val_loss), _real_in(fp32_val_loss), gap, str(precision)),
            )
        self._log.info(
            "rollout.shadow_gap",
            agent=agent,
            val_loss=val_loss,
            fp32_val_loss=fp32_val_loss,
            gap=gap,
            precision=str(precision),
        )
        return {
            "agent": agent,
            "at": at,
            "val_loss": val_loss,
            "fp32_val_loss": fp32_val_loss,
            "gap": gap,
            "precision": str(precision),
        }

    @ledger_call
    def record_quality_check(
        self,
        agent: str,
        kind: str,
        metrics: dict[str, Any],
        precision: Optional[str] = None,
        alarm: Optional[bool] = None,
    ) -> dict[str, Any]:
        """Record one quality check (``kind`` in `QUALITY_KINDS`); ``metrics``
        are JSON numbers (a non-finite one is stored as null)."""
        agent = check_agent_name(agent)
        if kind not in QUALITY_KINDS:
            raise ValueError(f"quality check kind {kind!r}: allowed values are {', '.join(QUALITY_KINDS)}")
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
        at = now()
        with self.db.transaction(write=True) as conn:
            conn.execute(
                "INSERT INTO quality_checks (agent, at, kind, precision, alarm, metrics) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    agent,
                    at,
                    kind,
                    precision,
                    None if alarm is None else int(bool(alarm)),
                    json.dumps(clean, sort_keys=True),
                ),
            )
        self._log.info("rollout.quality_check", agent=agent, kind=kind, precision=precision, alarm=alarm, **clean)
        return {"agent": agent, "at": at, "kind": kind, "precision": precision, "alarm": alarm, "metrics": clean}

    @ledger_call
    def record_recommendation(
        self, agent: str, changes: dict[str, Any], reason: str, severity: Optional[str] = None
    ) -> None:
        """Record one tuning recommendation for ``agent``."""
        with self.db.transaction(write=True) as conn:
            conn.execute(
                "INSERT INTO recommendations (agent, at, severity, changes, reason) VALUES (?, ?, ?, ?, ?)",
                (check_agent_name(agent), now(), severity, json.dumps(changes, sort_keys=True), reason),
            )

    @ledger_call
    def set_last_good_checkpoint(self, agent: str, path: Union[str, Path]) -> None:
        """Remember ``path`` as ``agent``'s last good checkpoint."""
        with self.db.transaction(write=True) as conn:
            conn.execute(
                "INSERT INTO good_checkpoints (agent, path, at) VALUES (?, ?, ?) "
                "ON CONFLICT(agent) DO UPDATE SET path=excluded.path, at=excluded.at",
                (check_agent_name(agent), str(Path(path).resolve()), now()),
            )

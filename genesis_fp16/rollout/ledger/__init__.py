"""The rollout ledger: per-agent stage of reduced precision, with history.

Stages: ``off`` (FP32), ``shadow`` (reduced precision, an FP32 reference is
measured beside it), ``on`` (reduced precision) and ``rolled_back`` (FP32
until a person re-enables it). An agent the ledger has never seen has no stage
(``None``): settings and its profile decide alone.

The ledger is SQLite in ``<state_dir>/rollout.sqlite`` in WAL mode
(`.db`: connections, transactions, the retry policy, faults). Each kind of
record has its own small store over that file: stages and their history
(`.stages`), checks and checkpoints (`.checks`), the guard's windows and
canary schedule (`.guard_state`) and applied tuning (`.tuning`).
`RolloutLedger` composes them behind one API. (`auto`'s measured decisions
live in the host-level cache of `genesis_fp16.precision.measure`, shared by every state
dir; the ``calibrations`` table of schema version 3 is no longer written.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Union

from genesis_fp16.base import storage
from genesis_fp16.base.names import check_agent_name
from genesis_fp16.base.settings import Settings, env_name, load_settings
from genesis_fp16.base.telemetry import get_logger
from genesis_fp16.rollout.ledger.tuning import TuningStore
from genesis_fp16.rollout.ledger.checks import QUALITY_KINDS, CheckStore
from genesis_fp16.rollout.ledger.db import LEDGER_FILE, LedgerError, LedgerFile, check_ledger_path, ledger_call
from genesis_fp16.rollout.ledger.guard_state import WINDOW_KINDS, GuardStateStore
from genesis_fp16.rollout.ledger.schema import SCHEMA_VERSION
from genesis_fp16.rollout.ledger.stages import SEVERITIES, STAGES, Severity, Stage, StageStore, TextEnum

__all__ = [
    "LEDGER_FILE", "QUALITY_KINDS", "SCHEMA_VERSION", "SEVERITIES", "STAGES", "WINDOW_KINDS", "LedgerError",
    "RolloutLedger", "Severity", "Stage", "TextEnum", "current_stage",
]  # fmt: skip


class RolloutLedger(LedgerFile):
    """Persistent per-agent rollout stages. ``RolloutLedger(path)`` or
    ``RolloutLedger(settings=...)`` / `from_settings`."""

    def __init__(self, path: Union[str, Path, None] = None, *, settings: Optional[Settings] = None) -> None:
        # how messages name the directory: the variable when it came from settings
        dir_name: Optional[str] = None
        if path is None:
            settings = settings or load_settings()
            path = Path(settings.state_dir) / LEDGER_FILE
            dir_name = env_name("state_dir")
        super().__init__(Path(path), dir_name)
        self._log = get_logger("genesis_fp16.rollout.ledger")
        self._guard = GuardStateStore(self)
        self._stages = StageStore(self, on_change=self._guard.forget)
        self._checks = CheckStore(self)
        self._tuning = TuningStore(self)

    @classmethod
    def from_settings(cls, settings: Optional[Settings] = None) -> "RolloutLedger":
        """The ledger of ``settings`` (default: ``load_settings()``): ``<state_dir>/rollout.sqlite``."""
        return cls(settings=settings or load_settings())

    # -- stages ----------------------------------------------------------------
    def stage(self, agent: str) -> Optional[Stage]:
        """The agent's stage, or None when the ledger does not manage it (never seen, or reset)."""
        return self._stages.stage(agent)

    def history(self, agent: Optional[str] = None) -> list[dict[str, Any]]:
        """Every stage change, oldest first: when, actor, from_stage, to_stage,
        reason, severity. A stage None is no stage (a new agent, or a reset)."""
        return self._stages.history(agent)

    def _set_stage(
        self,
        agent: str,
        to_stage: Optional[Union[Stage, str]],
        actor: str,
        reason: str,
        severity: Optional[Union[Severity, str]] = None,
    ) -> dict[str, Any]:
        """`StageStore.set_stage`: any stage change also clears the agent's
        canary schedule and confirmation windows (they belong to the stage they were counted in)."""
        return self._stages.set_stage(agent, to_stage, actor, reason, severity)

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
            raise ValueError(
                f"agent {agent!r} has no stage in the rollout ledger {self.path}: nothing to reset; "
                f"agents with a stage: {', '.join(self._stages.agents()) or 'none'}"
            )
        return self._set_stage(agent, None, actor, reason or "reset to the settings' default")

    @ledger_call
    def status(self) -> list[dict[str, Any]]:
        """One row per agent with a stage or a recorded training (an agent
        never enrolled has stage None and the reason "not enrolled: the
        settings decide"): stage, since when, who, why, the last good
        checkpoint, the last training (``last_training``: precision, alarm
        for a rollback, metrics with ``source`` and ``outcome``) and the latest
        quality check of each kind (``last_checks``: ``shadow_gap`` and each
        of `QUALITY_KINDS`, each with its time ``at``, or None;
        ``last_shadow_gap`` is the first)."""
        out = []
        with self.transaction(write=False) as conn:
            staged = {
                r["agent"]: r
                for r in conn.execute("SELECT agent, stage, updated_at, actor, reason FROM stages").fetchall()
            }
            trained = {
                r[0]
                for r in conn.execute("SELECT DISTINCT agent FROM quality_checks WHERE kind = 'training'").fetchall()
            }
            for agent in sorted(set(staged) | trained):
                checks, good = self._checks.latest(conn, agent)
                r = staged.get(agent)
                out.append({
                    "agent": agent, "stage": self._stages.stage_of(r["stage"]) if r else None,
                    "since": r["updated_at"] if r else None, "actor": r["actor"] if r else None,
                    "reason": r["reason"] if r else "not enrolled: the settings decide",
                    "last_shadow_gap": checks["shadow_gap"], "last_training": checks["training"],
                    "last_checks": checks, "last_good_checkpoint": good,
                })  # fmt: skip
        return out

    # -- checks and checkpoints ------------------------------------------------
    def shadow_gaps(self, agent: str) -> list[dict[str, Any]]:
        """The agent's shadow measurements, oldest first: at, val_loss, fp32_val_loss, gap, precision."""
        return self._checks.shadow_gaps(agent)

    def record_shadow_gap(self, agent: str, val_loss: float, fp32_val_loss: float, precision: str) -> dict[str, Any]:
        """Record one shadow measurement; ``gap`` is ``(val_loss - fp32) / fp32``
        (0.25 = reduced precision is 25% worse), None when the FP32 loss is 0 or not finite."""
        return self._checks.record_shadow_gap(agent, val_loss, fp32_val_loss, precision)

    def quality_checks(self, agent: Optional[str] = None, kind: Optional[str] = None) -> list[dict[str, Any]]:
        """Recorded quality checks, oldest first: agent, at, kind, precision, alarm (bool or None), metrics."""
        return self._checks.quality_checks(agent, kind)

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
        return self._checks.record_quality_check(agent, kind, metrics, precision, alarm)

    def recommendations(self, agent: Optional[str] = None) -> list[dict[str, Any]]:
        """Recorded tuning recommendations, oldest first: agent, at, severity, changes, reason."""
        return self._checks.recommendations(agent)

    def record_recommendation(
        self, agent: str, changes: dict[str, Any], reason: str, severity: Optional[str] = None
    ) -> None:
        """Record one tuning recommendation for ``agent``."""
        return self._checks.record_recommendation(agent, changes, reason, severity)

    def last_good_checkpoint(self, agent: str) -> Optional[Path]:
        """The last checkpoint the guard called good for ``agent``, or None."""
        return self._checks.last_good_checkpoint(agent)

    def set_last_good_checkpoint(self, agent: str, path: Union[str, Path]) -> None:
        """Remember ``path`` as ``agent``'s last good checkpoint."""
        return self._checks.set_last_good_checkpoint(agent, path)

    # -- the guard's state across processes ------------------------------------
    def guard_window(self, agent: str, kind: str) -> list[bool]:
        """The outcomes (True: an alarm) of ``agent``'s last FP32-reference
        checks of ``kind`` (`WINDOW_KINDS`), oldest first; cleared by any stage change."""
        return self._guard.guard_window(agent, kind)

    def push_guard_outcome(self, agent: str, kind: str, alarm: bool, keep: int) -> list[bool]:
        """Append one outcome to ``agent``'s window of ``kind``, keep the last
        ``keep``, and return the window (one transaction, so two processes
        never lose each other's outcome)."""
        return self._guard.push_guard_outcome(agent, kind, alarm, keep)

    def clear_guard_windows(self, agent: str) -> None:
        """Forget ``agent``'s confirmation windows (the next trainer starts new ones)."""
        return self._guard.clear_guard_windows(agent)

    def count_canary_call(self, agent: str) -> int:
        """Count one reduced-precision training call of ``agent`` in stage on
        and return the count (1, 2, ...) since its last stage change."""
        return self._guard.count_canary_call(agent)

    def canary_calls(self, agent: str) -> int:
        """How many calls `count_canary_call` has counted for ``agent`` since its last stage change."""
        return self._guard.canary_calls(agent)

    # -- what `tune --apply` applied -------------------------------------------
    def tuning_applied_through(self, agent: str, profiles: Union[str, Path]) -> Optional[str]:
        """The timestamp of the newest event of ``agent`` already turned into a
        change of the profile file ``profiles``; None when none was."""
        return self._tuning.tuning_applied_through(agent, profiles)

    def record_tuning_applied(
        self, agent: str, profiles: Union[str, Path], through: str, changes: dict[str, Any]
    ) -> None:
        """Remember that ``agent``'s events up to ``through`` were applied to ``profiles`` as ``changes``."""
        return self._tuning.record_tuning_applied(agent, profiles, through, changes)


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
        check_ledger_path(path)  # a directory, a FIFO or a device there is named, not read as no ledger
        return None
    stamp = (
        ledger,
        storage.file_stamp(path.with_name(path.name + "-wal")),
    )  # every committed write changes one of them
    key = (str(path), agent)
    cached = _STAGES.get(key)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    stage = RolloutLedger(path).stage(agent)
    _STAGES[key] = (stamp, stage)
    return stage

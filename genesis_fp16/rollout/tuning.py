"""Structured event logs -> per-agent profile recommendations.

Reads the JSON-lines event log (``<state_dir>/events.jsonl``) and proposes
changes to each agent's profile, with reasons:

* overflow rate over the agent's ``overflow_warn`` threshold (FP16 with a
  scaler): start the scale lower (the lowest scale the scaler backed off to,
  at most half the current ``init_scale``, rounded down to a power of two)
  and double ``growth_interval`` (quadruple it over ``overflow_rollback``);
* two or more rollbacks, all in FP16 (the reduced precision last seen before
  each): leave FP16 for BF16 (FP32's exponent range, no scaler); a rollback
  in BF16, or three or more in all: FP32;
* a guard P2 recommendation (throughput under the threshold): its changes;
* FP32 canaries (``guard.canary``, stage on) whose gap rose at each of the
  last ``RISING_CANARIES`` canaries, the last one over half the
  ``val_loss_ratio`` margin: FP32 (the gap is growing; do not wait for the
  rollback);
* a rollback a canary caught: halve ``canary_every`` (thresholds), so a
  degradation is caught sooner next time.

The overflow rate is the one the guard last judged (``guard.decision``);
without one it is the count of overflow skips over the highest step seen.

Each event is acted on once: `apply` remembers in the rollout ledger, per
agent and profile file, the newest event it applied, and `propose` reads
only an agent's later events. Applying the same log twice changes the
profile once.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional, Union

from genesis_fp16.rollout.canary import CANARY_SUFFIX, SHADOW_SUFFIX
from genesis_fp16.precision.modes import MODES, REDUCED_MODES
from genesis_fp16.rollout.profiles import THRESHOLD_DEFAULTS, raw_document, write_profiles
from genesis_fp16.rollout.ledger import LEDGER_FILE, RolloutLedger, Stage
from genesis_fp16.base.settings import PrecisionMode, Settings, load_settings
from genesis_fp16.base.telemetry import get_logger, read_events

REDUCED = frozenset(m.value for m in REDUCED_MODES)  # the precisions whose trouble a proposal answers
FP16, BF16, FP32 = PrecisionMode.FP16.value, PrecisionMode.BF16.value, PrecisionMode.FP32.value
RISING_CANARIES = 3  # canary gaps rising this many times in a row call for FP32


def _without_scaler(precision: Optional[str]) -> bool:
    """True for a mode with no loss scaler, where init_scale/growth_interval mean nothing."""
    return precision in {m.value for m, cls in MODES.items() if not cls.uses_scaler}


@dataclass
class AgentSummary:
    agent: str
    precisions: list[str] = field(default_factory=list)  # reduced precisions seen, in order
    max_step: int = 0
    overflow_skips: int = 0
    nonfinite_skips: int = 0
    nonfinite_streaks: int = 0
    min_scale: Optional[float] = None
    judged_overflow_rate: Optional[float] = None
    judged_steps: Optional[int] = None
    rollbacks: list[dict[str, Any]] = field(default_factory=list)
    recommendations: list[dict[str, Any]] = field(default_factory=list)
    canary_ratios: list[float] = field(default_factory=list)  # val_loss / fp32_val_loss of each FP32 canary, in order

    @property
    def overflow_rate(self) -> Optional[float]:
        if self.judged_overflow_rate is not None:
            return self.judged_overflow_rate
        if self.max_step <= 0:
            return None
        return self.overflow_skips / self.max_step

    @property
    def steps(self) -> int:
        return self.judged_steps if self.judged_steps is not None else self.max_step


@dataclass
class Proposal:
    agent: str
    changes: dict[str, Any]
    current: dict[str, Any]
    reasons: list[str]
    evidence: dict[str, Any]
    through: Optional[str] = None
    """The timestamp of the newest of the agent's events it rests on (what `apply` remembers)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _agent_of(event: dict[str, Any]) -> Optional[str]:
    name = event.get("agent") or event.get("trainer")
    if not isinstance(name, str) or not name or name.endswith((SHADOW_SUFFIX, CANARY_SUFFIX)):
        return None
    return name


def summarise(events: list[dict[str, Any]]) -> dict[str, AgentSummary]:
    """Per-agent counts from an event list (see docs/EVENTS.md for the fields)."""
    out: dict[str, AgentSummary] = {}
    for ev in events:
        agent = _agent_of(ev)
        if agent is None:
            continue
        name, precision = ev.get("event", ""), ev.get("precision")
        if not isinstance(name, str) or not (precision is None or isinstance(precision, str)):
            continue  # not an event this code writes (an edited line): it counts for nothing
        s = out.setdefault(agent, AgentSummary(agent))
        if name.startswith("trainer.") and precision in REDUCED and (not s.precisions or s.precisions[-1] != precision):
            s.precisions.append(precision)
        if isinstance(ev.get("step"), int) and name.startswith("trainer."):
            s.max_step = max(s.max_step, ev["step"])
        if name == "trainer.step_skipped":
            if ev.get("reason") == "overflow":
                s.overflow_skips += 1
            elif ev.get("reason") == "nonfinite_loss":
                s.nonfinite_skips += 1
        elif name == "trainer.nonfinite_streak":
            s.nonfinite_streaks += 1
        elif name == "trainer.scale_changed":
            new = ev.get("new_scale")
            if isinstance(new, (int, float)) and new > 0:
                s.min_scale = new if s.min_scale is None else min(s.min_scale, new)
        elif name == "guard.decision":
            if (
                ev.get("precision") in REDUCED
                and isinstance(ev.get("training_steps"), int)
                and ev["training_steps"] > 0
            ):
                rate = ev.get("overflow_rate", 0.0)
                s.judged_overflow_rate = (
                    float(rate) if isinstance(rate, (int, float)) and not isinstance(rate, bool) else 0.0
                )
                s.judged_steps = ev["training_steps"]
        elif name == "rollout.stage_changed" and ev.get("to_stage") == Stage.ROLLED_BACK:
            s.rollbacks.append(
                {
                    "when": ev.get("timestamp"),
                    "reason": ev.get("reason"),
                    "actor": ev.get("actor"),
                    "precision": s.precisions[-1] if s.precisions else None,
                }
            )
        elif (
            name == "guard.canary"
            and ev.get("kind") == "val_loss"
            and isinstance(ev.get("val_loss_ratio"), (int, float))
        ):
            s.canary_ratios.append(float(ev["val_loss_ratio"]))
        elif name == "guard.recommendation" and isinstance(ev.get("changes"), dict):
            s.recommendations.append({"changes": ev["changes"], "reason": ev.get("reason", "")})
    return out


def _current(agent: str, doc: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """The agent's values as the profile file (or else the settings) has them."""
    values: dict[str, Any] = settings.precision_config.model_dump(mode="json")
    values.update(doc.get("defaults", {}) or {})
    values.update((doc.get("agents", {}) or {}).get(agent, {}) or {})
    values.pop("thresholds", None)
    return values


def _thresholds(agent: str, doc: dict[str, Any]) -> dict[str, Any]:
    th = dict(THRESHOLD_DEFAULTS)
    th.update((doc.get("defaults", {}) or {}).get("thresholds", {}) or {})
    th.update(((doc.get("agents", {}) or {}).get(agent, {}) or {}).get("thresholds", {}) or {})
    return th


def _when(timestamp: Any) -> Optional[datetime]:
    """An event's timestamp as an aware datetime (ISO text compares wrongly: "00Z" > "00.5Z")."""
    if not isinstance(timestamp, str):
        return None
    try:
        when = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def _newest(events: list[dict[str, Any]]) -> dict[str, str]:
    """Per agent, the timestamp of its newest event."""
    out: dict[str, tuple[datetime, str]] = {}
    for ev in events:
        agent, when = _agent_of(ev), _when(ev.get("timestamp"))
        if agent is not None and when is not None and (agent not in out or when > out[agent][0]):
            out[agent] = (when, ev["timestamp"])
    return {agent: text for agent, (_, text) in out.items()}


def _not_applied(events: list[dict[str, Any]], ledger: Optional[RolloutLedger], path: Path) -> list[dict[str, Any]]:
    """The events newer than what `apply` already applied to ``path`` for their agent."""
    if ledger is None:
        return events
    cache: dict[str, Optional[datetime]] = {}
    out = []
    for ev in events:
        agent = _agent_of(ev)
        if agent is not None:
            if agent not in cache:
                cache[agent] = _when(ledger.tuning_applied_through(agent, path))
            through, when = cache[agent], _when(ev.get("timestamp"))
            if through is not None and when is not None and when <= through:
                continue
        out.append(ev)
    return out


def _settings_ledger(settings: Settings) -> Optional[RolloutLedger]:
    """The settings' ledger when it exists (a dry run creates none)."""
    path = Path(settings.state_dir) / LEDGER_FILE
    return RolloutLedger(path) if path.is_file() else None


def _pow2_floor(value: float) -> float:
    return float(2 ** math.floor(math.log2(max(value, 1.0))))


def propose(
    events: list[dict[str, Any]],
    *,
    settings: Optional[Settings] = None,
    profiles_path: Union[str, Path, None] = None,
    ledger: Optional[RolloutLedger] = None,
) -> list[Proposal]:
    """Profile changes the events call for, one `Proposal` per agent that
    needs any. Events `apply` already applied to this profile file (as the
    ``ledger``, default the settings', remembers) are left out."""
    settings = settings or load_settings()
    path = Path(profiles_path) if profiles_path else settings.effective_profiles_file
    doc = raw_document(path)
    events = _not_applied(events, ledger if ledger is not None else _settings_ledger(settings), path)
    newest = _newest(events)
    proposals = []
    for agent, s in sorted(summarise(events).items()):
        current = _current(agent, doc, settings)
        th = _thresholds(agent, doc)
        changes: dict[str, Any] = {}
        reasons: list[str] = []
        rate = s.overflow_rate
        if rate is not None and s.steps >= th["min_steps"] and rate > th["overflow_warn"]:
            init = float(current.get("init_scale", 65536.0))
            target = init / 2 if s.min_scale is None else min(init / 2, s.min_scale)
            changes["init_scale"] = _pow2_floor(target)
            factor = 4 if rate > th["overflow_rollback"] else 2
            changes["growth_interval"] = int(current.get("growth_interval", 2000)) * factor
            reasons.append(
                f"overflow rate {rate:.0%} over {s.steps} steps (> {th['overflow_warn']:.0%}): "
                f"init_scale {init:g} -> {changes['init_scale']:g} (lowest scale reached: {s.min_scale}), "
                f"growth_interval x{factor}"
            )
        if len(s.rollbacks) >= 2:
            # the reduced precision each rollback happened in (the last one seen before it)
            rolled_back_in = {r.get("precision") or current.get("precision") for r in s.rollbacks}
            if rolled_back_in == {FP16} and len(s.rollbacks) < 3:
                changes["precision"] = BF16
                reasons.append(f"{len(s.rollbacks)} rollbacks in FP16: try BF16 (FP32 exponent range, no loss scaling)")
            else:
                changes["precision"] = FP32
                reasons.append(
                    f"{len(s.rollbacks)} rollbacks (precisions tried: {', '.join(s.precisions) or 'unknown'}): train "
                    "in FP32"
                )
            if _without_scaler(changes["precision"]):
                changes.pop("init_scale", None)
                changes.pop("growth_interval", None)
        for rec in s.recommendations:
            for key, value in rec["changes"].items():
                if key == "precision" and changes.get("precision") == FP32:
                    continue
                if key in ("init_scale", "growth_interval") and _without_scaler(changes.get("precision")):
                    continue
                changes.setdefault(key, value)
            reasons.append(f"guard recommendation: {rec['reason']}")
        _canary_rules(s, th, changes, reasons)
        changes = {k: v for k, v in changes.items() if current.get(k) != v}
        if not changes:
            continue
        proposals.append(
            Proposal(
                agent=agent,
                changes=changes,
                current={k: current.get(k) for k in changes},
                reasons=reasons,
                evidence={
                    "overflow_rate": rate,
                    "steps": s.steps,
                    "overflow_skips": s.overflow_skips,
                    "nonfinite_streaks": s.nonfinite_streaks,
                    "rollbacks": len(s.rollbacks),
                    "precisions": s.precisions,
                    "min_scale": s.min_scale,
                    "canary_ratios": s.canary_ratios[-RISING_CANARIES - 1 :],
                },
                through=newest.get(agent),
            )
        )
    return proposals


def _canary_rules(s: AgentSummary, th: dict[str, Any], changes: dict[str, Any], reasons: list[str]) -> None:
    """The canary's proposals (see the module docstring), added to ``changes``."""
    recent = s.canary_ratios[-(RISING_CANARIES + 1) :]
    margin = (float(th["canary_val_loss_ratio"]) - 1.0) / 2
    rising = len(recent) == RISING_CANARIES + 1 and all(b > a for a, b in zip(recent, recent[1:]))
    if rising and recent[-1] > 1.0 + margin and changes.get("precision") != FP32:
        changes["precision"] = FP32
        changes.pop("init_scale", None)
        changes.pop("growth_interval", None)
        shown = " -> ".join(f"{r:.3f}" for r in recent)
        reasons.append(
            f"FP32 canary gap rising at each of the last {RISING_CANARIES} canaries ({shown}x FP32): train in FP32"
        )
    caught = [r for r in s.rollbacks if "canary" in (r.get("reason") or "")]
    every = int(th["canary_every"])
    if caught and every > 1:
        changes["thresholds"] = {"canary_every": max(1, every // 2)}
        reasons.append(
            f"{len(caught)} rollback(s) caught by a canary: canary_every {every} -> {every // 2}, to catch the next "
            "one sooner"
        )


def tune_from_file(events_path: Union[str, Path], **kwargs: Any) -> list[Proposal]:
    return propose(read_events(Path(events_path)), **kwargs)


def apply(
    proposals: list[Proposal], profiles_path: Union[str, Path], ledger: Optional[RolloutLedger] = None
) -> dict[str, Any]:
    """Merge the proposals into the profile file: validated, written atomically,
    the previous file kept as ``<name>.bak.<timestamp>``. The ``ledger``
    (default: the settings') remembers each proposal's newest event, so
    `propose` does not propose it again."""
    path = Path(profiles_path)
    doc = raw_document(path)
    agents = doc.setdefault("agents", {})
    for p in proposals:
        table = agents.setdefault(p.agent, {})
        for key, value in p.changes.items():
            if key == "thresholds":  # a nested table: merged, not replaced
                table.setdefault("thresholds", {}).update(value)
            else:
                table[key] = value
    written = write_profiles(path, doc, backup=True)
    ledger = ledger if ledger is not None else RolloutLedger.from_settings(load_settings())
    for p in proposals:
        if p.through is not None:
            ledger.record_tuning_applied(p.agent, path, p.through, p.changes)
    get_logger("genesis_fp16.rollout.tuning").info(
        "tuning.applied",
        path=str(written["path"]),
        backup=str(written["backup"]) if written["backup"] else None,
        agents=[p.agent for p in proposals],
        changes={p.agent: p.changes for p in proposals},
    )
    return {"path": str(written["path"]), "backup": str(written["backup"]) if written["backup"] else None}

"""Commands: ``profiles show``, ``rollout status|enable|disable|rollback|reset|history``, ``tune``, ``drill``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import typer
from rich.text import Text

from genesis_fp16.base.terminal import (
    Table,
    make_console,
)  # Table: rich's, its columns fold what does not fit instead of cutting it

out = make_console()

profiles_app = typer.Typer(help="Per-agent tuning profiles.", no_args_is_help=True)
rollout_app = typer.Typer(help="Per-agent rollout ledger: off -> shadow -> on, rolled_back.", no_args_is_help=True)


def _settings():
    from genesis_fp16.cli import load_settings_or_exit

    return load_settings_or_exit()


def _agent_or_exit(agent: str) -> str:
    """``agent`` when it is a valid agent name, checked before any file is touched."""
    from genesis_fp16.cli import fail
    from genesis_fp16.base.names import AgentNameError, check_agent_name

    try:
        return check_agent_name(agent)
    except AgentNameError as exc:
        raise fail(str(exc))


def _ledger(settings: Any):
    from genesis_fp16.cli import fail
    from genesis_fp16.rollout.ledger import LedgerError, RolloutLedger

    try:
        ledger = RolloutLedger.from_settings(settings)
        ledger.initialise()
        return ledger
    except LedgerError as exc:
        raise fail(str(exc), code=exc.exit_code)


def _read(settings: Any, what: str, *args: Any) -> Any:
    """The ledger's ``what`` (``status``, ``history``); a fault (a corrupt page, an I/O error) is one line, not a
    traceback."""
    from genesis_fp16.cli import fail
    from genesis_fp16.rollout.ledger import LedgerError

    ledger = _ledger(settings)
    try:
        return getattr(ledger, what)(*args)
    except LedgerError as exc:
        raise fail(str(exc), code=exc.exit_code)


def _policy_or_exit(agent: str, settings: Any):
    from genesis_fp16.cli import fail
    from genesis_fp16.rollout.policy import resolve_policy
    from genesis_fp16.rollout.profiles import ProfileError
    from genesis_fp16.rollout.ledger import LedgerError

    try:
        return resolve_policy(agent, settings)
    except (ProfileError, LedgerError, ValueError) as exc:
        raise fail(str(exc))


@profiles_app.command("show")
def profiles_show(
    agent: Optional[str] = typer.Argument(None, help="Agent name; all known agents when left out."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The effective policy (after settings, profile, ledger, kill switch) and where each value came from."""
    from genesis_fp16.cli import fail, print_json, safe_cells, safe_text
    from genesis_fp16.rollout.profiles import ProfileError, profiles_for

    if agent is not None:
        _agent_or_exit(agent)
    settings = _settings()
    try:
        pf = profiles_for(settings)
    except ProfileError as exc:
        raise fail(str(exc))
    if agent is None:
        known = set(pf.agents) if pf else set()
        from genesis_fp16.rollout.ledger import LEDGER_FILE

        if os.path.exists(Path(settings.state_dir) / LEDGER_FILE):  # a directory or a FIFO there is named
            known |= {row["agent"] for row in _read(settings, "status")}
        agents = sorted(known)
    else:
        agents = [agent]
    policies = [_policy_or_exit(a, settings).as_dict() for a in agents]
    if as_json:
        print_json({"profiles_file": str(settings.effective_profiles_file) if pf else None, "agents": policies})
        return
    out.print(safe_text(f"profiles file: {settings.effective_profiles_file if pf else '(none)'}"))
    if not policies:
        out.print("no agents in the profile file or the ledger; name one: genesis-fp16 profiles show AGENT")
    for pol in policies:
        table = Table(
            title=safe_text(
                f"{pol['agent']}: {pol['precision']} (stage {pol['stage'] or 'unmanaged'}; {pol['reason']})"
            )
        )
        table.add_column("key")
        table.add_column("value")
        table.add_column("from")
        for key, value in pol["config"].items():
            if key in pol["sources"]:
                table.add_row(*safe_cells(key, value, pol["sources"][key]))
        for key, value in pol["thresholds"].items():
            source = "profile" if key in (pf.layer(pol["agent"]).thresholds if pf else {}) else "default"
            table.add_row(*safe_cells(f"thresholds.{key}", value, source))
        out.print(table)


def _check_cells(checks: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(check, when, what it found) for each kind of quality check that has one."""
    rows = []
    gap = checks.get("shadow_gap")
    if gap:
        shown = f"{gap['gap']:+.1%}" if gap.get("gap") is not None else "undefined"
        rows.append(
            (
                "shadow gap",
                gap["at"],
                f"{shown} ({gap['precision']}: {gap['val_loss']:.4g} vs FP32 {gap['fp32_val_loss']:.4g})",
            )
        )
    for kind, label in (("canary", "canary"), ("policy_canary", "policy canary"), ("inference_gap", "inference gap")):
        check = checks.get(kind)
        if not check:
            continue
        m = check["metrics"]
        if kind == "inference_gap":
            found = f"{m['gap']:+.1%}" if m.get("gap") is not None else "undefined"
        else:
            if kind == "canary":
                numbers = (
                    f"{m['val_loss_ratio']:.3f}x FP32" if m.get("val_loss_ratio") is not None else "ratio undefined"
                )
            else:
                numbers = ", ".join(
                    f"{k} {m[k]:.3g}" for k in ("kl", "max_logp_delta", "max_value_delta") if m.get(k) is not None
                )
            verdict = "alarm" if check["alarm"] else "ok"
            if check["alarm"]:
                verdict += ", confirmed" if m.get("confirmed") else f", {m.get('alarms')} in the window"
            found = f"{verdict}: {numbers}"
        rows.append((label, check["at"], f"{found} ({check['precision'] or '-'})"))
    return rows


def _training_cell(check: Optional[dict[str, Any]]) -> str:
    """``bf16 (measured) at <when>: healthy`` for an agent's last recorded training, or ``-``."""
    if not check:
        return "-"
    m = check["metrics"]
    return f"{check['precision']} ({m.get('source') or '?'}), {m.get('outcome') or '?'}, {check['at']}"


@rollout_app.command("status")
def rollout_status(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Every agent's stage, since when, who and why; its latest quality checks (shadow gap, canaries, inference gap)."""
    from genesis_fp16.cli import print_json, safe_cells, safe_text

    settings = _settings()
    rows = _read(settings, "status")
    if as_json:
        print_json({"kill_switch": not settings.enable_fp16_training, "agents": rows})
        return
    if not settings.enable_fp16_training:
        out.print(
            "[bold red]kill switch on[/] (ENABLE_FP16_TRAINING=false): every agent trains in FP32 whatever its stage"
        )
    table = Table(title=safe_text(f"rollout ledger {Path(settings.state_dir) / 'rollout.sqlite'}"))
    for col in ("agent", "stage", "since", "actor", "reason", "last training", "last shadow gap"):
        table.add_column(col, overflow="fold")
    for row in rows:
        gap = row["last_shadow_gap"]
        shown = f"{gap['gap']:+.1%} ({gap['precision']})" if gap and gap.get("gap") is not None else "-"
        table.add_row(
            *safe_cells(
                row["agent"],
                row["stage"] or "-",
                row["since"] or "-",
                row["actor"] or "-",
                row["reason"],
                _training_cell(row["last_training"]),
                shown,
            )
        )
    out.print(table if rows else "no agents in the ledger yet: genesis-fp16 rollout enable AGENT --shadow")
    checks = [(row["agent"], *cells) for row in rows for cells in _check_cells(row["last_checks"])]
    if checks:
        latest = Table(title="latest quality checks")
        for col in ("agent", "check", "when", "result"):
            latest.add_column(col, overflow="fold")
        for cells in checks:
            latest.add_row(*safe_cells(*cells))
        out.print(latest)


def _change(fn_name: str, agent: str, **kwargs: Any) -> None:
    from genesis_fp16.cli import fail, safe_text
    from genesis_fp16.rollout.ledger import LedgerError, Stage

    _agent_or_exit(agent)
    settings = _settings()
    ledger = _ledger(settings)
    try:
        entry = getattr(ledger, fn_name)(agent, **kwargs)
    except LedgerError as exc:  # read-only, full disk: one line, not a traceback
        raise fail(str(exc), code=exc.exit_code)
    except ValueError as exc:
        raise fail(str(exc))
    out.print(
        Text.assemble(
            safe_text(f"{entry['agent']}: {entry['from_stage'] or 'unmanaged'} -> "),
            safe_text(str(entry["to_stage"] or "unmanaged"), "bold"),
            safe_text(f" ({entry['reason']})"),
        )
    )
    if entry["to_stage"] is None:
        out.print(safe_text("the settings and the agent's profile decide its precision again"))
    if not settings.enable_fp16_training and entry["to_stage"] in (Stage.ON, Stage.SHADOW):
        out.print(
            "[yellow]note:[/] the kill switch ENABLE_FP16_TRAINING=false is on; it wins: this agent still trains in "
            "FP32"
        )


@rollout_app.command("enable")
def rollout_enable(
    agent: str = typer.Argument(..., help="Agent name."),
    shadow: bool = typer.Option(
        False, "--shadow", help="Stage shadow: reduced precision with an FP32 reference measured beside it."
    ),
    reason: str = typer.Option("", "--reason", help="Why (kept in the history)."),
    actor: str = typer.Option("cli", "--actor", help="Who (kept in the history)."),
) -> None:
    """Roll reduced precision out to AGENT (stage on, or shadow)."""
    _change("enable", agent, shadow=shadow, actor=actor, reason=reason)


@rollout_app.command("disable")
def rollout_disable(
    agent: str = typer.Argument(..., help="Agent name."),
    reason: str = typer.Option("", "--reason", help="Why (kept in the history)."),
    actor: str = typer.Option("cli", "--actor", help="Who (kept in the history)."),
) -> None:
    """Stage off: AGENT trains in FP32."""
    _change("disable", agent, actor=actor, reason=reason)


@rollout_app.command("rollback")
def rollout_rollback(
    agent: str = typer.Argument(..., help="Agent name."),
    reason: str = typer.Option(..., "--reason", help="What went wrong (required; kept in the history)."),
    actor: str = typer.Option("cli", "--actor", help="Who (kept in the history)."),
) -> None:
    """Stage rolled_back: AGENT trains in FP32 until someone runs `rollout enable`."""
    _change("rollback", agent, reason=reason, actor=actor)


@rollout_app.command("reset")
def rollout_reset(
    agent: str = typer.Argument(..., help="Agent name."),
    reason: str = typer.Option("", "--reason", help="Why (kept in the history)."),
    actor: str = typer.Option("cli", "--actor", help="Who (kept in the history)."),
) -> None:
    """Forget AGENT's stage: the settings and its profile decide again, as for an agent never enabled (history kept)."""
    _change("reset", agent, actor=actor, reason=reason)


@rollout_app.command("history")
def rollout_history(
    agent: Optional[str] = typer.Argument(None, help="Agent name; all agents when left out."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Every stage change: when, who or what, from, to, why."""
    from genesis_fp16.cli import fail, print_json, safe_cells

    if agent is not None:
        _agent_or_exit(agent)
    try:
        rows = _read(_settings(), "history", agent)
    except ValueError as exc:
        raise fail(str(exc))
    if as_json:
        print_json(rows)
        return
    table = Table(title="rollout history")
    for col in ("when", "agent", "actor", "from", "to", "severity", "reason"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            *safe_cells(
                r["when"],
                r["agent"],
                r["actor"],
                r["from_stage"] or "-",
                r["to_stage"] or "(reset)",
                r["severity"] or "-",
                r["reason"],
            )
        )
    out.print(table)


def tune(
    events: Optional[Path] = typer.Option(
        None,
        "--events",
        help="JSON-lines event log (default: <state_dir>/events.jsonl, where every command writes its events).",
    ),
    rotated: bool = typer.Option(
        True, "--rotated/--no-rotated", help="Also read its rotated files EVENTS.1, EVENTS.2, ... (oldest first)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    apply: bool = typer.Option(
        False, "--apply", help="Write the proposals into the profile file (atomically, with a backup)."
    ),
    profiles: Optional[Path] = typer.Option(
        None, "--profiles", help="Profile file to read and write (default: the settings' profile file)."
    ),
) -> None:
    """Propose per-agent profile changes from the event log (loss scale, growth interval, precision)."""
    from genesis_fp16.cli import fail, print_json, safe_text
    from genesis_fp16.rollout.profiles import ProfileError
    from genesis_fp16.base.telemetry import read_events
    from genesis_fp16.rollout.tuning import apply as apply_proposals
    from genesis_fp16.rollout.tuning import propose

    settings = _settings()
    path = profiles or settings.effective_profiles_file
    if events is None:
        events = settings.events_path
    try:
        proposals = propose(read_events(events, include_rotated=rotated), settings=settings, profiles_path=path)
    except FileNotFoundError as exc:
        raise fail(
            f"{exc}; expected the JSON-lines event log that training writes (default <state_dir>/events.jsonl, "
            "GENESIS_FP16_STATE_DIR sets the state dir): train first, or name a log with --events FILE"
        )
    except (ValueError, ProfileError) as exc:
        raise fail(str(exc))
    applied = None
    if apply and proposals:
        try:
            applied = apply_proposals(proposals, path, ledger=_ledger(settings))
        except (ProfileError, OSError) as exc:
            raise fail(f"could not write {path}: {exc}")
    if as_json:
        print_json(
            {
                "events": str(events),
                "profiles_file": str(path),
                "proposals": [p.as_dict() for p in proposals],
                "applied": applied,
            }
        )
        return
    if not proposals:
        out.print(
            safe_text(
                f"no profile changes proposed from {events} (events already applied to {path} are not proposed again)"
            )
        )
    for p in proposals:
        changes = ", ".join(f"{k} {p.current.get(k)!r} -> {v!r}" for k, v in p.changes.items())
        out.print(Text.assemble(safe_text(p.agent, "bold"), safe_text(f": {changes}")))
        for reason in p.reasons:
            out.print(safe_text(f"  because {reason}"))
    if applied:
        out.print(
            safe_text(f"wrote {applied['path']}" + (f" (backup {applied['backup']})" if applied["backup"] else ""))
        )
    elif proposals and not apply:
        out.print(safe_text(f"dry run: add --apply to write {path}"))


def drill(
    json_path: Optional[Path] = typer.Option(None, "--json", help="Also write the report as JSON to this file."),
    keep: bool = typer.Option(False, "--keep", help="Keep the scratch state dir and print where it is."),
) -> None:
    """Rehearse the rollback plan in a scratch state dir; exit 1 if any scenario fails."""
    from genesis_fp16.base.storage import atomic_write_text
    from genesis_fp16.cli import console, safe_text
    from genesis_fp16.rollout.drill import run_drill

    import json

    with console.status("drill: starting") as status:

        def progress(name: str, result: Any) -> None:
            if result is None:
                status.update(f"drill: {name}")
            else:
                mark = Text("PASS", "green") if result.passed else Text("FAIL", "bold red")
                out.print(
                    Text.assemble(mark, safe_text(f" {name} ({result.seconds:.1f}s): {result.detail}")), highlight=False
                )

        report = run_drill(keep=keep, progress=progress)
    if json_path is not None:
        atomic_write_text(json_path, json.dumps(report, indent=2, default=str) + "\n")
    failed = [s["name"] for s in report["scenarios"] if not s["passed"]]
    total = len(report["scenarios"])
    verdict = f"passed: {total} of {total}" if not failed else f"FAILED: {', '.join(failed)} ({len(failed)} of {total})"
    if report["state_dir"]:
        where = f"the injected faults' events are in {Path(report['state_dir']) / 'events.jsonl'}"
    else:
        where = "the injected faults' events went to the scratch event log, removed with it (--keep keeps it)"
    out.print(safe_text(f"drill {verdict} scenarios in {report['seconds']:.1f}s; {where}"), highlight=False)
    if failed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(profiles_app, name="profiles")
    app.add_typer(rollout_app, name="rollout")
    app.command("tune")(tune)
    app.command("drill")(drill)

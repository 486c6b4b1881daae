"""``genesis-fp16 state``: what the state dir holds, run by run, and pruning
of old runs (their replay rows, world-model folders and manifests; never the
rollout ledger, never a running run)."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import typer

if TYPE_CHECKING:
    from .runs import RunInfo

state_app = typer.Typer(help="Runs in the state dir: list them with their size, prune old ones.", no_args_is_help=True)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _when(ts: Optional[float]) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")


def _state_dir() -> Path:
    from genesis_fp16.cli import load_settings_or_exit

    return load_settings_or_exit().state_dir


def _runs_or_exit(state_dir: Path) -> list[RunInfo]:
    from genesis_fp16.cli import fail
    from infrastructure.replay_buffer import ReplayBufferError

    from .runs import list_runs

    try:
        return list_runs(state_dir)
    except ReplayBufferError as exc:
        raise fail(str(exc))


@state_app.command("list")
def list_command(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """Every run with its status, start time, real episodes and size on disk, and the totals of the files that grow.
    A run whose manifest cannot be read is listed as unreadable, then named on stderr in one line (exit 1)."""
    from rich import box

    from genesis_fp16.cli import out, print_error, print_json, safe_text
    from genesis_fp16.base.terminal import Table  # columns fold what does not fit instead of cutting it

    from .runs import storage_totals

    state_dir = _state_dir()
    found = _runs_or_exit(state_dir)
    totals = storage_totals(state_dir)
    if as_json:
        print_json({"state_dir": str(state_dir), "runs": [r.as_dict() for r in found], "totals": totals})
        _unreadable_or_exit(found, print_error)
        return
    table = Table(
        title=safe_text(f"runs in {state_dir}"),
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
        show_edge=False,
    )
    table.add_column("run")
    table.add_column("status")
    table.add_column("started")
    table.add_column("episodes", justify="right")
    table.add_column("size", justify="right")
    for r in found:
        table.add_row(
            safe_text(r.run_id),
            r.status,
            _when(r.started),
            "-" if r.real_episodes is None else str(r.real_episodes),
            human_bytes(r.bytes),
        )
    out.print(table)
    labels = {
        "events": "event log",
        "replay_db": "replay database",
        "ledger": "rollout ledger (never pruned)",
        "world_models": "world-model folders",
        "manifests": "run manifests",
    }
    for key, value in totals.items():
        out.print(f"{labels[key]:<31} {human_bytes(value):>10}", highlight=False)
    if not found:
        out.print("no runs yet: `genesis-fp16 evolve` makes one", highlight=False)
    _unreadable_or_exit(found, print_error)


def _unreadable_or_exit(found: list[RunInfo], print_error: Callable[[str], None]) -> None:
    """One line per run whose manifest cannot be read (the others are listed), then exit 1 when there is any."""
    bad = [r for r in found if r.problem]
    for r in bad:
        print_error(str(r.problem))
    if bad:
        raise typer.Exit(1)


@state_app.command("prune")
def prune_command(
    keep: Optional[int] = typer.Option(None, "--keep", min=0, help="Keep the N newest runs, prune the others."),
    older_than: Optional[str] = typer.Option(
        None, "--older-than", metavar="DURATION", help="Prune runs started more than this ago: 90s, 30m, 12h, 7d, 2w."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would be deleted; delete nothing."),
    vacuum: bool = typer.Option(False, "--vacuum", help="Afterwards, VACUUM the replay database so its file shrinks."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of text."),
) -> None:
    """Delete old runs: replay rows, world-model folder and manifest. With --keep and --older-than, a run goes only if
    both say so."""
    from genesis_fp16.cli import fail, out, print_json, safe_text
    from genesis_fp16.base.telemetry import get_logger
    from infrastructure.replay_buffer import ReplayBufferError

    from .runs import RunStorageError, parse_duration, prune, select_for_pruning

    if keep is None and older_than is None:
        raise fail(
            "state prune: give --keep N and/or --older-than DURATION (e.g. --keep 5, --older-than 7d); add --dry-run "
            "to see first"
        )
    try:
        older_than_s = parse_duration(older_than) if older_than is not None else None
    except ValueError as exc:
        raise fail(f"--older-than: {exc}")
    state_dir = _state_dir()
    found = _runs_or_exit(state_dir)
    chosen = select_for_pruning(found, keep=keep, older_than_s=older_than_s, now=time.time())
    running = [r.run_id for r in found if r.status == "running"]
    if dry_run:
        data = {
            "dry_run": True,
            "would_delete": [r.as_dict() for r in chosen],
            "bytes": sum(r.bytes for r in chosen),
            "running": running,
        }
        if as_json:
            print_json(data)
            return
        for r in chosen:
            out.print(
                safe_text(f"would delete {r.run_id} ({r.status}, {_when(r.started)}, {human_bytes(r.bytes)})"),
                highlight=False,
            )
        out.print(
            f"dry run: {len(chosen)} run(s), about {human_bytes(data['bytes'])}; nothing deleted", highlight=False
        )
        return
    try:
        result = prune(state_dir, chosen, vacuum=vacuum)
    except (ReplayBufferError, RunStorageError) as exc:  # a read-only state dir: the lock or the database refuses
        raise fail(f"{exc}; nothing was deleted")
    get_logger("agents.state").info(
        "state.pruned",
        runs=len(result.deleted),
        trajectories=result.replay_rows,
        freed_bytes=result.freed_bytes,
        vacuum=vacuum,
    )
    if as_json:
        print_json(
            {
                "dry_run": False,
                "deleted": [r.as_dict() for r in result.deleted],
                "skipped_running": result.skipped_running,
                "replay_rows": result.replay_rows,
                "freed_bytes": result.freed_bytes,
                "replay_db_bytes": {"before": result.replay_db_before, "after": result.replay_db_after},
            }
        )
        return
    for r in result.deleted:
        out.print(
            safe_text(f"deleted {r.run_id} ({r.status}, {_when(r.started)}, {human_bytes(r.bytes)})"), highlight=False
        )
    for run_id in result.skipped_running:
        out.print(safe_text(f"skipped {run_id}: it is running"), highlight=False)
    db = f"replay database {human_bytes(result.replay_db_before)} -> {human_bytes(result.replay_db_after)}"
    hint = "" if vacuum else " (its free pages are reused; --vacuum shrinks the file)"
    out.print(
        f"pruned {len(result.deleted)} run(s), {result.replay_rows} trajectories, about "
        f"{human_bytes(result.freed_bytes)} freed; {db}{hint}",
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    app.add_typer(state_app, name="state")

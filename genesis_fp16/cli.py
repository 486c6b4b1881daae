"""The ``genesis-fp16`` command.

Built-in commands: ``doctor`` and ``trainers``. Other commands (``evolve``,
``rollout``, ``profiles``, ``tune``, ``drill``, ``bench``, ``ppo``,
``forensics``) register themselves through the entry-point group
``genesis_fp16.commands``: each entry point names ``register(app)``. This keeps
``genesis_fp16`` free of imports of ``agents`` and ``infrastructure``.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from importlib import metadata
from typing import Any, Optional

import typer
from rich.text import Text

# torch-free imports only: commands that train nothing must start in well under
# a second (tests/test_cli_startup.py); a command that needs torch imports it itself
from genesis_fp16.base.settings import LogLevel, SettingsError, describe_settings, load_settings, unknown_settings
from genesis_fp16.base.errors import DeviceUnavailableError, DistributedEnvError, UnsupportedPrecisionError
from genesis_fp16.base.extras import MissingExtraError
from genesis_fp16.base.names import AgentNameError
from genesis_fp16.rollout.profiles import ProfileError
from genesis_fp16.base.packages import shadowed
from genesis_fp16.base.errors import strict_json_value  # re-exported: the CLIs import it from here
from genesis_fp16.base.telemetry import set_console_level, visible_controls
from genesis_fp16.base.terminal import (
    Table,
    make_console,
)  # Table: rich's, its columns fold what does not fit instead of cutting it

COMMAND_GROUP = "genesis_fp16.commands"

# What a person fixes in the configuration (settings, profiles, an agent name,
# the launch, an extra to install), not in the code: `main` shows it as one
# line and exit 2 from any command, however deep it was raised.
CONFIGURATION_ERRORS: tuple[type[Exception], ...] = (
    SettingsError,
    ProfileError,
    AgentNameError,
    UnsupportedPrecisionError,
    DeviceUnavailableError,
    DistributedEnvError,
    MissingExtraError,
)

app = typer.Typer(
    name="genesis-fp16",
    help="Mixed-precision training for self-evolving agents: doctor, trainers, evolve, rollout, bench, ppo, forensics.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = make_console(stderr=True)  # progress, logs, errors
out = make_console()  # results


def safe_text(value: Any, style: str = "") -> Text:
    """``value`` as rich ``Text``, which is never parsed as markup, with control
    characters written as visible escapes. Text from users, files or the ledger
    is printed through this (a reason of "[/bold]" is shown, not interpreted)."""
    return Text(visible_controls(str(value)), style=style)


def safe_cells(*values: Any) -> list[Text]:
    """A table row of `safe_text` cells."""
    return [safe_text(v) for v in values]


def print_error(message: str) -> None:
    """``error: MESSAGE`` on stderr; only the label is styled, the message is shown literally."""
    console.print(Text.assemble(("error:", "bold red"), " ", safe_text(message)), highlight=False)


def fail(message: str, code: int = 2) -> "typer.Exit":
    """Print one clear error and return the exit to raise."""
    print_error(message)
    return typer.Exit(code)


def load_settings_or_exit(**overrides: Any):
    try:
        return load_settings(**overrides)
    except SettingsError as exc:
        raise fail(str(exc))


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(strict_json_value(data), indent=2, sort_keys=True, default=str, allow_nan=False) + "\n")


def _print_version(asked: bool) -> None:
    if asked:
        from genesis_fp16 import __version__

        out.print(f"genesis-fp16 {__version__}", highlight=False)
        raise typer.Exit(0)


@app.callback()
def _global_options(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    ),
    verbose: bool = typer.Option(
        False,
        "-v",
        "--verbose",
        help="Show INFO events on stderr too (default: warnings and errors; GENESIS_FP16_CONSOLE_LOG_LEVEL). "
        "<state_dir>/events.jsonl gets them either way.",
    ),
) -> None:
    # set on every invocation, so one run's -v does not outlive it in a long-lived process
    set_console_level(LogLevel.INFO if verbose else None)


@app.command()
def doctor(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    recalibrate: bool = typer.Option(
        False,
        "--recalibrate",
        help="Forget auto's measured decisions (the host-level precision cache, GENESIS_FP16_PRECISION_CACHE): each "
        "workload is measured again on its next run.",
    ),
) -> None:
    """Torch version, devices, what each supports, what `auto` decided per measured workload and why, and the settings
    in effect.

    One story: a device with measured workloads shows what each measurement decided (and why);
    the flag rule is shown, as "rule (not measured)", only for a device where nothing was measured."""
    settings = load_settings_or_exit(
        check_names=False
    )  # doctor lists the valid names: a misspelled one must not stop it
    unknown = unknown_settings()
    import torch

    from genesis_fp16.precision.cache import CacheRefused, PrecisionCache, fix_hint
    from genesis_fp16.precision.modes import MODES, capability_report
    from genesis_fp16.precision.capability import cpu_flags, cpu_has_fast_bf16, cpu_has_native_bf16

    cache = PrecisionCache.from_settings(settings)
    cleared, moved_aside, aside_problem, refused = None, None, "", None
    if recalibrate:
        try:
            forgotten = cache.forget()
            cleared, moved_aside, aside_problem = forgotten.count, forgotten.moved_aside, forgotten.problem
        except CacheRefused as exc:  # not a cache of ours, not a regular file, locked: left alone, said why
            refused = str(exc)
        except OSError as exc:
            refused = f"{cache.path} could not be changed ({exc.strerror or exc}); check that its directory is writable"
    calibrations = [c.as_record() for c in cache.all()]
    found = cache.inspect()

    devices = ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    reports = [_one_story(capability_report(d), calibrations) for d in devices]
    primary = reports[-1] if len(reports) > 1 else reports[0]
    interesting = sorted(
        f for f in cpu_flags() if f in {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_fp16", "f16c"}
    )
    data = {
        "genesis_fp16_version": metadata.version("genesis-fp16") if _installed() else "source",
        "torch_version": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cuda_available": torch.cuda.is_available(),
        "cpu_flags": interesting,
        "cpu_native_bf16": cpu_has_native_bf16(),
        "cpu_fast_bf16": cpu_has_fast_bf16(),
        "devices": reports,
        "auto_device": primary["device"],
        "auto_precision": primary["auto_precision"],
        "auto_reason": primary["auto_reason"],
        "auto_decides_by": settings.auto_precision.value,
        "precision_cache": str(cache.path),
        "precision_cache_state": found.state,
        "precision_cache_problem": found.problem or None,
        "decisions": [
            {
                "workload": _workload_text(rec),
                "device": (rec.get("workload") or {}).get("device"),
                "precision": rec.get("precision"),
                "source": "cached",
                "reason": rec.get("reason"),
            }
            for rec in calibrations
        ],
        "calibrations": calibrations,
        "calibrations_cleared": cleared,
        "precision_cache_moved_aside": str(moved_aside) if moved_aside else None,
        "recalibrate_refused": refused,
        "settings": json.loads(settings.model_dump_json()),
        "unknown_settings": unknown,
    }
    if as_json:
        print_json(data)
        if refused:
            raise typer.Exit(2)
        return
    out.print(
        Text.assemble(
            ("genesis-fp16", "bold"),
            safe_text(f" {data['genesis_fp16_version']}  torch {data['torch_version']}  python {data['python']}"),
        )
    )
    table = Table(title="devices and precisions")
    modes = [m.value for m in MODES]
    for col in ("device", "name", *modes, "auto"):
        table.add_column(col)
    for rep in reports:
        sup = rep["support"]
        table.add_row(*safe_cells(rep["device"], rep["name"], *(sup[m] for m in modes), rep["auto"]))
    out.print(table)
    if moved_aside is not None:
        out.print(
            safe_text(
                f"recalibrate: {cache.path} was not readable ({aside_problem}); moved aside to {moved_aside}, "
                "nothing deleted; each workload is measured again on its next run"
            )
        )
    elif cleared is not None:
        out.print(
            safe_text(
                f"recalibrate: forgot {cleared} measured decision(s); each workload is measured again on its next run"
            )
        )
    if calibrations:
        out.print(_calibration_table(calibrations, cache.path))
    elif found.problem:
        measures = settings.auto_precision.value == "measure"
        out.print(
            safe_text(
                f"no measured decision readable: the precision cache {cache.path} {found.problem} ({fix_hint(found)}); "
                f"{'until then auto measures each workload on every run and saves nothing; ' if measures else ''}"
                f"rule (not measured): {data['auto_precision']} on {data['auto_device']}"
            )
        )
    else:
        auto_does = (
            "measures each workload the first time it trains"
            if settings.auto_precision.value == "measure"
            else "follows the flag rule (GENESIS_FP16_AUTO_PRECISION=rule)"
        )
        out.print(
            safe_text(
                f"nothing measured on this host yet ({cache.path}); auto {auto_does}; "
                f"until then: {data['auto_precision']} on {data['auto_device']}, rule (not measured): "
                f"{data['auto_reason']}"
            )
        )
    out.print(safe_text(f"CPU flags: {', '.join(interesting) or 'none of interest'}"))
    st = Table(title="settings in effect")
    st.add_column("variable")
    st.add_column("value")
    for row in describe_settings():
        value = getattr(settings, row["field"])
        st.add_row(*safe_cells(row["env"], getattr(value, "value", value)))
    out.print(st)
    for problem in unknown:
        console.print(Text.assemble(("warning:", "yellow"), " ", safe_text(problem)), highlight=False)
    if refused:
        console.print(Text.assemble(("error:", "red"), " ", safe_text(f"recalibrate: {refused}")), highlight=False)
        raise typer.Exit(2)


def _workload_text(rec: dict[str, Any]) -> str:
    work = rec.get("workload") or {}
    return (
        f"{work.get('model')} {work.get('parameters')} params, {work.get('optimizer')}, batch "
        f"{json.dumps(work.get('batch'))}"
    )


def _one_story(report: dict[str, Any], calibrations: list[dict[str, Any]]) -> dict[str, Any]:
    """A device's row, told alike with the measurements: where a workload was
    measured on this device type, the flag rule's ``slow`` and ``auto`` give
    way to the measured decisions (listed below the table); elsewhere the
    rule is shown as such, "rule (not measured)"."""
    kind = report["device"].split(":")[0]
    measured = [rec for rec in calibrations if (rec.get("workload") or {}).get("device") == kind]
    report = dict(report, measured=len(measured))
    if measured:
        picks = sorted({str(rec.get("precision")) for rec in measured})
        report["support"] = {m: ("runs" if v != "none" else v) for m, v in report["support"].items()}
        report["auto"] = f"measured: {', '.join(picks)} (per workload, below)"
    else:
        report["support"] = {
            m: (f"{v} (rule, not measured)" if v == "slow" else v) for m, v in report["support"].items()
        }
        report["auto"] = f"{report['auto_precision']}: rule (not measured)"
    return report


def _measured_when(rec: dict[str, Any]) -> str:
    """When, by which process and under what load a decision was measured (the record's own words)."""
    by, load = rec.get("measured_by") or {}, rec.get("load") or {}
    average = load.get("average")
    under = (
        "load " + "/".join(f"{v:.2f}" for v in average) + (f" on {load.get('cpus')} CPUs" if load.get("cpus") else "")
        if average
        else "load unknown"
    )
    return f"{rec.get('at')} by pid {by.get('pid')} ({by.get('command')}) on {by.get('host')}, {under}"


def _calibration_table(calibrations: list[dict[str, Any]], where: Any) -> Table:
    table = Table(
        title=f"auto's measured decisions ({len(calibrations)}, {where}; `doctor --recalibrate` forgets them)"
    )
    for col in ("when", "workload", "device", "speed vs fp32 (at worst)", "loss vs fp32", "decision", "why", "cost s"):
        table.add_column(col)
    for rec in calibrations:
        work = rec.get("workload") or {}
        low = rec.get("speed_low") or {}
        speed = ", ".join(
            f"{m} {v:.2f}x ({float(low.get(m, v)):.2f}x)" if isinstance(v, (int, float)) else f"{m} -"
            for m, v in (rec.get("speed") or {}).items()
            if m != "fp32"
        )
        ratio = ", ".join(
            f"{m} {v:.3f}" if isinstance(v, (int, float)) else f"{m} inf"
            for m, v in (rec.get("loss_ratio") or {}).items()
            if m != "fp32"
        )
        where = f"{work.get('device_name')} ({work.get('threads')} threads)"
        cost = rec.get("cost_s")
        reason = str(rec.get("reason") or "")
        why = reason.rsplit(": ", 1)[-1] if ": " in reason else reason
        table.add_row(
            *safe_cells(
                _measured_when(rec),
                _workload_text(rec),
                where,
                speed or "-",
                ratio or "-",
                rec.get("precision"),
                why,
                f"{cost:.3f}" if isinstance(cost, (int, float)) else "-",
            )
        )
    return table


@app.command()
def trainers(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List registered trainers (built-in and entry-point plugins)."""
    from genesis_fp16.training.registry import available

    specs = available()
    if as_json:
        print_json([{"name": s.name, "description": s.description, "source": s.source} for s in specs.values()])
        return
    table = Table(title="trainers")
    table.add_column("name")
    table.add_column("source")
    table.add_column("description")
    for spec in specs.values():
        table.add_row(
            *safe_cells(spec.name, spec.source, spec.description.strip().splitlines()[0] if spec.description else "")
        )
    out.print(table)


def _installed() -> bool:
    try:
        metadata.version("genesis-fp16")
        return True
    except metadata.PackageNotFoundError:
        return False


def _register_plugins() -> None:
    for ep in sorted(metadata.entry_points(group=COMMAND_GROUP), key=lambda e: e.name):
        try:
            register = ep.load()
            register(app)
        except Exception as exc:  # shown, never hidden: one broken command must not take the others down
            why = f"{type(exc).__name__}: {exc}"
            shadows = shadowed((ep.value.split(".", 1)[0].split(":", 1)[0],))
            if shadows:
                why = shadows[0].message()
            console.print(
                Text.assemble(
                    ("warning:", "yellow"), " ", safe_text(f"command {ep.name!r} unavailable ({ep.value}): {why}")
                )
            )


_register_plugins()


def configuration_error(exc: BaseException) -> Optional[BaseException]:
    """The configuration error ``exc`` is, or was raised from (``raise ... from``), or None."""
    cause: Optional[BaseException] = exc
    while cause is not None:
        if isinstance(cause, CONFIGURATION_ERRORS):
            return cause
        cause = cause.__cause__
    return None


_STARTED: Optional[float] = None


def command_started() -> Optional[float]:
    """When the running command started, as a `time.perf_counter` value: the process's start for the
    ``genesis-fp16`` program (`main` without arguments: its start-up, the imports, counts), when `main` was
    entered for a call with arguments; None when the command was not run through `main` (a test's runner)."""
    return _STARTED


def _process_started() -> float:
    import psutil

    now = time.perf_counter()
    try:
        age = time.time() - psutil.Process().create_time()
    except (psutil.Error, OSError):
        return now
    return now - max(0.0, age)


def main(argv: Optional[list[str]] = None) -> None:
    global _STARTED
    _STARTED = _process_started() if argv is None else time.perf_counter()
    try:
        app(args=argv, standalone_mode=True)
    except Exception as exc:
        error = configuration_error(exc)
        if error is None:
            raise  # a bug keeps its traceback
        print_error(str(error))
        sys.exit(2)
    finally:
        _STARTED = None  # a later command in this process (a test's) starts its own clock


if __name__ == "__main__":
    main()

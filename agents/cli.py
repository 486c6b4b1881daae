"""``genesis-fp16 evolve``: the evolution loop on a task (Pendulum-v1 by default)."""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import shlex
import signal
import threading
import time
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import fields, replace
from enum import Enum
from pathlib import Path
from typing import Any, Iterator, Optional

import typer

from .evolve_config import ADVANCED, RARE_PANELS


class Backend(str, Enum):
    process = "process"
    ray = "ray"


class Baseline(str, Enum):
    none = "none"
    cma = "cma"


EXIT_SIGINT = 128 + signal.SIGINT  # 130, the shell's code for a death by the signal
EXIT_SIGTERM = 128 + signal.SIGTERM  # 143


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C raises KeyboardInterrupt,
    so the loop stops the same way (event, workers terminated, what is safe)."""


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises `Terminated` while the run lasts. Installed by
    the command only: a program embedding the agent keeps its own handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return

    def handler(signum: int, frame: Any) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _fmt(value: Any, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def resume_command(run_id: str, settings: Any) -> str:
    """The command that continues run ``run_id``, as it works when pasted: with the state dir
    (``GENESIS_FP16_STATE_DIR=...``) when it is not the default one."""
    from genesis_fp16.base.settings import Settings, env_name

    command = f"genesis-fp16 evolve --resume {run_id}"
    state_dir = Path(settings.state_dir)
    if state_dir.resolve() != Path(Settings.model_fields["state_dir"].default).resolve():
        command = f"{env_name('state_dir')}={shlex.quote(str(state_dir.resolve()))} {command}"
    return command


def _committed_text(agent: Any) -> str:
    """The generations and real episodes committed (what a resume continues after), and those of a generation cut
    off after them (run again by a resume): the counts the ``evolve.interrupted`` event logs."""
    generations, episodes = agent.committed()
    cut = agent.cut_off()
    text = f"{generations} generation(s) ({episodes} real episodes) are committed"
    if cut:
        text += f"; generation {generations} was cut off after {cut} real episodes, which a resume runs again"
    return text


def _safe_data(agent: Any) -> str:
    """What of a failed run is kept, for its error message: the generations
    committed to its manifest, which a resume continues after (the replay
    rows of a generation cut off before its commit are discarded then)."""
    if agent is None:
        return ""
    return (
        f"; {_committed_text(agent)}, their data safe in {agent.buffer.path}, and every checkpoint written before is "
        f"whole (atomic writes); `{resume_command(agent.run_id, agent.settings)}` continues after them"
    )


class _Display:
    """The run's progress on the terminal: a bar of the real episodes charged, and under it a line for the phase
    running (a generation's episodes, a learner's steps, a verification), each advanced by the run's progress
    events (`agents.progress`) as they come, from whichever thread."""

    def __init__(self, console: Any, mode: str, seed: int, budget: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.budget = budget
        self.progress = Progress(
            TextColumn("{task.description}", markup=False),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TextColumn("{task.fields[unit]}", markup=False),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self.episodes = self.progress.add_task(f"evolve {mode} seed {seed}", total=budget, unit="real episodes")
        self.phase: Optional[Any] = None  # the phase line's task, made anew for each phase (its clock, its total)
        self.showing: Optional[str] = None

    def on_progress(self, event: Any) -> None:
        progress = self.progress
        progress.update(self.episodes, completed=min(event.real_episodes, self.budget))
        if event.state == "end":
            if self.showing == event.phase and self.phase is not None:
                progress.update(self.phase, visible=False)
                self.showing = None
            return
        text = f"gen {event.generation} {event.phase}" + (f" ({event.detail})" if event.detail else "")
        if event.state == "begin" or self.showing != event.phase or self.phase is None:
            if self.phase is not None:
                progress.remove_task(self.phase)
            self.phase = progress.add_task(text, total=event.total, completed=event.done, unit=event.unit)
        else:
            progress.update(self.phase, total=event.total, completed=event.done, description=text, visible=True)
        self.showing = event.phase


def _list_tasks(value: bool) -> None:
    """--list-tasks: the registered task names, then exit."""
    if not value:
        return
    from genesis_fp16.cli import fail, safe_text
    from genesis_fp16.base.extras import require

    from .evolve_config import EVOLVE
    from .tasks import TaskError, task_names

    require("gymnasium", EVOLVE)
    try:
        names = task_names()
    except TaskError as exc:
        raise fail(str(exc))
    for name, description in names.items():
        typer.echo(safe_text(f"{name:<28} {description}"))
    typer.echo(
        "any other gymnasium id with a flat Box observation and a Box action works too (--target R where its spec has "
        "no reward_threshold)"
    )
    raise typer.Exit(0)


def _help_all(ctx: typer.Context, value: bool) -> None:
    """--help-all: the help with every option, the rarely used ones (`ADVANCED`, hidden from --help) too, then exit."""
    if not value or ctx.resilient_parsing:
        return
    from typer.core import TyperOption  # typer carries its own click: click.Option is not its base

    hidden = [p for p in ctx.command.params if isinstance(p, TyperOption) and p.hidden]
    for p in hidden:  # shown for this one help text; the command object is shared by every invocation in a process
        p.hidden = False
    try:
        typer.echo(ctx.get_help(), nl=False)
    finally:
        for p in hidden:
            p.hidden = True
    raise typer.Exit(0)


def _config_options() -> list[inspect.Parameter]:
    """One keyword parameter per `EvolveConfig` field offered as a flag: its
    name, default, help (the field's docstring) and panel come from the field."""
    from .evolve_config import EvolveConfig, config_docs, range_text

    docs, params = config_docs(), []
    for f in fields(EvolveConfig):
        meta = f.metadata
        if not meta.get("cli", True):
            continue
        flag = "--" + (meta.get("flag") or f.name).replace("_", "-")
        kind = {
            "Optional[int]": Optional[int],
            "Optional[float]": Optional[float],
            "Optional[str]": Optional[str],
            "int": int,
            "float": float,
            "str": str,
            "bool": bool,
            "Optional[PrecisionRequest]": Optional[str],
        }[str(f.type)]  # a request's text: parsed by EvolveConfig
        decls = [f"{flag}/--no-{flag[2:]}"] if kind is bool else [flag]
        extra: dict[str, Any] = {}
        if kind in (int, Optional[int]) and (meta.get("least") is not None or meta.get("most") is not None):
            # the range is shown here and checked by `EvolveConfig.validate` (one error line naming the option, the
            # value,
            # the range and what to pass), not by click's min/max (an error panel without the value)
            extra["metavar"] = range_text(meta.get("least"), meta.get("most")).replace(" ", "")
        # the docstring's first clause without its long asides, the default after it: about two lines at 80 columns
        # (docs/EVOLUTION.md's option table has the whole docstring)
        help_text = " ".join(docs.get(f.name, "").split()).replace("`", "").split("; ")[0].split(". ")[0].rstrip(".")
        help_text = re.sub(r" \([^()]{30,}\)", "", help_text)
        if f.default is not None and kind is not bool:
            help_text += f" (default {f.default})"
        option = typer.Option(
            f.default,
            *decls,
            help=help_text + ".",
            rich_help_panel=meta.get("panel"),
            show_default=False,
            hidden=meta.get("panel") in RARE_PANELS,
            **extra,
        )
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind))
    return params


def evolve(
    ctx: typer.Context,
    list_tasks: bool = typer.Option(
        False, "--list-tasks", is_eager=True, callback=_list_tasks, help="List the registered tasks and exit."
    ),
    help_all: bool = typer.Option(
        False,
        "--help-all",
        is_eager=True,
        callback=_help_all,
        help="Show every option, the rarely used ones too, and exit.",
    ),
    baseline: Baseline = typer.Option(
        Baseline.none, "--baseline", help="cma: the floor, a one-episode CMA-ES, instead of the loop."
    ),
    ray_address: Optional[str] = typer.Option(
        None,
        "--ray-address",
        metavar="auto|HOST:PORT",
        rich_help_panel=ADVANCED,
        hidden=True,
        help="With --backend ray: the cluster to join (default: settings' ray_address); unset: a local Ray with "
        "--workers CPUs.",
    ),
    torch_threads: Optional[int] = typer.Option(
        None,
        "--torch-threads",
        metavar="0..4096",
        rich_help_panel=ADVANCED,
        hidden=True,
        help="torch CPU threads (default: settings' torch_threads, 1: the models are small; 0: torch's default).",
    ),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the report as JSON to this file."),
    quiet: bool = typer.Option(False, "--quiet", help="Only the report and errors."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Draw the learning curves as PNG here."),
    tensorboard: Optional[Path] = typer.Option(
        None,
        "--tensorboard",
        metavar="DIR",
        rich_help_panel=ADVANCED,
        hidden=True,
        help="Write TensorBoard scalars (loss scale, overflow rate, losses, FP32 gaps, verdicts) here; default: "
        "settings' tensorboard_dir.",
    ),
    resume: Optional[str] = typer.Option(
        None,
        "--resume",
        metavar="RUN_ID",
        help="Continue an interrupted run (ids: genesis-fp16 state list) with its own options; --budget and "
        "--budget-steps may change.",
    ),
    **options: Any,
) -> None:
    """Evolve a policy for a task: CMA-ES refined by an FP16/BF16 critic and world model (or the CMA-ES floor)."""
    from genesis_fp16.cli import command_started

    started = command_started() or time.perf_counter()  # the wall time counts the command's start-up
    from genesis_fp16.base.extras import require
    from genesis_fp16.cli import fail, load_settings_or_exit
    from genesis_fp16.base.settings import env_name
    from genesis_fp16.base.storage import StorageError, check_output_path, prepare_dir
    from genesis_fp16.base.tensorboard_sink import check_available

    from .evolve_config import EVOLVE, EvolveConfig

    require("gymnasium", EVOLVE)  # first: a missing extra is one error line, before any output
    if plot is not None:  # before cma: cma warns on import when matplotlib is missing
        require("matplotlib", f"{EVOLVE} --plot")
    require("cma", EVOLVE)
    # then: a value out of range is one line before anything is loaded or allocated
    if torch_threads is not None and not 0 <= torch_threads <= 4096:
        raise fail(
            f"--torch-threads {torch_threads}: expected 0..4096 (torch CPU threads; 0: torch's default); pass a value "
            "in that range"
        )
    config = EvolveConfig(**options)
    try:
        config.validate()
    except ValueError as exc:
        raise fail(str(exc))
    settings = load_settings_or_exit()
    if torch_threads is not None:  # the flag wins over GENESIS_FP16_TORCH_THREADS for this run
        settings = settings.model_copy(update={"torch_threads": torch_threads})
    if baseline == Baseline.cma:
        config = replace(config, use_world_model=False, use_critic=False, refined=0)
    # the options given on the command line: a resumed run must match them (or may change budgets, workers, backend)
    given = {name: value for name, value in options.items() if ctx.get_parameter_source(name).name != "DEFAULT"}
    tensorboard = tensorboard if tensorboard is not None else settings.tensorboard_dir
    if tensorboard is not None:
        check_available()
    task = None
    try:
        if resume is None:
            config, task = (
                config.resolve()
            )  # the task checked (env id, spaces, target) before any output; the agent takes it as it is
        else:
            config.validate()
        # before any episode: a bad state dir or output path must not lose the run
        prepare_dir(settings.state_dir, name=env_name("state_dir"))
        if json_path is not None:
            check_output_path(json_path, "--json")
        if plot is not None:
            check_output_path(plot, "--plot")
        if tensorboard is not None:
            check_output_path(tensorboard, "--tensorboard", directory=True)
    except ValueError as exc:
        raise fail(str(exc))
    except StorageError as exc:
        raise fail(str(exc), code=exc.exit_code)

    runs_on = _backend_of_run(ctx, Backend(config.backend), resume, Path(settings.state_dir))
    if ray_address is not None and runs_on != Backend.ray:
        raise fail(
            f"--ray-address {ray_address}: it applies to --backend ray only (this run uses --backend {runs_on.value}); "
            "add --backend ray, or leave --ray-address out"
        )
    # the setting is the default address of the Ray backend: a run on the process pool ignores it
    address = ray_address if ray_address is not None else settings.ray_address
    with ExitStack() as connected:
        if runs_on == Backend.ray:  # connected while the run lasts; a local Ray started here is shut down after it
            from .ray_evaluation import RayConnectError, ray_connection

            try:
                connected.enter_context(ray_connection(address, num_cpus=config.workers))
            except RayConnectError as exc:
                raise fail(str(exc))
        _run(
            config,
            task,
            settings,
            given,
            resume=resume,
            baseline=baseline,
            json_path=json_path,
            plot=plot,
            tensorboard=tensorboard,
            quiet=quiet,
            started=started,
        )


evolve.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [p for p in inspect.signature(evolve).parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    + _config_options()
)


def _backend_of_run(ctx: typer.Context, backend: Backend, resume: Optional[str], state_dir: Path) -> Backend:
    """The backend the run uses: ``--backend``, or for a ``--resume`` without it
    the run's own (a run started on Ray resumes on Ray, at the settings' address)."""
    from .runs import RunError, read_manifest

    if resume is None or ctx.get_parameter_source("backend").name != "DEFAULT":
        return backend
    try:
        saved = read_manifest(state_dir, resume).get("config", {}).get("backend")
    except RunError:  # resuming it fails, with its own message, once the options are checked
        return backend
    return Backend(saved) if saved in {b.value for b in Backend} else backend


def _run(
    config: Any,
    task: Any,
    settings: Any,
    given: dict[str, Any],
    *,
    resume: Optional[str],
    baseline: Baseline,
    json_path: Optional[Path],
    plot: Optional[Path],
    tensorboard: Optional[Path],
    quiet: bool = False,
    started: Optional[float] = None,
) -> None:
    """The run itself, once its options are checked; ``task``: the config's task, resolved (None for a resume, which
    resolves the run's own); ``given``: the config options the command line set; ``quiet``: no progress shown;
    ``started``: when the command started (`time.perf_counter`), where the run's wall time begins."""
    from rich.text import Text

    from genesis_fp16.training.checkpoint import CheckpointError
    from genesis_fp16.base.storage import atomic_write_text
    from genesis_fp16.base.terminal import Table  # columns fold what does not fit instead of cutting it
    from genesis_fp16.cli import console, fail, out, safe_cells, safe_text, strict_json_value
    from genesis_fp16.base.storage import StorageError, full_disk
    from genesis_fp16.base.tensorboard_sink import tensorboard_events

    from .evaluation import EvaluationError
    from .evolve_report import mode_of, report_rows
    from .runs import RunStorageError
    from .se_darwin_agent import SEDarwinAgent

    agent = None
    started = time.perf_counter() if started is None else started
    if resume is not None:
        agent = _resumed_agent(resume, settings, baseline=baseline, given=given, started=started)
        config = agent.config
    budget, seed, mode = config.budget, config.seed, mode_of(config)
    display = None if quiet else _Display(console, mode, seed, budget)

    def on_generation(record: dict[str, Any]) -> None:
        assert display is not None
        display.progress.update(display.episodes, completed=min(record["real_episodes"], budget))
        learned = "".join(
            f" {name} loss {_fmt(record.get(key), '.4f')} ({record.get(prec)})"
            for name, key, prec in (
                ("model", "wm_val_loss", "wm_precision"),
                ("critic", "critic_val_loss", "critic_precision"),
            )
            if record.get(prec) is not None
        )
        display.progress.console.print(
            safe_text(
                f"gen {record['generation']:>2}: {record['real_episodes']:>4} episodes, {record['env_steps']:>7} "
                "steps; best episode "
                f"{_fmt(record['best_return'])} (refined {_fmt(record['refined_best'])}, cma "
                f"{_fmt(record['cma_best'])}){learned}"
            ),
            highlight=False,
        )

    try:
        with _sigterm_as_interrupt(), tensorboard_events(tensorboard), display.progress if display else nullcontext():
            if agent is None:
                agent = SEDarwinAgent(config, task=task, settings=settings, started=started)
            if display is not None:
                agent.on_generation, agent.on_progress = on_generation, display.on_progress
                display.progress.update(display.episodes, completed=min(agent.real_episodes, budget))
            report = asyncio.run(agent.evolve())
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM as Terminated
        if agent is not None:
            console.print(
                Text.assemble(
                    ("interrupted", "yellow"),
                    safe_text(
                        f": {_committed_text(agent)}, their data safe in {agent.buffer.path} (agent "
                        f"{agent.data_agent!r})"
                    ),
                ),
                highlight=False,
            )
            console.print(safe_text(f"continue it with: {resume_command(agent.run_id, settings)}"), highlight=False)
        raise typer.Exit(EXIT_SIGTERM if isinstance(exc, Terminated) else EXIT_SIGINT)
    except ValueError as exc:
        raise fail(str(exc))
    except (
        StorageError
    ) as exc:  # the replay buffer or the ledger (ReplayBufferError, LedgerError): state dir, corrupt file, full disk
        if agent is not None:
            agent.evaluator.terminate()
        raise fail(f"{exc}{_safe_data(agent)}", code=exc.exit_code)
    except (
        CheckpointError,
        RunStorageError,
    ) as exc:  # a world-model checkpoint or the run manifest could not be written
        if agent is not None:
            agent.evaluator.terminate()
        full = "the disk is full: " if full_disk(Path(settings.state_dir) / "runs", exc) else ""
        raise fail(f"{full}{exc}{_safe_data(agent)}" + ("; free space and run again" if full else ""), code=1)
    except EvaluationError as exc:
        # later generations charge and skip a failed candidate; this is one the loop
        # cannot do without (the seed generation, the held-out evaluation, a CMA-ES batch)
        if agent is not None:
            agent.evaluator.terminate()
        raise fail(f"{exc}{_safe_data(agent)}", code=1)

    table = Table(title=safe_text(f"evolve: {report['mode']} on {report['env']}, seed {report['seed']}"))
    table.add_column("metric")
    table.add_column("value")  # left: some values are sentences (why the run stopped)
    for name, value in report_rows(report):
        table.add_row(*safe_cells(name, value))
    out.print(table)
    if report.get("policy_file"):
        out.print(
            safe_text(f"policy: {report['policy_file']}; run it: genesis-fp16 eval --policy {report['policy_file']}"),
            highlight=False,
            soft_wrap=True,
        )
    if json_path is not None:
        # strict JSON: a candidate lost to a timeout scores -inf, written as "-inf"
        try:
            atomic_write_text(
                json_path, json.dumps(strict_json_value(report), indent=2, default=str, allow_nan=False) + "\n"
            )
        except OSError as exc:  # e.g. the disk filled during the run: the table above is the report
            raise fail(
                f"--json {json_path}: the report could not be written ({exc}); the run's data is in "
                f"{report.get('replay_db') or 'the table above'}",
                code=1,
            )
        console.print(safe_text(f"report written to {json_path}"), highlight=False)
    if plot is not None:
        from .evolve_config import EVOLVE
        from .plots import evolve_figure, write_png

        try:
            write_png(evolve_figure(report), plot, f"{EVOLVE} --plot")
        except OSError as exc:
            raise fail(
                f"--plot {plot}: the figure could not be written ({exc}); the report is in the table above", code=1
            )
        console.print(safe_text(f"plot written to {plot}"), highlight=False)
    if report["stop_reason"] == "failed":  # after the report: it says which candidates failed and why
        raise fail(report["stop_detail"], code=1)


def _resumed_agent(
    run_id: str, settings: Any, *, baseline: Baseline, given: dict[str, Any], started: Optional[float] = None
) -> Any:
    """The run ``run_id`` ready to continue; an option given on the command
    line must match the run's own (the budgets, workers and backend may change)."""
    from genesis_fp16.cli import fail

    from infrastructure.replay_buffer import ReplayBufferError

    from .evolve_config import RESUMABLE
    from .runs import RunError
    from .se_darwin_agent import SEDarwinAgent

    if baseline == Baseline.cma:
        raise fail("--resume continues a run with its own options; leave --baseline out")
    options = {k: v for k, v in given.items() if k not in RESUMABLE}
    try:
        return SEDarwinAgent.resume(
            run_id,
            settings=settings,
            budget=given.get("budget"),
            budget_steps=given.get("budget_steps"),
            workers=given.get("workers"),
            backend=given.get("backend"),
            options=options,
            started=started,
        )
    except (RunError, ValueError, ReplayBufferError) as exc:
        raise fail(str(exc))


def register(app: typer.Typer) -> None:
    app.command("evolve")(evolve)

"""``genesis-fp16 evolve``: the evolution loop on a task (Pendulum-v1 by default)."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
from contextlib import ExitStack, contextmanager
from enum import Enum
from pathlib import Path
from typing import Any, Iterator, Optional

import typer

from genesis_fp16.settings import PrecisionMode

from .tasks.pendulum import N_TRAIN_STARTS

MIN_BUDGET = N_TRAIN_STARTS  # EvolveConfig.validate: one full evaluation, every training start state


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


def _safe_data(agent: Any) -> str:
    """What of a failed run is kept, for its error message: the generations
    committed to its manifest, which a resume continues after (the replay
    rows of a generation cut off before its commit are discarded then)."""
    if agent is None:
        return ""
    generations, episodes = agent.committed()
    return (
        f"; {generations} generation(s) ({episodes} real episodes) are committed, their data safe in {agent.buffer.path}, "
        f"and every checkpoint written before is whole (atomic writes); `genesis-fp16 evolve --resume {agent.run_id}` continues after them"
    )


def _positive(value: float) -> float:
    """A step size: a finite number > 0 (typer's ranges take neither an open bound nor NaN)."""
    if not (value > 0 and value != float("inf")):
        raise typer.BadParameter(f"{value}: expected a finite number > 0")
    return value


def _list_tasks(value: bool) -> None:
    """--list-tasks: the registered task names, then exit."""
    if not value:
        return
    from genesis_fp16.cli import fail, safe_text
    from genesis_fp16.extras import require

    from .evolve_config import EVOLVE
    from .tasks import TaskError, task_names

    require("gymnasium", EVOLVE)
    try:
        names = task_names()
    except TaskError as exc:
        raise fail(str(exc))
    for name, description in names.items():
        typer.echo(safe_text(f"{name:<28} {description}"))
    typer.echo("any other gymnasium id with a flat Box observation and a Box action works too (--target R where its spec has no reward_threshold)")
    raise typer.Exit(0)


def evolve(
    ctx: typer.Context,
    env: str = typer.Option(
        "Pendulum-v1", "--env", help="Task name (--list-tasks) or any gymnasium id with Box observations and actions."
    ),
    target: Optional[float] = typer.Option(
        None, "--target", help="Mean training return that counts as solved; default: the task's, else the env spec's reward_threshold."
    ),
    policy: Optional[str] = typer.Option(None, "--policy", help="Policy family: linear or mlp:H (e.g. mlp:8); default: the task's."),
    episode_steps: Optional[int] = typer.Option(
        None, "--episode-steps", min=1, help="Steps per real episode; default: the task's, else the env spec's max_episode_steps."
    ),
    list_tasks: bool = typer.Option(False, "--list-tasks", is_eager=True, callback=_list_tasks, help="List the registered tasks and exit."),
    budget: int = typer.Option(
        200, "--budget", min=MIN_BUDGET, help=f"Real episodes the search may spend (at least {MIN_BUDGET}: one full evaluation)."
    ),
    budget_steps: Optional[int] = typer.Option(
        None, "--budget-steps", min=1, help="Real env steps the search may spend, beside --budget (default: no limit).",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed: start states, initial policies, model init."),
    precision: Optional[PrecisionMode] = typer.Option(
        None, "--precision", help="World-model training precision; default: settings and the world_model profile."
    ),
    baseline: Baseline = typer.Option(Baseline.none, "--baseline", help="cma: plain CMA-ES on real returns instead of the loop."),
    no_world_model: bool = typer.Option(False, "--no-world-model", help="Ablation: the same loop without the world model."),
    racing: bool = typer.Option(True, "--racing/--no-racing", help="Race real evaluations: stop a candidate that can no longer win."),
    kappa: float = typer.Option(1.0, "--kappa", min=0.0, help="Pessimism: a candidate's imagined score is mean - kappa * spread."),
    trust_spearman: float = typer.Option(
        0.3, "--trust-spearman", min=-1.0, max=1.0, help="The model's proposals get real episodes while the rank correlation of its "
        "imagined against the real returns of the last audited candidates is at least this; below it, CMA-ES on one-episode probes.",
    ),
    probe_sigma: float = typer.Option(0.5, "--probe-sigma", callback=_positive, help="Initial CMA-ES step size of the probe "
                                      "search, in normalised coordinates."),
    probe_screen: int = typer.Option(4, "--probe-screen", min=1, help="While the model's rank correlation is positive, CMA-ES samples "
                                     "this many populations per probe round and the model picks the one that runs; 1: no screening."),
    no_probe_search: bool = typer.Option(False, "--no-probe-search", help="Always give the model's proposals the real episodes "
                                         "(the loop before probe search)."),
    particles: Optional[int] = typer.Option(None, "--particles", min=1, help="Imagined rollouts per candidate and start state "
                                            "(default: the world model's)."),
    imagine_starts: int = typer.Option(8, "--imagine-starts", min=1, help="Start states the search imagines from per generation."),
    ensemble: int = typer.Option(5, "--ensemble", min=1, help="World-model ensemble members; 1: one deterministic network."),
    horizon: Optional[int] = typer.Option(
        None, "--horizon", min=1, help="Imagined steps per rollout, at most the episode (default: 200, or the episode where shorter); "
        "the rest of the episode is extrapolated.",
    ),
    workers: int = typer.Option(2, "--workers", min=1, help="Worker processes for real episodes (with --backend ray: tasks per candidate)."),
    backend: Backend = typer.Option(
        Backend.process, "--backend", help="Where real episodes run: process (a local pool) or ray (a Ray cluster; the ray extra)."
    ),
    ray_address: Optional[str] = typer.Option(
        None, "--ray-address", metavar="auto|HOST:PORT",
        help="With --backend ray: the cluster to join (default: settings' ray_address, read with --backend ray only); "
        "unset: a local Ray with --workers CPUs.",
    ),
    torch_threads: Optional[int] = typer.Option(
        None, "--torch-threads", min=0, max=4096,
        help="torch CPU threads (default: settings' torch_threads, 1: the models are small; 0: torch's default).",
    ),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the report as JSON to this file."),
    plot: Optional[Path] = typer.Option(
        None, "--plot", help="Draw the learning curves (return against real episodes and env steps, target, world-model loss) as PNG here.",
    ),
    tensorboard: Optional[Path] = typer.Option(
        None, "--tensorboard", metavar="DIR",
        help="Write TensorBoard scalars (loss scale, overflow rate, losses, FP32 gaps, verdicts) here; default: settings' tensorboard_dir.",
    ),
    resume: Optional[str] = typer.Option(
        None, "--resume", metavar="RUN_ID",
        help="Continue an interrupted run (ids: genesis-fp16 state list) with its own options; --budget and --budget-steps may change.",
    ),
) -> None:
    """Evolve a policy for a task: the SE-Darwin loop with an FP16/BF16 world model (or a baseline)."""
    from genesis_fp16.extras import require
    from genesis_fp16.cli import fail, load_settings_or_exit
    from genesis_fp16.settings import env_name
    from genesis_fp16.storage import StorageError, check_output_path, prepare_dir
    from genesis_fp16.tensorboard_sink import check_available

    from .evolve_config import EVOLVE
    from .se_darwin_agent import EvolveConfig

    settings = load_settings_or_exit()
    if torch_threads is not None:  # the flag wins over GENESIS_FP16_TORCH_THREADS for this run
        settings = settings.model_copy(update={"torch_threads": torch_threads})
    if baseline == Baseline.cma and no_world_model:
        raise fail("--baseline cma and --no-world-model are exclusive: CMA-ES never uses the world model")
    # the options a resumed run must match (or may change: budgets, workers, backend), by flag name
    given = dict(env=env, seed=seed, precision=precision, no_world_model=no_world_model, budget=budget, budget_steps=budget_steps,
                 workers=workers, backend=backend, target=target, policy=policy, episode_steps=episode_steps, racing=racing, kappa=kappa,
                 particles=particles, imagine_starts=imagine_starts, ensemble=ensemble, horizon=horizon, trust_spearman=trust_spearman,
                 probe_sigma=probe_sigma, probe_screen=probe_screen, no_probe_search=no_probe_search)
    config = EvolveConfig(
        env_id=env, budget=budget, budget_steps=budget_steps, seed=seed, precision=precision.value if precision is not None else None,
        use_world_model=not no_world_model, workers=workers, backend=backend.value, target=target, policy=policy,
        episode_steps=episode_steps, racing=racing, kappa=kappa, particles=particles, imagine_starts=imagine_starts, ensemble=ensemble,
        trust_spearman=None if no_probe_search else trust_spearman, probe_sigma=probe_sigma, probe_screen=probe_screen,
        **({} if horizon is None else {"horizon": horizon}),  # not given: the config's default (DEFAULT_HORIZON, capped by the episode)
    )
    if plot is not None:  # first: cma warns on import when matplotlib is missing
        require("matplotlib", f"{EVOLVE} --plot")
    tensorboard = tensorboard if tensorboard is not None else settings.tensorboard_dir
    if tensorboard is not None:
        check_available()
    require("gymnasium", EVOLVE)  # before any output: a missing extra is one error line
    if baseline == Baseline.cma or not no_world_model:
        require("cma", EVOLVE)
    try:
        if resume is None:
            config = config.resolve()[0]  # the task checked (env id, spaces, target) before any output
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

    runs_on = _backend_of_run(ctx, backend, resume, Path(settings.state_dir))
    if ray_address is not None and runs_on != Backend.ray:
        raise fail(f"--ray-address {ray_address}: it applies to --backend ray only (this run uses --backend {runs_on.value}); "
                   "add --backend ray, or leave --ray-address out")
    # the setting is the default address of the Ray backend: a run on the process pool ignores it
    address = ray_address if ray_address is not None else settings.ray_address
    with ExitStack() as connected:
        if runs_on == Backend.ray:  # connected while the run lasts; a local Ray started here is shut down after it
            from .ray_evaluation import RayConnectError, ray_connection

            try:
                connected.enter_context(ray_connection(address, num_cpus=workers))
            except RayConnectError as exc:
                raise fail(str(exc))
        _run(ctx, config, settings, given, resume=resume, baseline=baseline, json_path=json_path, plot=plot, tensorboard=tensorboard)


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


def _run(ctx: typer.Context, config: Any, settings: Any, given: dict[str, Any], *, resume: Optional[str], baseline: Baseline,
         json_path: Optional[Path], plot: Optional[Path], tensorboard: Optional[Path]) -> None:
    """The run itself, once its options are checked; ``given``: the options by flag name."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table
    from rich.text import Text

    from genesis_fp16.checkpoint import CheckpointError, atomic_write_text
    from genesis_fp16.cli import console, fail, out, safe_cells, safe_text, strict_json_value
    from genesis_fp16.storage import StorageError, full_disk
    from genesis_fp16.tensorboard_sink import tensorboard_events

    from .evaluation import EvaluationError
    from .evolve_report import report_rows, return_set
    from .runs import RunStorageError
    from .se_darwin_agent import SEDarwinAgent, run_cma_baseline

    agent = None
    budget, seed, no_world_model = given["budget"], given["seed"], given["no_world_model"]
    if resume is not None:
        agent = _resumed_agent(ctx, resume, settings, baseline=baseline, **given)
        budget, seed, no_world_model = agent.config.budget, agent.config.seed, not agent.config.use_world_model

    mode = "cma" if baseline == Baseline.cma else ("no_world_model" if no_world_model else "full")
    progress = Progress(
        TextColumn(f"[bold]evolve[/] {mode} seed {seed}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("real episodes"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    task_id = progress.add_task("episodes", total=budget)

    def on_generation(record: dict[str, Any]) -> None:
        progress.update(task_id, completed=min(record["real_episodes"], budget))
        # a raced candidate stopped early shows the episodes it got
        probes = [e for e in record.get("evaluated", []) if e.get("operator") == "probe"]
        ops = ",".join([f"{len(probes)} probes (1 ep)"] * bool(probes) + [
            e["operator"] + ("" if e.get("full", True) else f"({e['episodes']} ep)")
            for e in record.get("evaluated", []) if e.get("operator") not in ("seed", "probe")]) or "-"
        rho = (record.get("imagination") or {}).get("spearman")
        ops += f" rho {rho:.2f}" if rho is not None else ""
        # a probe's one episode and a full evaluation's mean are not comparable: say which one "best" is
        measured = f" ({return_set(record['best_full'], record['best_episodes'])})" if record["best_return"] is not None else ""
        progress.console.print(
            safe_text(f"gen {record['generation']:>2} episodes {record['real_episodes']:>4} best {_fmt(record['best_return'])}{measured}"
                      f" wm_val {_fmt(record.get('wm_val_loss'), '.5f')} {record.get('precision')} {ops}"),
            highlight=False,
        )

    try:
        with _sigterm_as_interrupt(), tensorboard_events(tensorboard), progress:
            if baseline == Baseline.cma:
                report = asyncio.run(run_cma_baseline(config, on_generation=on_generation, settings=settings))
            else:
                if agent is None:
                    agent = SEDarwinAgent(config, settings=settings, on_generation=on_generation)
                agent.on_generation = on_generation
                progress.update(task_id, completed=min(agent.real_episodes, budget))
                report = asyncio.run(agent.evolve())
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM as Terminated
        if agent is not None:
            generations, episodes = agent.committed()
            console.print(
                Text.assemble(("interrupted", "yellow"), safe_text(
                    f": {generations} generation(s) ({episodes} real episodes) are committed, their data safe "
                    f"in {agent.buffer.path} (agent {agent.data_agent!r})")),
                highlight=False,
            )
            console.print(safe_text(f"continue it with: genesis-fp16 evolve --resume {agent.run_id}"), highlight=False)
        raise typer.Exit(EXIT_SIGTERM if isinstance(exc, Terminated) else EXIT_SIGINT)
    except ValueError as exc:
        raise fail(str(exc))
    except StorageError as exc:  # the replay buffer or the ledger (ReplayBufferError, LedgerError): state dir, corrupt file, full disk
        if agent is not None:
            agent.evaluator.terminate()
        raise fail(f"{exc}{_safe_data(agent)}", code=exc.exit_code)
    except (CheckpointError, RunStorageError) as exc:  # a world-model checkpoint or the run manifest could not be written
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
    if json_path is not None:
        # strict JSON: a candidate lost to a timeout scores -inf, written as "-inf"
        try:
            atomic_write_text(json_path, json.dumps(strict_json_value(report), indent=2, default=str, allow_nan=False) + "\n")
        except OSError as exc:  # e.g. the disk filled during the run: the table above is the report
            raise fail(f"--json {json_path}: the report could not be written ({exc}); the run's data is in {report.get('replay_db') or 'the table above'}", code=1)
        console.print(safe_text(f"report written to {json_path}"), highlight=False)
    if plot is not None:
        from .evolve_config import EVOLVE
        from .plots import evolve_figure, write_png

        try:
            write_png(evolve_figure(report), plot, f"{EVOLVE} --plot")
        except OSError as exc:
            raise fail(f"--plot {plot}: the figure could not be written ({exc}); the report is in the table above", code=1)
        console.print(safe_text(f"plot written to {plot}"), highlight=False)
    if report["stop_reason"] == "failed":  # after the report: it says which candidates failed and why
        raise fail(report["stop_detail"], code=1)


def _resumed_agent(ctx: typer.Context, run_id: str, settings: Any, *, baseline: Baseline, **given: Any) -> Any:
    """The run ``run_id`` ready to continue; an option given on the command
    line must match the run's own (the budgets, workers and backend may change)."""
    from genesis_fp16.cli import fail

    from infrastructure.replay_buffer import ReplayBufferError

    from .runs import RunError
    from .se_darwin_agent import SEDarwinAgent

    if baseline == Baseline.cma:
        raise fail("--resume continues an SE-Darwin run; a --baseline cma run keeps no state to resume")
    explicit = {name: value for name, value in given.items() if ctx.get_parameter_source(name).name != "DEFAULT"}
    backend = explicit.get("backend")
    as_config = {"env": "env_id", "seed": "seed", "precision": "precision", "no_world_model": "use_world_model", "target": "target",
                 "policy": "policy", "episode_steps": "episode_steps", "racing": "racing", "kappa": "kappa", "particles": "particles",
                 "imagine_starts": "imagine_starts", "ensemble": "ensemble", "horizon": "horizon", "trust_spearman": "trust_spearman",
                 "probe_sigma": "probe_sigma", "probe_screen": "probe_screen"}
    options = {as_config[k]: v for k, v in explicit.items() if k in as_config}
    if explicit.get("no_probe_search"):
        options["trust_spearman"] = None
    if "precision" in options:
        options["precision"] = options["precision"].value
    if "use_world_model" in options:
        options["use_world_model"] = not options["use_world_model"]
    try:
        return SEDarwinAgent.resume(run_id, settings=settings, budget=explicit.get("budget"), budget_steps=explicit.get("budget_steps"),
                                    workers=explicit.get("workers"),
                                    backend=backend.value if backend is not None else None, options=options)
    except (RunError, ValueError, ReplayBufferError) as exc:
        raise fail(str(exc))


def register(app: typer.Typer) -> None:
    app.command("evolve")(evolve)

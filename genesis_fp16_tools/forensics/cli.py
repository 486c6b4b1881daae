"""``genesis-fp16 forensics``: pretrain, probe, freeze, replay, sweep, analyze."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import typer

forensics_app = typer.Typer(
    help="RLHF precision forensics (H1 KL collapse, H2 reward quantization, H3 value stagnation, H4 reference drift).",
    no_args_is_help=True,
)

EXTRA = {"allow_extra_args": True}


def register(app: typer.Typer) -> None:
    app.add_typer(forensics_app, name="forensics")


def _settings():
    from genesis_fp16.cli import load_settings_or_exit

    return load_settings_or_exit()


def _progress():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        transient=False,
    )


def _assets(pretrain_steps: Optional[int] = None, force: bool = False):
    from genesis_fp16.training.checkpoint import CheckpointError
    from genesis_fp16.cli import fail
    from genesis_fp16.base.settings import env_name
    from genesis_fp16.base.storage import StorageError, fault_kind, full_disk, prepare_dir
    from genesis_fp16_tools.forensics import pretrain

    spec = pretrain.PretrainSpec() if pretrain_steps is None else pretrain.PretrainSpec(steps=pretrain_steps)
    state_dir = Path(_settings().state_dir)
    path = pretrain.assets_path(state_dir, spec)
    try:  # building writes the checkpoint: check where it goes before pretraining, not after
        prepare_dir(state_dir, name=env_name("state_dir"), create=False, writable=force or not path.exists())
    except StorageError as exc:
        raise fail(str(exc), code=exc.exit_code)
    try:
        with _progress() as bar:
            task = bar.add_task("initial FP32 checkpoint", total=None)

            def tick(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            assets = pretrain.ensure_assets(state_dir, spec, force=force, progress=tick)
            bar.update(task, completed=1, total=1)
    except CheckpointError as exc:  # a corrupt cached checkpoint (says --force), or one that could not be written
        if fault_kind(exc) is None:
            raise fail(str(exc))
        raise fail(("the disk is full: " if full_disk(path, exc) else "") + str(exc), code=1)
    return assets


DEVICE_HELP = "Where the models run: cpu, cuda or cuda:N (data, sampling and the FP64 metrics stay on the CPU)."


def _device(text: str):
    """``cpu``, ``cuda`` or ``cuda:N`` as a ``torch.device``; anything else,
    or a CUDA device this machine lacks, is one error (exit 2)."""
    import re

    import torch

    from genesis_fp16.cli import fail

    match = re.fullmatch(r"cpu|cuda(?::(\d+))?", text.strip().lower())
    if match is None:
        raise fail(f"--device {text}: expected cpu, cuda or cuda[:N] (e.g. --device cuda:0)")
    device = torch.device(match.group(0))
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise fail(
                f"--device {text}: no CUDA device is available on this machine (torch {torch.__version__}); use "
                "--device cpu or run on a GPU host"
            )
        count = torch.cuda.device_count()
        if (device.index or 0) >= count:
            raise fail(f"--device {text}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    return device


def _device_meta(meta: dict, device) -> dict:
    """The run's device (and GPU name) in its metadata."""
    import torch

    meta["device"] = str(device)
    if device.type == "cuda":
        meta["gpu"] = torch.cuda.get_device_name(device)
    return meta


def _check_outputs(**paths: Optional[Path]) -> None:
    """Check every output path before any work (a bad --json must not lose a
    long run); ``out_dir`` is a directory, the others are files."""
    from genesis_fp16.cli import fail
    from genesis_fp16.base.storage import StorageError, check_output_path

    try:
        for key, path in paths.items():
            if path is not None:
                flag = "--" + key.replace("_dir", "").replace("_", "-")
                check_output_path(path, flag, directory=key.endswith("_dir"))
    except StorageError as exc:
        raise fail(str(exc))


def _positive(flag: str, value: Optional[float], meaning: str) -> None:
    """Refuse a count or a scale that is not a finite number > 0, in one line."""
    from genesis_fp16.cli import fail

    if value is not None and not (math.isfinite(value) and value > 0):
        kind = "an integer" if isinstance(value, int) else "a finite number"
        raise fail(f"{flag} {value:g}: expected {kind} > 0 ({meaning})")


def _configs(text: Optional[str]):
    from genesis_fp16.cli import fail
    from genesis_fp16_tools.forensics.configs import parse_configs

    try:
        return parse_configs(text)
    except ValueError as exc:
        raise fail(str(exc))


def _write_json(path: Optional[Path], data: dict) -> None:
    from genesis_fp16.base.storage import atomic_write_text
    from genesis_fp16.cli import console, print_json, safe_text

    if path is None:
        print_json(data)
    else:
        atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True, default=str))
        console.print(safe_text(f"wrote {path}"))


def _floats(flag: str, text: str, meaning: str) -> list[float]:
    """A comma-separated list of finite numbers > 0, or one error line."""
    from genesis_fp16.cli import fail

    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise fail(f"{flag} {text}: expected a comma-separated list of finite numbers > 0 ({meaning})")
    return values


def _lengths(first: str, extra: list[str]) -> list[int]:
    from genesis_fp16.cli import fail

    parts = [p for chunk in [first, *extra] for p in chunk.replace(",", " ").split()]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise fail(f"--seq-lengths takes integers (e.g. --seq-lengths 32 64), got {' '.join(parts)!r}")
    if not values or any(v <= 0 for v in values):
        raise fail(f"--seq-lengths needs positive integers, got {values}")
    return values


def _print_rows(rows: list[dict], columns: list[str], json_out: Optional[Path]) -> None:
    """The rows as a table: on stdout, the result, when the JSON goes to a
    file; on stderr when the JSON itself is printed, so stdout stays one JSON
    document a pipe can parse."""
    from genesis_fp16.cli import console, out, safe_cells
    from genesis_fp16.base.terminal import Table  # columns fold what does not fit instead of cutting it
    from genesis_fp16_tools.forensics.analyze import format_cell

    table = Table()
    for c in columns:
        table.add_column(c)
    for r in rows:
        table.add_row(*safe_cells(*[format_cell(r.get(c)) for c in columns]))
    (out if json_out is not None else console).print(table)


SHORT = [
    "config",
    "seq_len",
    "kl_fp64",
    "kl_penalty_mean",
    "kl_abs_err",
    "log_ratio_near_zero_frac",
    "reward_tie_rate",
    "reward_kendall_tau",
    "value_quant_step_median",
    "value_stagnation_rate",
    "accum_err_final",
    "accum_err_rounding_floor",
    "failure",
]


@forensics_app.command()
def pretrain(
    steps: Optional[int] = typer.Option(
        None, help="Pretraining steps (default 300; a different value is cached separately)."
    ),
    force: bool = typer.Option(False, help="Rebuild even if cached."),
    json_out: Optional[Path] = typer.Option(
        None, "--json", help="Write the checkpoint's metadata here (default: stdout)."
    ),
) -> None:
    """Train (or load) the shared FP32 initial checkpoint: reference, policy, reward, value."""
    from genesis_fp16_tools.forensics.pretrain import single_thread

    _positive("--steps", steps, "pretraining steps, default 300")
    _check_outputs(json=json_out)
    with single_thread():
        assets = _assets(steps, force)
    _write_json(json_out, {"path": str(assets.path), **assets.meta})


@forensics_app.command(context_settings=EXTRA)
def probe(
    ctx: typer.Context,
    configs: str = typer.Option("all", help="Comma-separated configurations, or 'all'."),
    num_prompts: int = typer.Option(8, min=2, help="Prompts (sequences) per length."),
    seq_lengths: str = typer.Option("32 64", help="Total sequence lengths: --seq-lengths 32 64 (or 32,64)."),
    seed: int = typer.Option(0),
    return_scale: float = typer.Option(1000.0, help="Magnitude of the returns the value model predicts (H3)."),
    device: str = typer.Option("cpu", help=DEVICE_HELP),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write {meta, rows} here (default: stdout)."),
) -> None:
    """Static KL probe: FP32-policy samples scored by each configuration against FP64."""
    from genesis_fp16.cli import fail
    from genesis_fp16_tools.forensics.pretrain import single_thread
    from genesis_fp16_tools.forensics.probe import probe as run_probe
    from genesis_fp16_tools.forensics.probe import run_meta

    dev = _device(device)
    _positive("--return-scale", return_scale, "the magnitude of the returns, default 1000")
    lengths = _lengths(seq_lengths, list(ctx.args))
    cfgs = _configs(configs)
    _check_outputs(json=json_out)
    with single_thread():
        assets = _assets().to(dev)
        with _progress() as bar:
            task = bar.add_task("probe", total=len(cfgs) * len(lengths))
            try:
                rows = run_probe(
                    assets, cfgs, num_prompts, tuple(lengths), seed, return_scale, progress=lambda _: bar.advance(task)
                )
            except ValueError as exc:
                raise fail(str(exc))
        meta = _device_meta(run_meta(_command_line(ctx)), dev)
    _print_rows(rows, SHORT, json_out)
    _write_json(json_out, {"meta": meta, "rows": rows})


@forensics_app.command()
def freeze(
    out: Path = typer.Option(..., help="Trajectory file to write (a weights-only torch payload)."),
    num_prompts: int = typer.Option(16, min=2),
    seq_len: int = typer.Option(96, min=10),
    seed: int = typer.Option(0),
    device: str = typer.Option("cpu", help=DEVICE_HELP),
    json_out: Optional[Path] = typer.Option(None, "--json"),
) -> None:
    """Sample FP32 policy trajectories and save them with their FP64 log-probs."""
    from genesis_fp16.cli import fail
    from genesis_fp16_tools.forensics.model import TinyConfig
    from genesis_fp16_tools.forensics.pretrain import single_thread
    from genesis_fp16_tools.forensics.replay import freeze as run_freeze

    dev = _device(device)
    if seq_len > TinyConfig().max_len:  # the cached models are built with the default config
        raise fail(f"--seq-len {seq_len}: the model takes at most {TinyConfig().max_len} tokens")
    _check_outputs(out=out, json=json_out)
    with single_thread():
        assets = _assets().to(dev)
        path = run_freeze(assets, out, num_prompts, seq_len, seed)
    _write_json(
        json_out, {"path": str(path), "num_prompts": num_prompts, "seq_len": seq_len, "seed": seed, "device": str(dev)}
    )


@forensics_app.command()
def replay(
    ctx: typer.Context,
    trajectories: Path = typer.Option(..., help="File written by `forensics freeze`."),
    configs: str = typer.Option("all"),
    return_scale: float = typer.Option(1000.0),
    device: str = typer.Option("cpu", help=DEVICE_HELP),
    json_out: Optional[Path] = typer.Option(
        None, "--json", help="Write {meta, rows} here (rows carry the mismatch curve)."
    ),
) -> None:
    """Re-score frozen trajectories under each configuration (policy != reference)."""
    from genesis_fp16.training.checkpoint import CheckpointError
    from genesis_fp16.cli import fail
    from genesis_fp16_tools.forensics.pretrain import single_thread
    from genesis_fp16_tools.forensics.probe import run_meta
    from genesis_fp16_tools.forensics.replay import load_trajectories
    from genesis_fp16_tools.forensics.replay import replay as run_replay

    dev = _device(device)
    _positive("--return-scale", return_scale, "the magnitude of the returns, default 1000")
    cfgs = _configs(configs)
    _check_outputs(json=json_out)
    try:
        truth = load_trajectories(trajectories)
    except (CheckpointError, ValueError, KeyError) as exc:
        raise fail(f"cannot replay {trajectories}: {exc}")
    with single_thread():
        assets = _assets().to(dev)
        try:
            rows = run_replay(assets, truth, cfgs, return_scale)
        except ValueError as exc:
            raise fail(f"cannot replay {trajectories}: {exc}")
        meta = _device_meta(run_meta(_command_line(ctx)), dev)
    _print_rows(rows, SHORT, json_out)
    _write_json(json_out, {"meta": meta, "rows": rows})


@forensics_app.command()
def sweep(
    ctx: typer.Context,
    out: Optional[Path] = typer.Option(
        None, help="Results directory (default <state_dir>/forensics/sweep); a rerun resumes it."
    ),
    configs: str = typer.Option("all"),
    seeds: int = typer.Option(2, min=1, help="Seeds 0..N-1 per configuration."),
    quick: bool = typer.Option(False, help="15 steps, 8 prompts, 24 generated tokens."),
    max_steps: Optional[int] = typer.Option(None, min=1, help="PPO steps per run (default 60, 15 with --quick)."),
    value_lrs: Optional[str] = typer.Option(
        None,
        help="Comma-separated value-model learning rates (e.g. 1e-5,1e-4,1e-3): every run once per lr, for H3's "
        "stagnation against the lr (default: one run at 1e-4).",
    ),
    device: str = typer.Option("cpu", help=DEVICE_HELP),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the per-configuration summary here."),
) -> None:
    """PPO with a KL penalty per configuration and seed; killed sweeps resume."""
    import dataclasses

    from genesis_fp16.cli import fail, safe_text
    from genesis_fp16_tools.forensics.analyze import sweep_table
    from genesis_fp16_tools.forensics.pretrain import single_thread
    from genesis_fp16_tools.forensics.probe import run_meta
    from genesis_fp16_tools.forensics.sweep import SweepArgs
    from genesis_fp16_tools.forensics.sweep import sweep as run_sweep

    dev = _device(device)
    cfgs = _configs(configs)
    lrs = (
        None
        if value_lrs is None
        else _floats("--value-lrs", value_lrs, "value-model learning rates, e.g. 1e-5,1e-4,1e-3")
    )
    args = SweepArgs.quick() if quick else SweepArgs()
    if max_steps is not None:
        args = dataclasses.replace(args, max_steps=max_steps)
    out = out or Path(_settings().state_dir) / "forensics" / "sweep"
    _check_outputs(out_dir=out, json=json_out)
    with single_thread():
        assets = _assets().to(dev)
        with _progress() as bar:
            runs = bar.add_task("runs", total=len(cfgs) * seeds * len(lrs or [None]))
            steps = bar.add_task("steps", total=args.max_steps)

            def on_run(name: str, status: str) -> None:
                bar.advance(runs)
                bar.update(steps, completed=0)
                bar.console.print(safe_text(f"{name}: {status}"))

            try:
                results = run_sweep(
                    assets,
                    cfgs,
                    list(range(seeds)),
                    out,
                    args,
                    meta=_device_meta(run_meta(_command_line(ctx)), dev),
                    on_run=on_run,
                    on_step=lambda n: bar.update(steps, completed=n),
                    value_lrs=lrs,
                )
            except ValueError as exc:
                raise fail(str(exc))
    table = sweep_table(results)
    _print_rows(table, list(table[0].keys()), json_out)
    _write_json(json_out, {"out": str(out), "runs": len(results), "table": table})


@forensics_app.command()
def analyze(
    results: Path = typer.Argument(..., help="A sweep --out directory (probe.json / replay.json in it are included)."),
    json_out: Optional[Path] = typer.Option(None, "--json"),
) -> None:
    """PNG plots and report.md from a results directory."""
    from genesis_fp16.cli import console, fail, safe_text
    from genesis_fp16_tools.forensics.analyze import analyze as run_analyze

    _check_outputs(json=json_out)
    try:
        summary = run_analyze(results)
    except ValueError as exc:
        raise fail(str(exc))
    console.print(safe_text(f"report: {summary['report']}"))
    _write_json(json_out, summary)


def _command_line(ctx: typer.Context) -> str:
    import sys

    return (
        "genesis-fp16 " + " ".join(sys.argv[1:])
        if sys.argv and "genesis-fp16" in sys.argv[0]
        else f"genesis-fp16 forensics {ctx.command.name}"
    )

"""``genesis-fp16 ppo``: train PPO with the training-speed optimizations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    app.command("ppo")(ppo)


def ppo(
    env: Optional[str] = typer.Option(
        None, "--env", help="gymnasium env id (CartPole-v1, Pendulum-v1, HalfCheetah-v5, ...)."
    ),
    config: Optional[Path] = typer.Option(
        None, "--config", help="YAML config (default: configs/base.yaml when present)."
    ),
    set_: list[str] = typer.Option(
        [], "--set", help="Override a config key: --set optimizations.precision=bf16 (repeatable)."
    ),
    total_steps: Optional[int] = typer.Option(None, "--total-steps", help="Environment steps to train for."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Random seed."),
    json_path: Optional[Path] = typer.Option(
        None, "--json", help="Write results (throughput, eval return, time split) here."
    ),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", help="Save the final trainer checkpoint here."),
    plot: Optional[Path] = typer.Option(
        None,
        "--plot",
        help="Draw return against env steps (training, final evaluation, the env's reward_threshold) as PNG here.",
    ),
    tensorboard: Optional[Path] = typer.Option(
        None,
        "--tensorboard",
        metavar="DIR",
        help="Write TensorBoard scalars (losses, return, loss scale, overflow rate, verdicts) here; default: "
        "settings' tensorboard_dir.",
    ),
) -> None:
    """Train PPO: prints the optimization summary, progress (env steps/s, mean return) and a 20-episode deterministic
    evaluation."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.text import Text

    from genesis_fp16.training.checkpoint import CheckpointError
    from genesis_fp16.base.storage import atomic_write_text
    from genesis_fp16.base.terminal import Table  # columns fold what does not fit instead of cutting it
    from genesis_fp16.cli import console, fail, load_settings_or_exit, out, safe_cells, safe_text
    from genesis_fp16.base.extras import require
    from genesis_fp16.base.storage import StorageError, check_output_path
    from genesis_fp16.base.tensorboard_sink import check_available, tensorboard_events
    from .config import ConfigError, load_config
    from .ppo import PPO

    settings = load_settings_or_exit()
    tensorboard = tensorboard if tensorboard is not None else settings.tensorboard_dir
    try:  # before training: a bad output path must not lose the run
        for flag, path in (("--checkpoint", checkpoint), ("--json", json_path), ("--plot", plot)):
            if path is not None:
                check_output_path(path, flag)
        if tensorboard is not None:
            check_output_path(tensorboard, "--tensorboard", directory=True)
    except StorageError as exc:
        raise fail(str(exc))
    if plot is not None:  # a missing extra is one line, before any training
        require("matplotlib", "genesis-fp16 ppo --plot")
    if tensorboard is not None:
        check_available()
    if config is None and Path("configs/base.yaml").exists():
        config = Path("configs/base.yaml")
    if config is not None and not config.exists():
        raise fail(f"--config {config}: file not found (expected a YAML file with a 'training:' section)")
    try:
        cfg = load_config(config, set_, env_id=env, total_steps=total_steps, seed=seed)
    except ConfigError as exc:
        raise fail(str(exc))
    note = cfg.steps_note()
    if note is not None:  # before training, not discovered in the result
        console.print(Text.assemble(("note:", "yellow"), " ", safe_text(note)), soft_wrap=True)
    try:
        learner = PPO(cfg)
    except ValueError as exc:
        raise fail(str(exc))
    except Exception as exc:  # gymnasium's unknown-env / missing-dependency errors
        if type(exc).__name__ in (
            "NameNotFound",
            "NamespaceNotFound",
            "VersionNotFound",
            "DependencyNotInstalled",
            "Error",
        ):
            raise fail(f"--env {cfg.env_id}: {exc}")
        raise
    table = Table(title=safe_text(f"PPO {cfg.env_id}: optimizations"), show_header=True)
    table.add_column("optimization")
    table.add_column("state")
    for name, state in learner.optimization_summary():
        table.add_row(*safe_cells(name, state))
    console.print(table)
    try:
        with (
            tensorboard_events(tensorboard),
            Progress(
                TextColumn("[bold]ppo[/]"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total} steps"),
                TextColumn("{task.fields[sps]} steps/s"),
                TextColumn("return {task.fields[ret]}"),
                TimeElapsedColumn(),
                console=console,
                transient=False,
            ) as progress,
        ):
            task = progress.add_task("train", total=cfg.steps_to_run, sps="-", ret="-")

            def on_iteration(rec: dict) -> None:
                ret = rec["mean_return"]
                progress.update(
                    task,
                    completed=rec["global_step"],
                    sps=f"{rec['env_steps_per_s']:,.0f}",
                    ret="-" if ret is None else f"{ret:.1f}",
                )

            result = learner.train(on_iteration)
        if cfg.eval_episodes:
            result.eval_returns = learner.evaluate()
            result.eval_return = sum(result.eval_returns) / len(result.eval_returns)
        if checkpoint is not None:
            try:
                learner.save_checkpoint(checkpoint)
            except CheckpointError as exc:  # e.g. the disk filled during training
                raise fail(f"--checkpoint: {exc}", code=1)
    finally:
        learner.close()
    split = result.time_split_s
    total = sum(split.values()) or 1.0
    # the result, on stdout like every command's; progress and notes above went to stderr
    summary = Table(title=safe_text(f"PPO {cfg.env_id}, seed {cfg.seed}: result"))
    summary.add_column("metric")
    summary.add_column("value")
    rows = [
        (
            "env steps trained",
            f"{result.env_steps:,}" + (f" (asked {cfg.total_steps:,})" if result.env_steps != cfg.total_steps else ""),
        ),
        ("rollouts", f"{result.iterations} of {cfg.num_envs} envs x {cfg.num_steps} steps each"),
        ("wall time (s)", f"{result.wall_s:.1f}"),
        ("env steps/s", f"{result.env_steps_per_s:,.0f}"),
        ("time split", ", ".join(f"{k} {v:.1f} s ({100 * v / total:.0f}%)" for k, v in split.items())),
    ]
    if result.eval_return is not None:
        rows.append(
            (f"evaluation return ({len(result.eval_returns)} deterministic episodes)", f"{result.eval_return:.1f}")
        )
    for name, value in rows:
        summary.add_row(*safe_cells(name, value))
    out.print(summary)
    if json_path is not None:
        data = result.as_dict()
        data["total_steps_asked"] = cfg.total_steps
        data["env_stepping_s"], data["inference_s"], data["update_s"] = (
            split["env"],
            split["inference"],
            split["update"],
        )
        try:
            atomic_write_text(json_path, json.dumps(data, indent=2, default=str))
        except OSError as exc:  # e.g. the disk filled during training; the summary above stands
            raise fail(f"--json {json_path}: could not write the results ({exc})", code=1)
        console.print(safe_text(f"wrote {json_path}"))
    if plot is not None:
        from ..plots import ppo_figure, write_png

        figure = ppo_figure(result.as_dict(), _reward_threshold(cfg.env_id), "reward_threshold (env spec)")
        try:
            write_png(figure, plot, "genesis-fp16 ppo --plot")
        except OSError as exc:
            raise fail(f"--plot {plot}: could not write the figure ({exc}); the summary above stands", code=1)
        console.print(safe_text(f"wrote {plot}"))


def _reward_threshold(env_id: str) -> Optional[float]:
    """The env spec's "solved" return, the line a PPO curve is read against (PPO's config has no target)."""
    import gymnasium

    try:
        return gymnasium.spec(env_id).reward_threshold
    except gymnasium.error.Error:  # an id the envs module resolved another way
        return None

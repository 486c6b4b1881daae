"""``genesis-fp16 eval``: run an evolved policy file (`agents.policies`) on real
episodes and print the mean and spread of its returns; ``--video`` records an
episode where the env renders."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer


def evaluate_policy(
    policy: Path = typer.Option(
        ...,
        "--policy",
        metavar="FILE",
        help="The policy file a run wrote (genesis-fp16 evolve prints its path: <state_dir>/runs/<run>/policy.json).",
    ),
    env: Optional[str] = typer.Option(
        None, "--env", metavar="ID", help="Run on this task or gymnasium id (same spaces); default: the policy's own."
    ),
    episodes: Optional[int] = typer.Option(
        None,
        "--episodes",
        metavar="N",
        help="Episodes, one per start state (1..100000); default: as many as the run's held-out start states (20).",
    ),
    seed: Optional[int] = typer.Option(
        None,
        "--seed",
        metavar="S",
        help="The held-out start states of a run of this seed; default: the run's own (its report's held-out mean).",
    ),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the returns as JSON to this file."),
    video: Optional[Path] = typer.Option(
        None,
        "--video",
        metavar="FILE",
        help="Record the first episode to this file (.gif; .mp4 with imageio-ffmpeg) where the env renders.",
    ),
) -> None:
    """Run an evolved policy file: the mean and spread of its returns, by default on its run's held-out start states."""
    from genesis_fp16.base.extras import require
    from genesis_fp16.base.storage import StorageError, atomic_write_text, check_output_path
    from genesis_fp16.base.terminal import Table
    from genesis_fp16.cli import console, fail, out, safe_cells, safe_text, strict_json_value

    from .policies import MAX_EPISODES, PolicyError, load_policy
    from .tasks import EnvFailure, TaskError

    require("gymnasium", "genesis-fp16 eval")  # a missing extra is one error line, before any output
    if episodes is not None and not 1 <= episodes <= MAX_EPISODES:
        raise fail(f"--episodes {episodes}: expected 1..{MAX_EPISODES} (one episode per start state)")
    if seed is not None and seed < 0:
        raise fail(f"--seed {seed}: expected a whole number >= 0 (the seed of a run whose held-out states to use)")
    try:
        for path, flag in ((json_path, "--json"), (video, "--video")):
            if path is not None:
                check_output_path(path, flag)
        loaded = load_policy(policy)
        result = loaded.evaluate(env, episodes, seed)
    except (PolicyError, TaskError) as exc:
        raise fail(str(exc))
    except StorageError as exc:
        raise fail(str(exc), code=exc.exit_code)
    except EnvFailure as exc:
        raise fail(f"{loaded.name}: {exc}", code=1)

    run = loaded.run
    table = Table(
        title=safe_text(f"eval: {loaded.spec.name} policy of run {run.get('run_id', '?')} on {result.env_id}")
    )
    table.add_column("metric")
    table.add_column("value")
    rows = [
        ("episodes", f"{len(result.returns)} on {result.start_states}"),
        ("mean return", f"{result.mean_return:.6f}"),
        ("std", f"{result.std_return:.6f}"),
        ("min", f"{result.min_return:.6f}"),
        ("max", f"{result.max_return:.6f}"),
    ]
    heldout = loaded.returns.get("heldout")
    if isinstance(heldout, (int, float)):
        rows.append(("the run's held-out mean (its report)", f"{heldout:.6f}"))
    rows.append(("answer", f"{run.get('candidate', '?')} ({run.get('operator', '?')})"))
    for name, value in rows:
        table.add_row(*safe_cells(name, value))
    out.print(table)
    if json_path is not None:
        data = {
            "policy": str(policy),
            "run_id": run.get("run_id"),
            "candidate": run.get("candidate"),
            "operator": run.get("operator"),
            "run_heldout_return": heldout,
            **result.as_dict(),
        }
        try:
            atomic_write_text(json_path, json.dumps(strict_json_value(data), indent=2, allow_nan=False) + "\n")
        except OSError as exc:
            raise fail(f"--json {json_path}: the returns could not be written ({exc}); they are in the table above", 1)
        console.print(safe_text(f"returns written to {json_path}"), highlight=False)
    if video is not None:
        try:
            frames, episode_return = loaded.record_video(video, env, seed)
        except (PolicyError, EnvFailure) as exc:
            raise fail(f"--video {video}: {exc}", code=1)
        console.print(
            safe_text(f"video written to {video}: {frames} frames, one episode of return {episode_return:.6f}"),
            highlight=False,
        )


def register(app: typer.Typer) -> None:
    app.command("eval")(evaluate_policy)

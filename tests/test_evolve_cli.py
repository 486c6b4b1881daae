"""`genesis-fp16 evolve`: registration, bad input, a tiny run with --json,
the CMA-ES baseline, resume, and Ctrl-C or SIGTERM keeping the replay buffer."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from agents import evaluation, se_darwin_agent
from agents.evaluation import Evaluator
from genesis_fp16.cli import app

REPORT_KEYS = (
    "mode",
    "real_episodes",
    "env_steps",
    "heldout_return",
    "train_return",
    "target_reached",
    "learners",
    "wall_s",
    "generations",
    "time_share",
    "stop_reason",
    "stop_detail",
)
# tiny search budgets (the flags a user would pass): 6 candidates per generation, a few learner steps, no model rollouts
TINY = [
    "--popsize",
    "6",
    "--wm-steps",
    "40",
    "--ensemble",
    "2",
    "--refine-steps",
    "4",
    "--critic-updates",
    "0.02",
    "--model-rollouts",
    "0",
    "--eval-timeout-s",
    "60",
]
runner = CliRunner()


@pytest.fixture(autouse=True)
def _restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_entry_point_registers_evolve():
    exe = Path(sys.executable).with_name("genesis-fp16")
    import os

    out = subprocess.run(
        [str(exe), "evolve", "--help-all"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )  # flag names whole, not cut to fit 80 columns
    assert out.returncode == 0, out.stderr
    for flag in (
        "--env",
        "--budget",
        "--budget-steps",
        "--seed",
        "--precision",
        "--critic-precision",
        "--refined",
        "--baseline",
        "--json",
        "--resume",
        "--popsize",
        "--wm-steps",
    ):
        assert flag in out.stdout
    for removed in ("--kappa", "--particles", "--racing", "--probe-", "--imagine-starts", "--trust-spearman"):
        assert removed not in out.stdout


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--env", "CartPole-v1"], "action space Discrete(2)"),
        (["--env", "NoSuchEnv-v0"], "'NoSuchEnv-v0' cannot be made"),
        (["--env", "Walker2d-v5"], "pass --target R"),
        (["--policy", "rnn"], "expected one of linear, mlp:H"),
        (["--budget", "0"], "--budget"),
        (["--refined", "-1"], "--refined"),
        (["--popsize", "1"], "--popsize"),
        (["--episode-steps", "0"], "--episode-steps"),
        (["--precision", "fp8"], "fp8"),
        (["--critic-precision", "fp8"], "critic_precision='fp8'"),
        (
            ["--budget-steps", "100"],
            "budget_steps=100: expected at least one episode's worth (200 real env steps on Pendulum-v1)",
        ),
        (["--refined", "15"], "refined=15: expected fewer than the CMA-ES population (15)"),
        (["--no-critic"], "refinement needs the critic, or the world model with refine_horizon >= 1"),
        (["--sigma0", "0"], "sigma0=0.0: expected a finite number > 0"),
        (["--sigma0", "nan"], "sigma0=nan: expected a finite number > 0"),
        (["--critic-updates", "nan"], "critic_updates=nan"),
        (["--eval-timeout-s", "-1"], "eval_timeout_s=-1.0"),
        (["--backend", "gpu"], "backend='gpu': expected one of process, ray"),
        (["--kappa", "1"], "No such option"),  # the old loop's flags are gone
        (["--no-probe-search"], "No such option"),
    ],
)
def test_bad_input_one_clear_error(args, expected, state_dir):
    result = runner.invoke(app, ["evolve", *args], env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert expected in " ".join(result.output.split()), result.output
    assert "Traceback" not in result.output
    assert not (state_dir / "replay.sqlite").exists()  # refused before any episode


def test_budget_range_in_help_is_the_real_rule():
    import re

    result = runner.invoke(app, ["evolve", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    shown = re.search(r"--budget\s+(\d+)\.\.(\d+)\s", result.output)
    assert shown, result.output
    minimum, maximum = int(shown.group(1)), int(shown.group(2))
    for ok in (minimum, maximum):
        se_darwin_agent.EvolveConfig(budget=ok).validate()  # the range shown is accepted
    for bad in (minimum - 1, maximum + 1):
        with pytest.raises(ValueError, match=f"budget={bad}"):
            se_darwin_agent.EvolveConfig(budget=bad).resolve()
        refused = runner.invoke(app, ["evolve", "--budget", str(bad)])
        assert refused.exit_code == 2 and f"budget={bad} (--budget): expected {minimum}..{maximum}" in refused.output
        assert "Traceback" not in refused.output


def _main(argv, monkeypatch, capsys):
    """``genesis-fp16 ARGV`` through the CLI's own `main`, in this process: (exit code, stdout, stderr)."""
    from genesis_fp16.cli import main

    monkeypatch.setenv("COLUMNS", "300")
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    captured = capsys.readouterr()
    return exit_.value.code, captured.out, captured.err


@pytest.fixture
def no_agent(monkeypatch):
    """Fails the test if anything that allocates a run (the agent, CMA-ES, the learners, the replay buffer) is built."""
    from agents import cma_search, learners
    from infrastructure import replay_buffer

    def reached(*args, **kwargs):
        raise AssertionError("a refused option must stop the command before the run is built")

    for owner, name in (
        (se_darwin_agent.SEDarwinAgent, "__init__"),
        (cma_search.CMASearch, "__init__"),
        (learners.Learners, "__init__"),
        (replay_buffer.ReplayBuffer, "__init__"),
    ):
        monkeypatch.setattr(owner, name, reached)


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["--ensemble", "100000"],
            "ensemble=100000 (--ensemble): expected 1..64 (each member is a network trained, with its optimizer "
            "state, every generation); "
            "pass --ensemble 64 or less",
        ),
        (["--seed", "-1"], "seed=-1 (--seed): expected 0..4294967295; pass --seed 0 or more"),
        (["--seed", "99999999999999999999"], "seed=99999999999999999999 (--seed): expected 0..4294967295"),
        (
            ["--policy", "mlp:100000"],
            "policy mlp:100000 (--policy) on Pendulum-v1: 500,001 parameters (3 observations -> 1 actions); CMA-ES's "
            "covariance matrix "
            "would take 1.82 TiB (n_params^2 x 8 bytes), over the limit of 1 GiB (11,585 parameters); expected a "
            "smaller policy: "
            "--policy mlp:2316 at most",
        ),
        (["--popsize", "100000"], "popsize=100000 (--popsize): expected 2..1024"),
        (["--refined", "5000"], "refined=5000 (--refined): expected 0..1023"),
        (["--workers", "100000"], "workers=100000 (--workers): expected 1..1024"),
        (["--model-rollouts", "10000000"], "model_rollouts=10000000 (--model-rollouts): expected 0..65536"),
        (["--rollout-horizon", "100000"], "rollout_horizon=100000 (--rollout-horizon): expected 1..100"),
        (["--refine-horizon", "100000"], "refine_horizon=100000 (--refine-horizon): expected 0..100"),
        (["--episode-steps", "10000000000"], "episode_steps=10000000000 (--episode-steps): expected 1..1000000"),
        (["--budget", "10000000"], "budget=10000000 (--budget): expected 1..100000"),
        (
            ["--eval-memory-mb", "99999999999999999999"],
            "eval_memory_mb=99999999999999999999 (--eval-memory-mb): expected 1..1048576",
        ),
        (["--torch-threads", "100000"], "--torch-threads 100000: expected 0..4096"),
    ],
)
def test_options_that_size_memory_are_bounded_one_line_before_anything_is_built(
    args, expected, monkeypatch, capsys, no_agent, state_dir
):
    import time

    started = time.perf_counter()
    code, out, err = _main(["evolve", *args], monkeypatch, capsys)
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err  # one line
    assert expected in err, err
    assert (
        time.perf_counter() - started < 30
    )  # nothing was allocated or run (a covariance of 1.82 TiB, 100,000 members)
    assert not (state_dir / "replay.sqlite").exists() and not (state_dir / "runs").exists()


def test_bounds_apply_to_the_python_api_too():
    from agents.evolve_config import SEED_MAX, EvolveConfig

    EvolveConfig(seed=SEED_MAX, ensemble=64, popsize=1024, refined=1023).validate()
    with pytest.raises(ValueError) as err:
        EvolveConfig(seed=SEED_MAX + 1, ensemble=65, popsize=1025, refined=True).validate()
    for part in (
        f"seed={SEED_MAX + 1} (--seed)",
        "ensemble=65 (--ensemble)",
        "popsize=1025 (--popsize)",
        "refined=True (--refined): expected a whole number",
    ):  # every problem at once
        assert part in str(err.value)
    with pytest.raises(ValueError, match=r"11,585 parameters\); expected a smaller policy: --policy mlp:2316 at most"):
        EvolveConfig(policy="mlp:2317").resolve()
    EvolveConfig(policy="mlp:2316").resolve()  # the widest that fits is accepted


def test_help_groups_the_rarely_used_flags():
    result = runner.invoke(app, ["evolve", "--help-all"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    main, rare = result.output.split("Advanced", 1)
    for flag in ("--env", "--budget", "--seed", "--refined", "--json", "--help-all"):
        assert flag in main
    for flag in (
        "--popsize",
        "--sigma0",
        "--wm-steps",
        "--model-rollouts",
        "--eval-memory-mb",
        "--no-world-model",
        "--no-critic",
    ):
        assert flag in rare and flag not in main
    short = runner.invoke(app, ["evolve", "--help"], env={"COLUMNS": "200"}).output
    assert "--help-all" in short and "--popsize" not in short and "Advanced" not in short


def _evolve_options() -> list[str]:
    """Every flag `evolve` takes, from the command itself."""
    import typer.main

    command = typer.main.get_command(app).commands["evolve"]
    return sorted(opt for param in command.params for opt in (*param.opts, *param.secondary_opts))


def test_help_fits_one_screen_at_80_columns():
    """Issue 44: `evolve --help` was 178 lines at 80 columns. The common options fit one screen, nothing cut."""
    result = runner.invoke(app, ["evolve", "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.rstrip("\n").splitlines()
    assert len(lines) <= 50, result.output
    assert max(len(line) for line in lines) <= 80 and "…" not in result.output  # no flag name cut to fit
    for flag in (
        "--env",
        "--budget",
        "--seed",
        "--policy",
        "--precision",
        "--critic-precision",
        "--workers",
        "--resume",
        "--json",
        "--help-all",
    ):
        assert flag in result.output


def test_help_all_reaches_every_option():
    import re

    result = runner.invoke(app, ["evolve", "--help-all"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "…" not in result.output
    shown = set(re.findall(r"--[a-z0-9][a-z0-9-]*", result.output))
    options = _evolve_options()
    assert len(options) > 30 and set(options) <= shown, sorted(set(options) - shown)
    again = runner.invoke(
        app, ["evolve", "--help"], env={"COLUMNS": "80"}
    )  # --help-all hid the rare ones again after it
    assert len(again.output.splitlines()) <= 50 and "--popsize" not in again.output


def test_tiny_run_writes_json_report(tmp_path, state_dir):
    out = tmp_path / "report.json"
    result = runner.invoke(
        app,
        ["evolve", *TINY, "--budget", "24", "--seed", "1", "--precision", "bf16", "--workers", "1", "--json", str(out)],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    for key in REPORT_KEYS:
        assert key in report
    assert "precision" not in report and "imagination" not in report
    assert report["mode"] == "loop" and report["real_episodes"] == 24 and report["seed"] == 1
    assert report["env_steps"] == 24 * 200  # Pendulum's episodes run to the step limit
    assert report["learners"]["world_model"]["precision"] == "bf16"
    assert report["learners"]["world_model"]["agent"] == "world_model.Pendulum-v1"
    assert report["learners"]["critic"]["agent"] == "critic.Pendulum-v1"
    gens = report["generations"]
    # one episode per candidate: CMA-ES's 6 per generation, and from generation 1 the refined ones beside them
    assert [g["generation"] for g in gens][:2] == [0, 1] and gens[-1]["real_episodes"] == 24
    steps = [g["real_episodes"] for g in gens]
    assert [b - a for a, b in zip([0, *steps], steps)] == [len(g["candidates"]) for g in gens]
    assert isinstance(gens[0]["wm_val_loss"], float) and isinstance(gens[0]["critic_val_loss"], float)
    assert {c["operator"] for c in gens[0]["candidates"]} == {"cma"}  # nothing to refine with before any data
    assert any(c["operator"].startswith("refined:") for c in gens[1]["candidates"])
    assert "held-out" in result.stdout
    lines = [line for line in result.stderr.splitlines() if line.startswith("gen ")]
    assert len(lines) == 4 and lines[1].startswith("gen  1:   14 episodes,    2800 steps; best episode")
    assert (
        "(refined " in lines[1]
        and "model loss" in lines[0]
        and "critic loss" in lines[0]
        and "rho" not in result.stderr
    )
    assert (
        report["train_start_states"] == 16
        and report["stop_reason"] == "budget"
        and report["budget_exhausted"] == "episodes"
    )
    assert report["stop_detail"].startswith("budget spent: 24 of 24 real episodes used")
    assert (
        report["stop_detail"] in " ".join(result.stdout.replace("│", " ").split())
        or "budget spent: 24 of 24" in result.stdout
    )
    assert "best return, full (16 training start states)" in result.stdout
    assert "best return, held-out (20 held-out start states)" in result.stdout
    assert "world model precision" in result.stdout and "critic precision" in result.stdout
    assert Path(report["replay_db"]).is_file() and Path(report["replay_db"]).parent == state_dir


def test_quiet_shows_no_progress_and_json_is_the_same_report(tmp_path, state_dir):
    """``--quiet``: no bar, phase line or generation lines, only the report (and errors); ``--json`` writes the
    report as without it."""
    out = tmp_path / "report.json"
    args = ["evolve", *TINY, "--no-world-model", "--budget", "12", "--workers", "1", "--json", str(out)]
    quiet = runner.invoke(app, [*args, "--quiet"])
    assert quiet.exit_code == 0, quiet.output
    assert quiet.stderr.strip() == f"report written to {out}", quiet.stderr
    assert "real episodes" in quiet.stdout and "wall time" in quiet.stdout  # the table
    report = json.loads(out.read_text())
    loud = runner.invoke(app, args)
    assert loud.exit_code == 0, loud.output
    assert "gen  0:" in loud.stderr and "evolve no_model seed 0" in loud.stderr and "12/12 real episodes" in loud.stderr
    again = json.loads(out.read_text())
    assert report["real_episodes"] == again["real_episodes"] == 12 and set(report) == set(again)


def test_the_wall_time_is_the_commands_from_its_process_start(monkeypatch, tmp_path, state_dir, capsys):
    """Issue 54: MountainCarContinuous --budget 40 reported 3.9 s of a 28 s command. The program's wall time counts
    from its process's start (here, as if the process had started 20 s before: its imports, its settings, its task),
    and the split names that start-up."""
    import sys
    import time

    from genesis_fp16 import cli

    monkeypatch.setattr(cli, "_process_started", lambda: time.perf_counter() - 20.0)
    out = tmp_path / "report.json"
    argv = ["genesis-fp16", "evolve", *TINY, "--no-world-model", "--budget", "6", "--workers", "1", "--json", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    before = time.perf_counter()
    code, stdout, _ = _main(None, monkeypatch, capsys)  # the program as a shell runs it: main() reads sys.argv
    took = time.perf_counter() - before + 20.0
    assert code in (0, None), stdout
    report = json.loads(out.read_text())
    assert 20.0 <= report["wall_s"] <= took and report["time_share"]["start_up"] >= 20.0
    assert "start up 2" in " ".join(stdout.split())  # the table's split names it
    assert cli.command_started() is None  # a later command in this process starts its own clock


def test_search_and_budget_flags_reach_the_config(tmp_path, state_dir):
    out = tmp_path / "report.json"
    result = runner.invoke(
        app,
        [
            "evolve",
            *TINY,
            "--budget",
            "16",
            "--budget-steps",
            "2000",
            "--refined",
            "2",
            "--sigma0",
            "0.3",
            "--refine-horizon",
            "2",
            "--rollout-horizon",
            "3",
            "--workers",
            "1",
            "--no-world-model",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert {
        k: report["config"][k]
        for k in (
            "budget_steps",
            "refined",
            "sigma0",
            "refine_horizon",
            "rollout_horizon",
            "popsize",
            "wm_steps",
            "ensemble",
            "refine_steps",
            "critic_updates",
            "model_rollouts",
            "use_world_model",
        )
    } == {
        "budget_steps": 2000,
        "refined": 2,
        "sigma0": 0.3,
        "refine_horizon": 2,
        "rollout_horizon": 3,
        "popsize": 6,
        "wm_steps": 40,
        "ensemble": 2,
        "refine_steps": 4,
        "critic_updates": 0.02,
        "model_rollouts": 0,
        "use_world_model": False,
    }
    # 6 episodes of 200 steps, then the 4 that fit in 2000 steps
    assert report["budget_steps"] == 2000 and report["env_steps"] == 2000 and report["real_episodes"] == 10
    assert report["stop_reason"] == "budget" and report["budget_exhausted"] == "env_steps"
    assert report["stop_detail"].startswith("budget spent: 2000 of 2000 real env steps used (10 real episodes)")
    assert [len(g["candidates"]) for g in report["generations"]] == [6, 4]
    assert set(report["time_share"]) >= {
        "model_train",
        "model_rollouts",
        "critic",
        "refine",
        "real_episodes",
        "other",
        "model_share",
    }
    assert "real env steps" in result.stdout and "2000 of 2000" in result.stdout and "wall time" in result.stdout


def test_tiny_run_plot_and_tensorboard(tmp_path, state_dir):
    pytest.importorskip("matplotlib")
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    plot, tb = tmp_path / "curves.png", tmp_path / "tb"
    result = runner.invoke(
        app,
        [
            "evolve",
            *TINY,
            "--budget",
            "24",
            "--seed",
            "1",
            "--workers",
            "1",
            "--plot",
            str(plot),
            "--tensorboard",
            str(tb),
            "--json",
            str(tmp_path / "report.json"),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "report.json").read_text())
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000
    accumulator = EventAccumulator(str(tb))
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    assert "world_model/world_model.Pendulum-v1/val_loss" in tags, tags
    assert {"verdict/world_model.Pendulum-v1/guard_action", "verdict/critic.Pendulum-v1/guard_action"} <= tags, tags
    assert [e.step for e in accumulator.Scalars("evolve/best_return")] == [
        g["real_episodes"] for g in report["generations"]
    ]  # x: real episodes
    # the model's loss per generation it learned (the sink's evolve/wm_val_loss, from the evolve.generation event)
    trained = [(g["real_episodes"], g["wm_val_loss"]) for g in report["generations"] if g["wm_val_loss"] is not None]
    assert len(trained) >= 1 and "evolve/wm_val_loss" in tags, tags
    logged = [(e.step, e.value) for e in accumulator.Scalars("evolve/wm_val_loss")]
    assert [step for step, _ in logged] == [step for step, _ in trained]
    assert [value for _, value in logged] == pytest.approx([value for _, value in trained])


def test_plot_and_tensorboard_paths_checked_before_the_run(tmp_path, state_dir):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for flag in ("--plot", "--tensorboard"):
        result = runner.invoke(app, ["evolve", "--budget", "24", flag, str(afile / "out")])
        assert result.exit_code == 2 and flag in result.output, result.output
    assert not (state_dir / "replay.sqlite").exists()


def test_any_gymnasium_id_with_policy_and_episode_steps(tmp_path, state_dir):
    out = tmp_path / "pusher.json"
    args = [
        "evolve",
        *TINY,
        "--env",
        "Pusher-v5",
        "--policy",
        "mlp:4",
        "--episode-steps",
        "10",
        "--budget",
        "12",
        "--workers",
        "1",
        "--json",
        str(out),
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert (
        report["env"] == "Pusher-v5"
        and report["config"]["policy"] == "mlp:4"
        and report["config"]["episode_steps"] == 10
    )
    assert report["real_episodes"] == 12 and report["env_steps"] == 12 * 10  # Pusher only ends at the step limit
    assert report["target"] == 0.0  # the env spec's reward_threshold
    assert report["learners"]["world_model"]["agent"] == "world_model.Pusher-v5"


def test_no_world_model_ablation_from_the_cli(tmp_path, state_dir):
    out = tmp_path / "ablation.json"
    result = runner.invoke(
        app, ["evolve", *TINY, "--no-world-model", "--budget", "12", "--workers", "1", "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["mode"] == "no_model" and set(report["learners"]) == {"critic"} and report["real_episodes"] == 12
    assert report["config"]["use_world_model"] is False and report["config"]["use_critic"] is True
    assert all(g["wm_val_loss"] is None for g in report["generations"])
    assert isinstance(report["generations"][0]["critic_val_loss"], float)
    assert report["generations"][1]["candidates"][0]["operator"].startswith("refined:")
    assert "world model precision" not in result.stdout and "critic precision" in result.stdout


def test_no_critic_ablation_refines_through_the_model(tmp_path, state_dir):
    out = tmp_path / "ablation.json"
    result = runner.invoke(
        app,
        [
            "evolve",
            *TINY,
            "--no-critic",
            "--refine-horizon",
            "2",
            "--budget",
            "12",
            "--workers",
            "1",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert (
        report["mode"] == "no_critic" and set(report["learners"]) == {"world_model"} and report["real_episodes"] == 12
    )
    assert all(g["critic_val_loss"] is None for g in report["generations"])
    assert report["generations"][1]["candidates"][0]["operator"].startswith("refined:")


def test_cma_baseline_reports_same_keys(tmp_path, state_dir):
    out = tmp_path / "cma.json"
    result = runner.invoke(
        app, ["evolve", *TINY, "--baseline", "cma", "--budget", "20", "--workers", "1", "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    for key in REPORT_KEYS:
        assert key in report
    assert report["mode"] == "cma" and report["learners"] == {} and report["config"]["refined"] == 0
    assert report["real_episodes"] == 20 and report["target_reached"] is False
    assert [len(g["candidates"]) for g in report["generations"]] == [6, 6, 6, 2]  # the last population: what fits
    assert {c["operator"] for g in report["generations"] for c in g["candidates"]} == {"cma"}
    assert report["stop_detail"].startswith("budget spent: 20 of 20") and "evolve: cma on Pendulum-v1" in result.stdout
    assert report["best_candidate"]["operator"] == "cma_mean" or report["train_return"] is not None


def test_the_task_is_resolved_once_and_the_evaluator_made_by_the_one_factory(monkeypatch, state_dir):
    """Issue 46: the CLI resolves the task (which opens the env) once, before any output, and hands it to the agent;
    the agent's evaluator comes from `agents.evaluation.make_evaluator`, the one factory (patched here through the
    class it makes)."""
    from agents.tasks.task import Task

    resolved, made = [], []
    real_resolve = Task.resolve
    monkeypatch.setattr(Task, "resolve", lambda self, **kw: resolved.append(self.env_id) or real_resolve(self, **kw))

    class Counted(Evaluator):
        def __init__(self, *args, **kwargs):
            made.append(kwargs)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(evaluation, "Evaluator", Counted)
    result = runner.invoke(app, ["evolve", *TINY, "--baseline", "cma", "--budget", "6", "--workers", "1"])
    assert result.exit_code == 0, result.output
    assert resolved == ["Pendulum-v1"] and len(made) == 1 and made[0]["workers"] == 1
    assert not hasattr(se_darwin_agent.SEDarwinAgent, "_make_evaluator")


def test_a_resolved_task_is_taken_as_it_is():
    """`EvolveConfig.resolve` of a `ResolvedTask` opens no env again, and refuses a config that asks for another target,
    policy or episode length than the task was resolved with."""
    from dataclasses import replace

    from agents.tasks import TaskError

    config, task = se_darwin_agent.EvolveConfig().resolve()
    again, same = config.resolve(task)
    assert same is task and again == config
    with pytest.raises(TaskError, match=r"target=-1.0 \(the resolved task's is -300.0\); policy='mlp:4'"):
        replace(config, target=-1.0, policy="mlp:4").resolve(task)


def test_refine_steps_default_is_the_tasks():
    """The actor-gradient steps a run takes: the flag's where given, else the task's (Pendulum-v1 measured 1600),
    else the loop's default; a resolved config carries the number, so a resumed run keeps its own."""
    from agents.tasks import Task, TaskError
    from agents.tasks.task import DEFAULT_REFINE_STEPS

    assert se_darwin_agent.EvolveConfig().resolve()[0].refine_steps == 1600
    assert se_darwin_agent.EvolveConfig(refine_steps=12).resolve()[0].refine_steps == 12
    plain = Task(env_id="Pendulum-v1", target=-300.0, terminates=False)
    assert se_darwin_agent.EvolveConfig().resolve(plain)[0].refine_steps == DEFAULT_REFINE_STEPS == 800
    config, task = se_darwin_agent.EvolveConfig().resolve(Task(env_id="Pendulum-v1", target=-300.0, refine_steps=50))
    assert config.refine_steps == 50 and config.resolve(task)[0].refine_steps == 50
    for bad in (0, -3, 2.5, True):
        with pytest.raises(TaskError, match=rf"refine_steps={bad!r}: expected a whole number >= 1"):
            se_darwin_agent.EvolveConfig().resolve(Task(env_id="Pendulum-v1", target=-300.0, refine_steps=bad))


def test_discount_default_is_the_tasks():
    """The learners' discount: the flag's where given, else the task's (Hopper-v5 measured 0.995), else 0.99; out of
    [0, 1) is refused, from the flag and from a task alike."""
    from agents.tasks import Task, TaskError, get_task
    from agents.tasks.task import DEFAULT_DISCOUNT

    assert se_darwin_agent.EvolveConfig().resolve()[0].discount == DEFAULT_DISCOUNT == 0.99
    assert se_darwin_agent.EvolveConfig(discount=0.9).resolve()[0].discount == 0.9
    assert get_task("Hopper-v5").discount == 0.995
    config, task = se_darwin_agent.EvolveConfig().resolve(Task(env_id="Pendulum-v1", target=-300.0, discount=0.95))
    assert config.discount == 0.95 and config.resolve(task)[0].discount == 0.95
    for bad in (1.0, -0.1, float("nan"), True, "0.9"):
        with pytest.raises(TaskError, match=r"discount=.*: expected a number in \[0, 1\)"):
            se_darwin_agent.EvolveConfig().resolve(Task(env_id="Pendulum-v1", target=-300.0, discount=bad))
    for bad in (1.0, -0.1, float("nan"), float("inf"), "0.9", True):
        with pytest.raises(ValueError, match=r"discount=.* \(--discount\): expected a number in \[0, 1\)"):
            se_darwin_agent.EvolveConfig(discount=bad).validate()


def test_sigma0_default_is_the_tasks():
    """CMA-ES's initial step size: the flag's where given, else the task's (Pusher-v5 measured 0.1), else 0.5; the
    floor starts alike; a step size that is not a finite number > 0 is refused, from the flag and from a task alike."""
    from agents.tasks import Task, TaskError, get_task
    from agents.run_state import RunState
    from agents.tasks.task import DEFAULT_SIGMA0

    assert se_darwin_agent.EvolveConfig().resolve()[0].sigma0 == DEFAULT_SIGMA0 == 0.5
    assert se_darwin_agent.EvolveConfig(sigma0=0.3).resolve()[0].sigma0 == 0.3
    assert get_task("Pusher-v5").sigma0 == 0.1
    assert se_darwin_agent.EvolveConfig(env_id="Pusher-v5").resolve()[0].sigma0 == 0.1
    assert se_darwin_agent.EvolveConfig(env_id="Pusher-v5", sigma0=0.5).resolve()[0].sigma0 == 0.5
    config, task = se_darwin_agent.EvolveConfig().resolve(Task(env_id="Pendulum-v1", target=-300.0, sigma0=0.2))
    assert config.sigma0 == 0.2 and config.resolve(task)[0].sigma0 == 0.2
    assert RunState.new(config, task).search.sigma0 == 0.2  # the loop's CMA-ES, and so its floor's, starts there
    for bad in (0, -0.1, float("nan"), float("inf"), True, "0.1"):
        with pytest.raises(TaskError, match=r"sigma0=.*: expected a finite number > 0"):
            se_darwin_agent.EvolveConfig().resolve(Task(env_id="Pendulum-v1", target=-300.0, sigma0=bad))
        with pytest.raises(ValueError, match=r"sigma0=.*: expected a finite number > 0"):
            se_darwin_agent.EvolveConfig(sigma0=bad).validate()


class InterruptOnSecondPopulation(Evaluator):
    def evaluate_many(self, jobs, **kw):
        self.populations = getattr(self, "populations", 0) + 1
        if self.populations == 2:
            raise KeyboardInterrupt
        return super().evaluate_many(jobs, **kw)


def test_ctrl_c_keeps_replay_buffer(monkeypatch, state_dir):
    monkeypatch.setattr(evaluation, "Evaluator", InterruptOnSecondPopulation)
    result = runner.invoke(app, ["evolve", *TINY, "--budget", "40", "--workers", "1"])
    assert result.exit_code == 130, result.output
    assert "interrupted" in result.output and "1 generation(s) (6 real episodes) are committed" in result.output
    # the state dir is not the default one: the printed command names it
    assert f"continue it with: GENESIS_FP16_STATE_DIR={state_dir} genesis-fp16 evolve --resume seed0-" in result.output
    assert (state_dir / "replay.sqlite").is_file()


def test_an_interrupted_run_says_the_counts_its_log_says_and_the_printed_command_resumes_it(
    monkeypatch, tmp_path, state_dir
):
    """Issue 54: the command printed on Ctrl-C failed as printed in another state dir, and the interrupted line
    said "0 real episodes" where the log line above it said 15. Now both say the committed counts and the cut-off
    episodes alike, and the printed command, run as printed (its state dir from the command, not the environment,
    from another directory), continues the run."""
    import shlex

    from genesis_fp16.base.telemetry import read_events

    commit = se_darwin_agent.SEDarwinAgent._commit

    async def interrupted_in_generation_1(self, generation, evaluated):  # Ctrl-C once its 8 episodes are charged
        if generation == 1:
            raise KeyboardInterrupt
        return await commit(self, generation, evaluated)

    monkeypatch.setattr(se_darwin_agent.SEDarwinAgent, "_commit", interrupted_in_generation_1)
    cut = runner.invoke(app, ["evolve", *TINY, "--no-world-model", "--budget", "20", "--workers", "1"])
    assert cut.exit_code == 130, cut.output
    said = " ".join(cut.output.split())
    assert "1 generation(s) (6 real episodes) are committed; generation 1 was cut off after 8 real episodes" in said
    (event,) = [e for e in read_events(state_dir / "events.jsonl") if e["event"] == "evolve.interrupted"]
    assert (event["generations_committed"], event["real_episodes_committed"], event["cut_off_episodes"]) == (1, 6, 8)
    (line,) = [line for line in cut.output.splitlines() if line.startswith("continue it with: ")]
    env, args = {}, shlex.split(line.removeprefix("continue it with: "))
    while "=" in args[0]:
        name, _, value = args.pop(0).partition("=")
        env[name] = value
    assert env == {"GENESIS_FP16_STATE_DIR": str(state_dir)} and args[:3] == ["genesis-fp16", "evolve", "--resume"]
    monkeypatch.setattr(se_darwin_agent.SEDarwinAgent, "_commit", commit)
    monkeypatch.delenv("GENESIS_FP16_STATE_DIR")
    monkeypatch.chdir(tmp_path)  # elsewhere, and the environment without the state dir: only the command's counts
    out = tmp_path / "resumed.json"
    resumed = runner.invoke(app, [*args[1:], "--json", str(out)], env=env)
    assert resumed.exit_code == 0, resumed.output
    report = json.loads(out.read_text())
    assert report["resumed_from"]["generation"] == 0 and report["real_episodes"] == 20
    assert not (tmp_path / ".genesis_fp16").exists()


def test_resume_via_the_cli_continues_the_run(monkeypatch, tmp_path, state_dir):
    from agents.runs import read_manifest

    monkeypatch.setattr(evaluation, "Evaluator", InterruptOnSecondPopulation)
    cut = runner.invoke(app, ["evolve", *TINY, "--no-world-model", "--budget", "12", "--workers", "1"])
    assert cut.exit_code == 130, cut.output
    (run_id,) = [p.name for p in (state_dir / "runs").iterdir()]
    assert read_manifest(state_dir, run_id)["generation"] == 0
    monkeypatch.setattr(evaluation, "Evaluator", Evaluator)
    # a resumed run keeps its own options: only the budgets, workers and backend may change
    refused = runner.invoke(app, ["evolve", "--resume", run_id, "--refined", "2"], env={"COLUMNS": "300"})
    assert refused.exit_code == 2, refused.output
    assert "refined=2 (the run has 4)" in " ".join(refused.output.split()) and "Traceback" not in refused.output
    too_small = runner.invoke(app, ["evolve", "--resume", run_id, "--budget", "5"], env={"COLUMNS": "300"})
    assert too_small.exit_code == 2 and "already spent 6 real episodes" in " ".join(too_small.output.split()), (
        too_small.output
    )
    out = tmp_path / "resumed.json"
    result = runner.invoke(app, ["evolve", "--resume", run_id, "--budget", "18", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["resumed"] is True and report["run_id"] == run_id and report["resumed_from"]["generation"] == 0
    assert report["real_episodes"] == 18 and report["budget"] == 18 and report["mode"] == "no_model"
    assert [g["generation"] for g in report["generations"]] == [0, 1, 2]
    assert "resumed after" in result.stdout


def test_resume_of_an_unknown_run_is_one_clear_error(state_dir):
    result = runner.invoke(app, ["evolve", "--resume", "no-such-run"])
    assert result.exit_code == 2, result.output
    assert "no-such-run" in result.output and "Traceback" not in result.output


def test_corrupt_replay_database_one_clear_error(state_dir):
    (state_dir / "replay.sqlite").write_bytes(b"not a database at all " * 200)
    result = runner.invoke(app, ["evolve", "--budget", "16", "--workers", "1"])
    assert result.exit_code == 2, result.output
    assert "replay.sqlite" in result.output and "corrupt" in result.output
    assert "Traceback" not in result.output


class FailingSeedEvaluator(Evaluator):
    """The seed generation's real episodes hang past the timeout."""

    def evaluate_many(self, jobs, **kw):
        from agents.evaluation import EvaluationTimeout

        raise EvaluationTimeout("real evaluation of 6 episodes did not finish within 60 s")


def test_seed_generation_timeout_is_one_clear_error(monkeypatch, state_dir):
    monkeypatch.setattr(evaluation, "Evaluator", FailingSeedEvaluator)
    result = runner.invoke(app, ["evolve", *TINY, "--budget", "40", "--workers", "1"])
    assert result.exit_code == 1, result.output
    assert (
        "did not finish within 60 s" in result.output
        and "generation(s)" in result.output
        and "safe in" in result.output
    )
    assert "Traceback" not in result.output


# A `genesis-fp16 evolve` whose real evaluations hang in their worker
# processes, so the run is still going when the signal comes.
SLOW_EVOLVE = """
import dataclasses, functools, time
from agents import evaluation
from agents.evaluation import Evaluator


class SlowEvaluator(Evaluator):
    def evaluate_many(self, jobs, **kw):
        print("evaluating", flush=True)
        # an hour to make the env
        self.spec = dataclasses.replace(self.spec, env_factory=functools.partial(time.sleep, 3600))
        return super().evaluate_many(jobs, **kw)


if __name__ == "__main__":
    evaluation.Evaluator = SlowEvaluator  # the one factory, agents.evaluation.make_evaluator, makes the agent's
    from genesis_fp16.cli import app

    app(["evolve", "--budget", "16", "--workers", "2"], prog_name="genesis-fp16")
"""


def test_sigterm_is_handled_like_ctrl_c(tmp_path, state_dir):
    import os
    import signal

    import psutil
    from process_helpers import kill_all, read_line, still_alive, wait_until

    from genesis_fp16.base import telemetry
    from genesis_fp16.base.settings import load_settings

    root = Path(__file__).resolve().parents[1]
    stderr_path = tmp_path / "stderr.txt"
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-c", SLOW_EVOLVE],
            cwd=root,
            env=os.environ.copy(),
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    family: list[psutil.Process] = []
    try:
        read_line(proc.stdout, 120, lambda line: line.startswith("evaluating"))
        parent = psutil.Process(proc.pid)

        def workers_started() -> bool:
            family[:] = parent.children(recursive=True)
            return sum("spawn_main" in " ".join(p.cmdline()) for p in family) >= 2

        assert wait_until(workers_started, 120), "the evaluation workers never started"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 143, stderr_path.read_text()
        output = stderr_path.read_text()
        assert "interrupted" in output and "safe in" in output, output
        assert "Traceback" not in output, output
        events = [e["event"] for e in telemetry.read_events(load_settings().events_path)]
        assert "evolve.interrupted" in events
        left = still_alive(family, 10)
        assert not left, f"alive after evolve exited: {[(p.pid, p.cmdline()) for p in left]}"
    finally:
        proc.kill()
        proc.wait(timeout=120)
        kill_all(family)


def test_list_tasks():
    result = runner.invoke(app, ["evolve", "--list-tasks"])
    assert result.exit_code == 0, result.output
    assert "InvertedPendulum-v5" in result.output and "MountainCarContinuous-v0" in result.output
    assert "any other gymnasium id" in result.output


@pytest.fixture
def nan_task(monkeypatch):
    """``--env NaNDrift``: a task plugin (named as its env: a resolved config names the task by its env id) whose env
    gives NaN rewards only."""
    import task_envs

    from agents.tasks import GROUP, Task, registry

    class EP:
        name = "NaNDrift"

        def load(self):
            return lambda: Task(env_id="NaNDrift", env_factory=task_envs.nan_reward, target=0.0, n_train=2, n_heldout=2)

    monkeypatch.setattr(registry, "entry_points", lambda group: [EP()] if group == GROUP else [])


@pytest.mark.parametrize("mode", [["--no-world-model"], ["--baseline", "cma"], []])
def test_a_run_whose_every_candidate_failed_says_so_and_exits_1(mode, nan_task, tmp_path, state_dir):
    """Every candidate's env gives NaN rewards, the same error: the run stops after its first generation (issue 54:
    it spent the whole budget before), and says so in one error line."""
    out = tmp_path / "report.json"
    result = runner.invoke(
        app, ["evolve", *TINY, "--env", "NaNDrift", *mode, "--budget", "16", "--workers", "1", "--json", str(out)]
    )
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    report = json.loads(out.read_text())  # the report is written before the exit
    failed = report["failed_candidates"]
    assert report["stop_reason"] == "failed" and report["real_episodes"] == 6 and report["train_return"] is None
    assert len(report["generations"]) == 1 and len(failed) == 6
    assert all("non-finite reward (nan)" in f["error"] for f in failed)
    assert "6 of 16" in result.stdout and "6 (charged 6 real episodes)" in result.stdout  # the table
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert error.startswith("error: every candidate of generation 0 failed with the same error: env 'NaNDrift'")
    assert "non-finite values whatever the policy" in error and "(6 of 16 real episodes charged" in error


@pytest.fixture
def fragment_task(monkeypatch):
    """``--env Thermostat-v0``: docs/EMBEDDING.md's fragments joined, whose ``reset`` returns None."""
    import task_envs

    from agents.tasks import GROUP, Task, registry

    class EP:
        name = "Thermostat-v0"

        def load(self):
            return lambda: Task(
                env_id="Thermostat-v0", env_factory=task_envs.fragment, target=49.2, episode_steps=50, n_train=8
            )

    monkeypatch.setattr(registry, "entry_points", lambda group: [EP()] if group == GROUP else [])


def test_a_task_whose_reset_returns_none_stops_after_its_first_generation_with_one_error_line(
    fragment_task, tmp_path, state_dir
):
    """Issue 54: such a task ran all 80 episodes, 80 failed evaluations and about 200 warning lines, before the one
    error that was clear after the first. Now: one generation, one warning, one error line that says what to fix,
    exit 1, and the state dir keeps what it had."""
    from agents.runs import read_manifest
    from infrastructure.replay_buffer import ReplayBuffer

    before = ReplayBuffer(state_dir / "replay.sqlite")
    before.append_generation("other:run", 0, [_trajectory()])
    out = tmp_path / "report.json"
    result = runner.invoke(
        app, ["evolve", "--env", "Thermostat-v0", "--budget", "80", "--workers", "1", "--json", str(out)]
    )
    assert result.exit_code == 1, result.output
    report = json.loads(out.read_text())
    population = len(report["generations"][0]["candidates"])
    assert report["stop_reason"] == "failed" and len(report["generations"]) == 1
    assert report["real_episodes"] == population < 80 and len(report["failed_candidates"]) == population
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    warnings = [line for line in result.stderr.splitlines() if "[warning" in line]
    assert len(errors) == 1 and len(warnings) == 1, result.stderr
    assert errors[0] == (
        "error: every candidate of generation 0 failed with the same error: env 'Thermostat-v0' reset returned None: "
        "a gymnasium env's reset must return (obs, info); fix the env as the error says, then start a new run "
        f"({population} of 80 real episodes charged, the rest not spent)"
    )
    assert f"skipped g0-0-cma and {population - 1} more" in " ".join(result.stdout.split())  # one row, not one each
    assert report["learners"]["world_model"]["precision"] is None  # nothing trained, nothing built
    # nothing else in the state dir is lost: another run's replay rows, this run's manifest (finished: start anew)
    assert ReplayBuffer(state_dir / "replay.sqlite").count("other:run")["trajectories"] == 1
    manifest = read_manifest(state_dir, report["run_id"])
    assert manifest["status"] == "finished" and manifest["state"]["stop"] == "failed"


def _trajectory():
    import numpy as np

    from infrastructure.replay_buffer import Trajectory

    return Trajectory(
        obs=np.zeros((3, 2), np.float32),
        action=np.zeros((3, 1), np.float32),
        reward=np.zeros(3, np.float32),
        next_obs=np.zeros((3, 2), np.float32),
        done=np.zeros(3, bool),
        candidate="c",
    )


def _register_drift_task(monkeypatch, name: str, env_factory) -> None:
    """``--env NAME``: a task plugin (the only one registered) of 2 training and 2 held-out start states on
    ``env_factory``."""
    from agents.tasks import GROUP, Task, registry

    class EP:
        def load(self):
            return lambda: Task(env_id=name, env_factory=env_factory, target=10.0, n_train=2, n_heldout=2)

    EP.name = name
    monkeypatch.setattr(registry, "entry_points", lambda group: [EP()] if group == GROUP else [])


def test_a_reward_finite_in_float32_near_its_limit_costs_its_candidates_and_the_run_finishes(
    monkeypatch, tmp_path, state_dir
):
    """A reward of 1e38 (finite as float32) once overflowed the critic's float32
    statistics, and the run stopped (exit 2) after both learners rolled back.
    Now such a reward costs its candidate like NaN does, and the learners train
    on the rest."""
    import task_envs

    _register_drift_task(monkeypatch, "LargeRewardDrift", task_envs.large_reward_above_zero)
    out = tmp_path / "report.json"
    result = runner.invoke(
        app,
        [
            "evolve",
            "--env",
            "LargeRewardDrift",
            *TINY,
            "--budget",
            "18",
            "--seed",
            "0",
            "--workers",
            "1",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    failed = report["failed_candidates"]
    assert report["real_episodes"] == 18 and report["stop_reason"] == "budget"
    assert failed and all("non-finite reward (1e+38, beyond the +-1e+15" in f["error"] for f in failed)
    trained = [g for g in report["generations"] if g.get("critic_wall_s") is not None]
    assert trained and all(math.isfinite(g["critic_val_loss"]) and math.isfinite(g["wm_val_loss"]) for g in trained)


@pytest.fixture
def nan_obs_task(monkeypatch):
    """``--env NaNObsDrift``: a task plugin whose env returns a NaN next_obs at
    an episode's last step for a positive action, so some candidates only."""
    import task_envs

    _register_drift_task(monkeypatch, "NaNObsDrift", task_envs.nan_last_obs_above_zero)


def test_a_candidate_whose_env_returns_a_nan_observation_costs_that_candidate_only(
    nan_obs_task, monkeypatch, tmp_path, state_dir
):
    """Before, its trajectory reached replay.sqlite and training stopped the run
    (exit 2), and --resume failed the same way. Now the candidate is charged,
    listed and logged, the run goes on, and a resumed run too."""
    import numpy as np

    from agents.runs import read_manifest
    from genesis_fp16.base.telemetry import read_events
    from infrastructure.replay_buffer import ReplayBuffer

    original = se_darwin_agent.SEDarwinAgent

    class StopAfterGeneration0(original):  # Ctrl-C once generation 0 is committed (the CLI sets on_generation)
        @property
        def on_generation(self):
            return self._on_gen

        @on_generation.setter
        def on_generation(self, fn):
            def then_stop(record):
                if fn is not None:
                    fn(record)
                if record["generation"] == 0:
                    raise KeyboardInterrupt

            self._on_gen = then_stop

    monkeypatch.setattr(se_darwin_agent, "SEDarwinAgent", StopAfterGeneration0)
    # a last generation of 6 (budget 20): a budget-cut one of 2 whose both candidates fail alike reads as a broken env
    args = [*TINY, "--budget", "20", "--seed", "0", "--workers", "1"]
    cut = runner.invoke(app, ["evolve", "--env", "NaNObsDrift", *args])
    assert cut.exit_code == 130, cut.output
    (run_id,) = [p.name for p in (state_dir / "runs").iterdir()]
    assert read_manifest(state_dir, run_id)["generation"] == 0

    monkeypatch.setattr(se_darwin_agent, "SEDarwinAgent", original)
    out = tmp_path / "report.json"
    result = runner.invoke(app, ["evolve", "--resume", run_id, "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    failed = report["failed_candidates"]
    assert report["resumed"] is True and report["real_episodes"] == 20 and report["stop_reason"] == "budget"
    assert failed and all(
        "returned a non-finite next_obs (next_obs[1] = nan) at step 4 of episode" in f["error"] for f in failed
    )
    scored = [
        c for g in report["generations"] for c in g["candidates"] if isinstance(c["real_return"], float)
    ]  # a failed one: "-inf"
    assert scored  # the others were scored
    assert any(
        isinstance(g["wm_val_loss"], float) for g in report["generations"]
    )  # and the world model trained on their episodes
    logged = [e for e in read_events(state_dir / "events.jsonl") if e["event"] == "evolve.candidate_failed"]
    # charged in the order they failed; after them, failures of the answer's finals (outside the budget): the CMA-ES
    # mean, the last actor, or a candidate the run gave one episode
    names = [e["candidate"] for e in logged]
    assert names[: len(failed)] == [f["candidate"] for f in failed]
    one_episode = {c["id"] for g in report["generations"] for c in g["candidates"] if c["episodes"] == 1}
    assert all(name.endswith(("-actor", "-mean")) or name in one_episode for name in names[len(failed) :])
    assert all("next_obs" in e["error"] for e in logged)
    stored = ReplayBuffer(state_dir / "replay.sqlite").sample(f"se_darwin:{run_id}")
    assert stored and all(
        np.isfinite(getattr(t, k)).all() for t in stored for k in ("obs", "action", "reward", "next_obs")
    )


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_non_finite_target_is_one_clear_error(value, state_dir):
    result = runner.invoke(app, ["evolve", f"--target={value}", "--budget", "16"])
    assert result.exit_code == 2, result.output
    assert f"target={value}: expected a finite number" in result.output and "Traceback" not in result.output


def test_after_a_run_rollout_status_lists_the_world_model_and_the_critic(tmp_path, state_dir, monkeypatch):
    """Both learned parts are guarded agents of their own: enabled in shadow, each trains beside its FP32 reference
    and `rollout status` shows both with a measured shadow gap."""
    monkeypatch.setenv("ENABLE_FP16_TRAINING", "true")
    for agent in ("world_model.Pendulum-v1", "critic.Pendulum-v1"):
        assert runner.invoke(app, ["rollout", "enable", agent, "--shadow"]).exit_code == 0
    result = runner.invoke(
        app, ["evolve", *TINY, "--budget", "12", "--workers", "1", "--precision", "bf16", "--critic-precision", "bf16"]
    )
    assert result.exit_code == 0, result.output
    status = runner.invoke(app, ["rollout", "status", "--json"])
    assert status.exit_code == 0, status.output
    rows = {row["agent"]: row for row in json.loads(status.output)["agents"]}
    assert set(rows) == {"world_model.Pendulum-v1", "critic.Pendulum-v1"}
    for row in rows.values():
        assert row["stage"] == "shadow" and row["last_good_checkpoint"], row
        assert row["last_checks"]["shadow_gap"] is not None, row  # bf16 trained beside its FP32 reference

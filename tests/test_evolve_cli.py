"""`genesis-fp16 evolve`: registration, bad input, a tiny run with --json,
the CMA-ES baseline, and Ctrl-C keeping the replay buffer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from agents import se_darwin_agent
from agents.evaluation import Evaluator
from genesis_fp16.cli import app

REPORT_KEYS = ("real_episodes", "heldout_return", "train_return", "target_reached", "precision", "wall_s", "generations")
runner = CliRunner()


@pytest.fixture(autouse=True)
def _restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def tiny(monkeypatch):
    """The CLI's config with tiny search budgets (flags still apply)."""
    original = se_darwin_agent.EvolveConfig

    def make(**kw):
        base = dict(init_candidates=8, wm_steps=40, refine_iters=2, revision_iters=2, revision_samples=8,
                    popsize=6, horizon=10, imagine_starts=4, eval_timeout_s=60)
        base.update(kw)
        return original(**base)

    monkeypatch.setattr(se_darwin_agent, "EvolveConfig", make)


def test_entry_point_registers_evolve():
    exe = Path(sys.executable).with_name("genesis-fp16")
    out = subprocess.run([str(exe), "evolve", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for flag in ("--env", "--budget", "--seed", "--precision", "--baseline", "--json"):
        assert flag in out.stdout


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--env", "CartPole-v1"], "action space Discrete(2)"),
        (["--env", "NoSuchEnv-v0"], "'NoSuchEnv-v0' cannot be made"),
        (["--env", "Walker2d-v5"], "pass --target R"),
        (["--policy", "rnn"], "expected one of linear, mlp:H"),
        (["--budget", "5"], "--budget"),
        (["--baseline", "cma", "--no-world-model"], "exclusive"),
        (["--precision", "fp8"], "fp8"),
        (["--budget-steps", "3000"], "budget_steps=3000: expected at least 3200 real env steps"),
        (["--kappa", "-1"], "--kappa"),
        (["--kappa", "nan"], "--kappa"),
        (["--particles", "0"], "--particles"),
        (["--imagine-starts", "0"], "--imagine-starts"),
        (["--horizon", "0"], "--horizon"),
        (["--trust-spearman", "1.5"], "--trust-spearman"),
        (["--trust-spearman", "nan"], "--trust-spearman"),
        (["--probe-sigma", "0"], "--probe-sigma"),
        (["--probe-sigma", "nan"], "--probe-sigma"),
        (["--probe-screen", "0"], "--probe-screen"),
        (["--horizon", "201"], "horizon=201: expected at most the episode length (200 steps)"),
    ],
)
def test_bad_input_one_clear_error(args, expected):
    result = runner.invoke(app, ["evolve", *args])
    assert result.exit_code == 2
    assert expected in result.output


def test_budget_minimum_in_help_is_the_real_rule():
    import re

    result = runner.invoke(app, ["evolve", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    shown = re.search(r"--budget\s+<int range>\s+\[x>=(\d+)\]", result.output)
    assert shown, result.output
    minimum = int(shown.group(1))
    se_darwin_agent.EvolveConfig(budget=minimum, init_candidates=8).resolve()  # the minimum shown is accepted
    with pytest.raises(ValueError, match=f"budget={minimum - 1}"):
        se_darwin_agent.EvolveConfig(budget=minimum - 1, init_candidates=8).resolve()
    refused = runner.invoke(app, ["evolve", "--budget", str(minimum - 1)])
    assert refused.exit_code == 2 and "--budget" in refused.output and str(minimum) in refused.output
    assert "Traceback" not in refused.output


def test_tiny_run_writes_json_report(tiny, tmp_path, state_dir):
    out = tmp_path / "report.json"
    result = runner.invoke(app, ["evolve", "--budget", "24", "--seed", "1", "--precision", "bf16", "--workers", "1", "--no-probe-search",
                                 "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    for key in REPORT_KEYS:
        assert key in report
    assert report["real_episodes"] == 24 and report["seed"] == 1 and report["precision"] == "bf16"
    assert [g["generation"] for g in report["generations"]] == [0, 1]
    assert all(isinstance(g["wm_val_loss"], float) for g in report["generations"])
    assert "held-out" in result.stdout and "gen  1 episodes" in result.stderr
    # every return says which set it is on, and the run says why it stopped
    gen0, gen1 = [line for line in result.stderr.splitlines() if line.startswith("gen ")]
    assert "(probe: 1 episode on 1 start state)" in gen0 and "(full: 16 training start states)" in gen1
    assert report["generations"][0]["best_full"] is False and report["generations"][1]["best_episodes"] == 16
    assert report["train_start_states"] == 16 and report["stop_reason"] == "budget"
    assert report["stop_detail"].startswith("budget spent: 24 of 24 real episodes used")
    assert report["stop_detail"] in result.stdout
    assert "best return, full (16 training start states)" in result.stdout
    assert "best return, held-out (20 held-out start states)" in result.stdout
    assert Path(report["replay_db"]).is_file() and Path(report["replay_db"]).parent == state_dir


def test_search_and_budget_flags_reach_the_config(tiny, tmp_path, state_dir):
    out = tmp_path / "report.json"
    result = runner.invoke(app, ["evolve", "--budget", "16", "--budget-steps", "3200", "--no-racing", "--kappa", "0.5", "--particles", "2",
                                 "--imagine-starts", "3", "--horizon", "7", "--workers", "1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert {k: report["config"][k] for k in ("budget_steps", "racing", "kappa", "particles", "imagine_starts", "horizon")} == {
        "budget_steps": 3200, "racing": False, "kappa": 0.5, "particles": 2, "imagine_starts": 3, "horizon": 7}
    assert report["budget_steps"] == 3200 and report["stop_reason"] == "budget" and report["budget_exhausted"] == "episodes"
    assert set(report["time_share"]) >= {"model_train", "imagine", "search", "real_episodes", "other", "model_share"}
    assert report["imagination"]["candidates"] == 0 and "wall time in the model" in result.stdout


def test_tiny_run_plot_and_tensorboard(tiny, tmp_path, state_dir):
    pytest.importorskip("matplotlib")
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    plot, tb = tmp_path / "curves.png", tmp_path / "tb"
    result = runner.invoke(app, ["evolve", "--budget", "24", "--seed", "1", "--workers", "1", "--plot", str(plot), "--tensorboard", str(tb)])
    assert result.exit_code == 0, result.output
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000
    accumulator = EventAccumulator(str(tb))
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    assert {"evolve/best_return", "evolve/wm_val_loss"} <= tags
    assert any(t.startswith("world_model/") and t.endswith("/val_loss") for t in tags), tags
    assert any(t.startswith("verdict/") and t.endswith("/guard_action") for t in tags), tags
    assert [e.step for e in accumulator.Scalars("evolve/best_return")] == [8, 24]  # x: real episodes


def test_plot_and_tensorboard_paths_checked_before_the_run(tmp_path, state_dir):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for flag in ("--plot", "--tensorboard"):
        result = runner.invoke(app, ["evolve", "--budget", "24", flag, str(afile / "out")])
        assert result.exit_code == 2 and flag in result.output, result.output
    assert not (state_dir / "replay.sqlite").exists()


def test_any_gymnasium_id_with_policy_and_episode_steps(tiny, tmp_path, state_dir):
    out = tmp_path / "reacher.json"
    args = ["evolve", "--env", "Reacher-v5", "--policy", "mlp:16", "--episode-steps", "10", "--budget", "24", "--workers", "1", "--json", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["env"] == "Reacher-v5" and report["config"]["policy"] == "mlp:16" and report["config"]["episode_steps"] == 10
    assert report["real_episodes"] == 24 and report["env_steps"] == 24 * 10  # Reacher only ends at the step limit
    assert report["target"] == -3.75  # the env spec's reward_threshold


def test_no_world_model_ablation_from_the_cli(tiny, tmp_path, state_dir):
    out = tmp_path / "ablation.json"
    result = runner.invoke(app, ["evolve", "--no-world-model", "--budget", "24", "--workers", "1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["mode"] == "no_world_model" and report["precision"] == "none" and report["real_episodes"] == 24
    assert all(g["wm_val_loss"] is None for g in report["generations"])


def test_cma_baseline_reports_same_keys(tiny, tmp_path):
    out = tmp_path / "cma.json"
    result = runner.invoke(app, ["evolve", "--baseline", "cma", "--budget", "32", "--workers", "1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    for key in REPORT_KEYS:
        assert key in report
    assert report["mode"] == "cma" and report["real_episodes"] == 32 and report["target_reached"] is False
    assert report["stop_detail"].startswith("budget spent: 32 of 32") and "(full: 16 training start states)" in result.stderr


class InterruptOnFullEvaluation(Evaluator):
    def evaluate(self, params, states, **kw):
        if len(states) > 1:
            raise KeyboardInterrupt
        return super().evaluate(params, states, **kw)


def test_ctrl_c_keeps_replay_buffer(tiny, monkeypatch, state_dir):
    monkeypatch.setattr(se_darwin_agent, "Evaluator", InterruptOnFullEvaluation)
    result = runner.invoke(app, ["evolve", "--budget", "40", "--workers", "1"])
    assert result.exit_code == 130, result.output
    assert "interrupted" in result.output and "1 generation(s) (8 real episodes) are committed" in result.output
    assert (state_dir / "replay.sqlite").is_file()


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

        raise EvaluationTimeout("real evaluation of 8 episodes did not finish within 60 s")


def test_seed_generation_timeout_is_one_clear_error(tiny, monkeypatch, state_dir):
    monkeypatch.setattr(se_darwin_agent, "Evaluator", FailingSeedEvaluator)
    result = runner.invoke(app, ["evolve", "--budget", "40", "--workers", "1"])
    assert result.exit_code == 1, result.output
    assert "did not finish within 60 s" in result.output and "generation(s)" in result.output and "safe in" in result.output
    assert "Traceback" not in result.output


# A `genesis-fp16 evolve` whose real evaluations hang in their worker
# processes, so the run is still going when the signal comes.
SLOW_EVOLVE = """
import dataclasses, functools, time
from agents import se_darwin_agent
from agents.evaluation import Evaluator


class SlowEvaluator(Evaluator):
    def evaluate_many(self, jobs, **kw):
        print("evaluating", flush=True)
        self.spec = dataclasses.replace(self.spec, env_factory=functools.partial(time.sleep, 3600))  # an hour to make the env
        return super().evaluate_many(jobs, **kw)


if __name__ == "__main__":
    se_darwin_agent.Evaluator = SlowEvaluator
    from genesis_fp16.cli import app

    app(["evolve", "--budget", "16", "--workers", "2"], prog_name="genesis-fp16")
"""


def test_sigterm_is_handled_like_ctrl_c(tmp_path, state_dir):
    import os
    import signal

    import psutil
    from process_helpers import kill_all, read_line, still_alive, wait_until

    from genesis_fp16 import telemetry
    from genesis_fp16.settings import load_settings

    root = Path(__file__).resolve().parents[1]
    stderr_path = tmp_path / "stderr.txt"
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", SLOW_EVOLVE], cwd=root, env=os.environ.copy(),
                                stdout=subprocess.PIPE, stderr=stderr, text=True)
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
    """``--env NaNDrift``: a task plugin (named as its env: a resolved config names the task by its env id) whose env gives NaN rewards only."""
    import task_envs

    from agents.tasks import GROUP, Task, registry

    class EP:
        name = "NaNDrift"

        def load(self):
            return lambda: Task(env_id="NaNDrift", env_factory=task_envs.nan_reward, target=0.0, n_train=2, n_heldout=2)

    monkeypatch.setattr(registry, "entry_points", lambda group: [EP()] if group == GROUP else [])


@pytest.mark.parametrize("mode", [["--no-world-model"], ["--baseline", "cma"], []])
def test_a_run_whose_every_candidate_failed_says_so_and_exits_1(mode, tiny, nan_task, tmp_path, state_dir):
    out = tmp_path / "report.json"
    result = runner.invoke(app, ["evolve", "--env", "NaNDrift", *mode, "--budget", "16", "--workers", "1", "--json", str(out)])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    report = json.loads(out.read_text())  # the report is written before the exit
    failed = report["failed_candidates"]
    assert report["stop_reason"] == "failed" and report["real_episodes"] == 16 and report["train_return"] is None
    assert failed and all("non-finite reward (nan)" in f["error"] for f in failed)
    assert "16 of 16" in result.stdout and f"{len(failed)} (charged 16 real episodes)" in result.stdout  # the table
    assert "error: every candidate failed" in result.stderr and "16 of 16 real episodes charged" in result.stderr


@pytest.fixture
def nan_obs_task(monkeypatch):
    """``--env NaNObsDrift``: a task plugin whose env returns a NaN next_obs at
    an episode's last step for a positive action, so some candidates only."""
    import task_envs

    from agents.tasks import GROUP, Task, registry

    class EP:
        name = "NaNObsDrift"

        def load(self):
            return lambda: Task(env_id="NaNObsDrift", env_factory=task_envs.nan_last_obs_above_zero, target=10.0, n_train=2,
                                n_heldout=2)

    monkeypatch.setattr(registry, "entry_points", lambda group: [EP()] if group == GROUP else [])


def test_a_candidate_whose_env_returns_a_nan_observation_costs_that_candidate_only(tiny, nan_obs_task, monkeypatch, tmp_path, state_dir):
    """Before, its trajectory reached replay.sqlite and training stopped the run
    (exit 2), and --resume failed the same way. Now the candidate is charged,
    listed and logged, the run goes on, and a resumed run too."""
    import numpy as np

    from agents.runs import read_manifest
    from genesis_fp16.telemetry import read_events
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
    args = ["--budget", "16", "--seed", "0", "--workers", "1", "--no-probe-search"]
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
    assert report["resumed"] is True and report["real_episodes"] == 16 and report["stop_reason"] == "budget"
    assert failed and all("returned a non-finite next_obs (next_obs[1] = nan) at step 4 of episode" in f["error"] for f in failed)
    assert any(g["evaluated"] for g in report["generations"])  # the others were scored
    assert any(isinstance(g["wm_val_loss"], float) for g in report["generations"])  # and the world model trained on their episodes
    logged = [e for e in read_events(state_dir / "events.jsonl") if e["event"] == "evolve.candidate_failed"]
    assert sorted(e["candidate"] for e in logged) == sorted(f["candidate"] for f in failed)
    assert all("next_obs" in e["error"] for e in logged)
    stored = ReplayBuffer(state_dir / "replay.sqlite").sample(f"se_darwin:{run_id}")
    assert stored and all(np.isfinite(getattr(t, k)).all() for t in stored for k in ("obs", "action", "reward", "next_obs"))


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_non_finite_target_is_one_clear_error(value, state_dir):
    result = runner.invoke(app, ["evolve", f"--target={value}", "--budget", "16"])
    assert result.exit_code == 2, result.output
    assert f"target={value}: expected a finite number" in result.output and "Traceback" not in result.output


def test_probe_flags_reach_the_probe_search(tiny, tmp_path, state_dir):
    out = tmp_path / "report.json"
    result = runner.invoke(app, ["evolve", "--budget", "40", "--seed", "1", "--precision", "bf16", "--workers", "1", "--probe-sigma", "0.8",
                                 "--probe-screen", "2", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["config"]["probe_sigma"] == 0.8 and report["config"]["probe_screen"] == 2
    probes = [g["probe"] for g in report["generations"] if g["probe"] is not None]
    assert probes and probes[0]["sigma"] == 0.8 and probes[0]["segment"] == 0

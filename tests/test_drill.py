"""The drill: every scenario passes on this machine, a failing scenario fails
the command, and the real state dir is left alone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from genesis_fp16.rollout import drill as drill_mod
from genesis_fp16.cli import app
from genesis_fp16.rollout.drill import ScenarioResult, run_drill
from genesis_fp16.base.telemetry import read_events

runner = CliRunner()
NAMES = {
    "nan_storm",
    "overflow_storm",
    "overflow_warning",
    "killed_while_saving",
    "rollback_survives_restart",
    "kill_switch",
    "silent_degradation",
    "healthy_control",
    "events_recorded",
}


def test_drill_command_passes_quietly_and_writes_json(state_dir, tmp_path):
    # a real process, as a user runs it: every line it prints, stdout and stderr
    env = {**os.environ, "ENABLE_FP16_TRAINING": "false"}  # the drill rehearses rollback even under the kill switch
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, "-m", "genesis_fp16.cli", "drill", "--keep", "--json", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    scratch = Path(report["state_dir"])
    try:
        lines = (proc.stdout + proc.stderr).splitlines()
        assert len(lines) <= 15 and len(lines) == len(NAMES) + 1, lines  # one per scenario and the summary
        assert not any("[warning" in line or "[error" in line for line in lines), lines
        assert lines[-1].startswith("drill passed: 9 of 9 scenarios") and str(scratch / "events.jsonl") in lines[-1]
        # the injected faults' events are not lost, only kept off the terminal
        logged = {e["event"] for e in read_events(scratch / "events.jsonl")}
        assert {"guard.rollback", "trainer.nonfinite_streak", "trainer.step_skipped"} <= logged
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    assert report["passed"] is True
    assert {s["name"] for s in report["scenarios"]} == NAMES
    assert all(s["passed"] is True for s in report["scenarios"])
    by_name = {s["name"]: s["checks"] for s in report["scenarios"]}
    silent = by_name["silent_degradation"]
    assert silent["detection_delay_calls"] <= 2 * silent["canary_every"] and silent["precision_after"] == "fp32"
    assert silent["ledger_stage"] == "rolled_back" and silent["weights_restored"] and silent["nonfinite"] == 0
    healthy = by_name["healthy_control"]
    assert healthy["canaries"] == 50 and healthy["rollbacks"] == 0 and healthy["false_alarms"] == 0
    assert report["seconds"] < 120
    assert not (state_dir / "rollout.sqlite").exists()  # nothing in the real state dir's ledger


def test_failing_scenario_fails_the_command(state_dir, monkeypatch):
    monkeypatch.setattr(
        drill_mod.Drill, "kill_switch", lambda self: ScenarioResult("kill_switch", False, "broken", 0.0)
    )
    monkeypatch.setattr(
        drill_mod.Drill,
        "scenarios",
        lambda self: [("kill_switch", self.kill_switch), ("overflow_storm", self.overflow_storm)],
    )
    result = runner.invoke(app, ["drill"])
    assert result.exit_code == 1
    assert "FAIL kill_switch (" in result.stdout and "broken" in result.stdout  # which one, and what it saw
    assert "drill FAILED: kill_switch (1 of 2)" in result.stdout


def test_crashing_scenario_is_reported_not_raised(tmp_path, monkeypatch):
    def boom(self):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(drill_mod.Drill, "overflow_storm", boom)
    monkeypatch.setattr(drill_mod.Drill, "scenarios", lambda self: [("overflow_storm", self.overflow_storm)])
    report = run_drill(tmp_path / "scratch", keep=True)
    (only,) = report["scenarios"]
    assert not report["passed"] and only["passed"] is False and "disk on fire" in only["detail"]
    assert report["state_dir"] == str(tmp_path / "scratch")


def test_events_after_a_drill_go_to_the_real_log_when_logging_was_not_configured(state_dir, monkeypatch):
    # a fresh process: nothing configured logging before the drill; afterwards the
    # event sink stayed on the (removed) scratch dir and recreated it
    from genesis_fp16.base import telemetry

    monkeypatch.setattr(drill_mod.Drill, "scenarios", lambda self: [("kill_switch", self.kill_switch)])
    telemetry._CONFIGURED.clear()
    report = run_drill()
    assert report["passed"]
    assert telemetry.events_path() == state_dir / "events.jsonl"
    telemetry.get_logger("test").warning("after.drill")
    events = telemetry.read_events(state_dir / "events.jsonl")
    assert any(e.get("event") == "after.drill" for e in events)

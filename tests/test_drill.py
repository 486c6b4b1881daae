"""The drill: every scenario passes on this machine, a failing scenario fails
the command, and the real state dir is left alone."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from genesis_fp16 import drill as drill_mod
from genesis_fp16.cli import app
from genesis_fp16.drill import ScenarioResult, run_drill

runner = CliRunner()
NAMES = {"nan_storm", "overflow_storm", "overflow_warning", "killed_while_saving",
         "rollback_survives_restart", "kill_switch", "silent_degradation", "healthy_control", "events_recorded"}


def test_drill_command_passes_and_writes_json(state_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("ENABLE_FP16_TRAINING", "false")  # the drill rehearses rollback even under the kill switch
    out = tmp_path / "out.json"
    result = runner.invoke(app, ["drill", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
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
    monkeypatch.setattr(drill_mod.Drill, "kill_switch", lambda self: ScenarioResult("kill_switch", False, "broken", 0.0))
    monkeypatch.setattr(drill_mod.Drill, "scenarios", lambda self: [("kill_switch", self.kill_switch), ("overflow_storm", self.overflow_storm)])
    result = runner.invoke(app, ["drill"])
    assert result.exit_code == 1
    assert "FAILED: kill_switch" in result.stdout


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
    from genesis_fp16 import telemetry

    monkeypatch.setattr(drill_mod.Drill, "scenarios", lambda self: [("kill_switch", self.kill_switch)])
    telemetry._CONFIGURED.clear()
    report = run_drill()
    assert report["passed"]
    assert telemetry.events_path() == state_dir / "events.jsonl"
    telemetry.get_logger("test").warning("after.drill")
    events = telemetry.read_events(state_dir / "events.jsonl")
    assert any(e.get("event") == "after.drill" for e in events)

"""Rollout ledger: stages, history, shadow gaps, persistence across processes,
concurrent writers, and the rollout CLI."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from genesis_fp16.cli import app
from genesis_fp16.rollout.ledger import LEDGER_FILE, SCHEMA_VERSION, LedgerError, RolloutLedger, current_stage
from genesis_fp16.base.settings import load_settings

runner = CliRunner()


@pytest.fixture
def ledger(state_dir):
    return RolloutLedger.from_settings(load_settings())


def test_unknown_agent_has_no_stage_and_reading_creates_no_file(state_dir):
    assert current_stage("nobody", load_settings()) is None
    assert not (state_dir / LEDGER_FILE).exists()


def test_stages_and_history(ledger, state_dir):
    assert ledger.stage("wm") is None
    ledger.enable("wm", shadow=True, actor="alice", reason="start shadow")
    ledger.enable("wm", actor="alice", reason="gap small")
    ledger.rollback("wm", "val loss 40% over FP32", actor="guard", severity="P1")
    ledger.disable("wm", actor="bob", reason="done")
    assert ledger.stage("wm") == "off"
    assert (state_dir / LEDGER_FILE).is_file()
    hist = ledger.history("wm")
    assert [(h["from_stage"], h["to_stage"]) for h in hist] == [
        (None, "shadow"),
        ("shadow", "on"),
        ("on", "rolled_back"),
        ("rolled_back", "off"),
    ]
    assert hist[2]["actor"] == "guard" and hist[2]["severity"] == "P1" and "40%" in hist[2]["reason"]
    assert all(h["when"] for h in hist)
    assert hist[0]["when"] < hist[-1]["when"]
    assert ledger.history("other") == []


def test_wal_mode(ledger):
    ledger.enable("a")
    conn = sqlite3.connect(ledger.path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_rollback_needs_reason_and_stage_is_validated(ledger):
    with pytest.raises(ValueError, match="needs a reason"):
        ledger.rollback("a", "  ")
    with pytest.raises(ValueError, match="allowed values are off, shadow, on, rolled_back"):
        ledger._set_stage("a", "half", "me", "x")
    with pytest.raises(ValueError, match="severity 'P9'"):
        ledger.rollback("a", "x", severity="P9")
    with pytest.raises(ValueError, match="non-empty"):
        ledger.enable("")


def test_shadow_gap_recorded_and_in_status(ledger):
    ledger.enable("wm", shadow=True)
    rec = ledger.record_shadow_gap("wm", val_loss=0.30, fp32_val_loss=0.25, precision="bf16")
    assert rec["gap"] == pytest.approx(0.2)
    ledger.record_shadow_gap("wm", val_loss=0.1, fp32_val_loss=0.0, precision="bf16")  # gap undefined, still recorded
    gaps = ledger.shadow_gaps("wm")
    assert len(gaps) == 2 and gaps[1]["gap"] is None
    row = ledger.status()[0]
    assert row["agent"] == "wm" and row["stage"] == "shadow"
    assert row["last_shadow_gap"]["val_loss"] == pytest.approx(0.1)


def test_shadow_gap_with_nan_loss_is_recorded(ledger):
    # a reduced-precision run that diverged to NaN is exactly what shadow mode must record;
    # SQLite binds NaN as NULL, which the NOT NULL columns refused (IntegrityError)
    import math

    ledger.enable("wm", shadow=True)
    rec = ledger.record_shadow_gap("wm", val_loss=float("nan"), fp32_val_loss=0.25, precision="fp16")
    assert math.isnan(rec["val_loss"]) and rec["gap"] is None
    ledger.record_shadow_gap("wm", val_loss=0.3, fp32_val_loss=float("nan"), precision="fp16")
    gaps = ledger.shadow_gaps("wm")
    assert len(gaps) == 2
    assert math.isnan(gaps[0]["val_loss"]) and gaps[0]["fp32_val_loss"] == pytest.approx(0.25)
    assert math.isnan(gaps[1]["fp32_val_loss"]) and gaps[1]["gap"] is None
    assert math.isnan(ledger.status()[0]["last_shadow_gap"]["fp32_val_loss"])


def test_corrupt_ledger_is_one_clear_error(state_dir):
    (state_dir / LEDGER_FILE).write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(LedgerError, match="rollout.sqlite: rollout ledger is not a usable SQLite database"):
        RolloutLedger.from_settings(load_settings()).stage("a")


def _error_line(result) -> str:
    """The one ``error:`` line a failed command printed, and no traceback."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "kind, named",
    [
        ("directory", "is a directory"),
        ("fifo", "is a FIFO"),
        ("dev_zero", "is a character device (a symlink to /dev/zero)"),
    ],
)
@pytest.mark.parametrize(
    "command",
    [
        ["rollout", "status"],
        ["rollout", "history"],
        ["rollout", "enable", "wm"],
        ["profiles", "show"],
        ["profiles", "show", "wm"],
    ],
)
def test_a_ledger_path_that_is_not_a_file_is_named_as_such(state_dir, kind, named, command):
    """Issue 52 (D9): a directory, a FIFO or /dev/zero at the ledger's path was "I/O error ... check the disk", and
    ``profiles show`` read it as an empty ledger (exit 0); it is one line naming what is there, and nothing is read."""
    path = state_dir / LEDGER_FILE
    {"directory": path.mkdir, "fifo": lambda: os.mkfifo(path), "dev_zero": lambda: path.symlink_to("/dev/zero")}[kind]()
    result = runner.invoke(app, command)
    assert result.exit_code == 2, result.output
    assert f"rollout ledger {path} {named}, expected a regular file" in _error_line(result)


def test_a_byte_flipped_ledger_is_one_line_for_status(ledger, state_dir):
    """Issue 52 (D6): a flipped byte in a table's page made ``rollout status`` exit with a traceback."""
    ledger.enable("wm", shadow=True)
    path = state_dir / LEDGER_FILE
    conn = sqlite3.connect(path)
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'stages'").fetchone()[0]
    conn.close()
    data = bytearray(path.read_bytes())
    data[(root - 1) * page_size] ^= 0xFF  # the page's b-tree type
    path.write_bytes(bytes(data))
    for command in (["rollout", "status"], ["rollout", "status", "--json"], ["profiles", "show"]):
        result = runner.invoke(app, command)
        assert result.exit_code == 2, result.output
        line = _error_line(result)
        assert "rollout ledger is not a usable SQLite database (database disk image is malformed)" in line


def test_rollback_persists_across_a_new_process(ledger, state_dir):
    ledger.enable("wm")
    ledger.rollback("wm", "NaN storm", severity="P0")
    code = (
        "import json; from genesis_fp16.rollout.policy import resolve_policy\n"
        "p = resolve_policy('wm', precision='bf16')\n"
        "print(json.dumps([p.stage, p.precision, p.sources['enabled']]))"
    )
    env = dict(os.environ, GENESIS_FP16_STATE_DIR=str(state_dir), GENESIS_FP16_LOG_LEVEL="ERROR")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["rolled_back", "fp32", "ledger:rolled_back"]


def test_concurrent_processes_do_not_corrupt(state_dir):
    writes = 15
    code = (
        "import sys; from genesis_fp16.rollout.ledger import RolloutLedger\n"
        "led = RolloutLedger(sys.argv[1]); me = sys.argv[2]\n"
        f"for i in range({writes}):\n"
        "    (led.enable if i % 2 else led.disable)('shared', actor=me, reason=f'{me} {i}')\n"
        "    led.enable(me, actor=me, reason=str(i))\n"
    )
    path = state_dir / LEDGER_FILE
    RolloutLedger(path).initialise()
    env = dict(os.environ, GENESIS_FP16_LOG_LEVEL="ERROR")
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(path), f"p{k}"], env=env, stderr=subprocess.PIPE)
        for k in range(3)
    ]
    for proc in procs:
        assert proc.wait(timeout=120) == 0, proc.stderr.read().decode()[-2000:]
    led = RolloutLedger(path)
    assert len(led.history("shared")) == 3 * writes
    assert all(len(led.history(f"p{k}")) == writes for k in range(3))
    assert led.stage("shared") in ("on", "off")
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()


def test_cli_enable_status_rollback_history(state_dir):
    r = runner.invoke(app, ["rollout", "enable", "wm", "--shadow", "--reason", "try"])
    assert r.exit_code == 0, r.output
    assert "unmanaged -> shadow" in r.stdout
    r = runner.invoke(app, ["rollout", "rollback", "wm"])
    assert r.exit_code != 0  # --reason is required
    r = runner.invoke(app, ["rollout", "rollback", "wm", "--reason", "gap too big"])
    assert r.exit_code == 0 and "shadow -> rolled_back" in r.stdout
    r = runner.invoke(app, ["rollout", "status", "--json"])
    data = json.loads(r.stdout)
    assert data["kill_switch"] is False
    assert data["agents"][0]["stage"] == "rolled_back" and data["agents"][0]["reason"] == "gap too big"
    r = runner.invoke(app, ["rollout", "history", "wm", "--json"])
    assert [h["to_stage"] for h in json.loads(r.stdout)] == ["shadow", "rolled_back"]
    r = runner.invoke(app, ["rollout", "disable", "wm"])
    assert r.exit_code == 0 and RolloutLedger.from_settings(load_settings()).stage("wm") == "off"


def test_cli_json_is_strict_with_a_nan_shadow_gap(state_dir):
    ledger = RolloutLedger.from_settings(load_settings())
    ledger.enable("wm", shadow=True)
    ledger.record_shadow_gap("wm", val_loss=float("nan"), fp32_val_loss=0.25, precision="fp16")
    r = runner.invoke(app, ["rollout", "status", "--json"])
    assert r.exit_code == 0, r.output

    def refuse(token):
        raise AssertionError(f"non-standard JSON token {token}")

    data = json.loads(r.stdout, parse_constant=refuse)  # jq and browsers refuse bare NaN
    assert data["agents"][0]["last_shadow_gap"]["val_loss"] == "nan"


def test_cli_enable_under_kill_switch_warns(state_dir, monkeypatch):
    monkeypatch.setenv("ENABLE_FP16_TRAINING", "false")
    r = runner.invoke(app, ["rollout", "enable", "wm"])
    assert r.exit_code == 0
    assert "kill switch" in r.stdout
    data = json.loads(runner.invoke(app, ["rollout", "status", "--json"]).stdout)
    assert data["kill_switch"] is True


def test_concurrent_cli_commands(state_dir):
    env = dict(os.environ, GENESIS_FP16_LOG_LEVEL="ERROR")
    commands = [["rollout", "enable", "wm", "--shadow"], ["rollout", "rollback", "wm", "--reason", "cli race"]]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "genesis_fp16.cli", *c], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for c in commands
    ]
    for proc in procs:
        assert proc.wait(timeout=120) == 0, proc.stderr.read().decode()[-2000:]
    led = RolloutLedger.from_settings(load_settings())
    hist = led.history("wm")
    assert len(hist) == 2 and led.stage("wm") == hist[-1]["to_stage"]
    assert hist[1]["from_stage"] == hist[0]["to_stage"]  # serialised: the second saw the first's write


def test_cli_prints_markup_like_reason_literally_and_keeps_working(state_dir):
    # a reason that is not valid rich markup used to be saved, then crash every later status/history
    r = runner.invoke(app, ["rollout", "rollback", "a", "--reason", "[/bold]"])
    assert r.exit_code == 0, r.output
    assert "a: unmanaged -> rolled_back ([/bold])" in r.stdout
    for command in (["rollout", "status"], ["rollout", "history"]):
        r = runner.invoke(app, command)
        assert r.exit_code == 0, r.output
        assert "[/bold]" in r.stdout, command


def test_cli_shows_markup_like_agent_name_literally(state_dir):
    r = runner.invoke(app, ["rollout", "enable", "[red]x", "--reason", "[b]why"])
    assert r.exit_code == 0, r.output
    assert "[red]x: unmanaged -> on ([b]why)" in r.stdout
    for command in (["rollout", "status"], ["rollout", "history"], ["profiles", "show", "[red]x"]):
        r = runner.invoke(app, command)
        assert r.exit_code == 0, r.output
        assert "[red]x" in r.stdout, command
    assert "[b]why" in runner.invoke(app, ["rollout", "history"]).stdout


def test_cli_never_prints_raw_control_characters_from_the_ledger(state_dir):
    r = runner.invoke(app, ["rollout", "rollback", "a", "--reason", "\x1b[31m\x07"])
    assert r.exit_code == 0, r.output
    outputs = [r.output]
    for command in (["rollout", "status"], ["rollout", "history"]):
        r = runner.invoke(app, command)
        assert r.exit_code == 0, r.output
        outputs.append(r.output)
        assert "\\x1b[31m\\x07" in r.stdout, command
    for text in outputs:
        assert "\x1b" not in text and "\x07" not in text


def test_stage_changed_event_carries_the_history_row(state_dir):
    from genesis_fp16.base import telemetry

    ledger = RolloutLedger.from_settings(load_settings())
    entry = ledger.rollback("wm", "too many overflows", actor="guard", severity="P1")
    events = [e for e in telemetry.read_events(state_dir / "events.jsonl") if e["event"] == "rollout.stage_changed"]
    fields = {k: events[-1][k] for k in ("agent", "from_stage", "to_stage", "actor", "reason", "severity")}
    assert fields == {k: entry[k] for k in fields} and events[-1]["ledger"] == str(ledger.path)


def test_cli_status_piped_shows_whole_timestamps_and_reasons(state_dir):
    # piped, not a terminal: rich would otherwise fit the table into 80 columns and cut the time
    reason = "a reason long enough to push the table well past eighty columns on its own"
    ledger = RolloutLedger.from_settings(load_settings())
    ledger.enable("agent_with_a_rather_long_name", shadow=True, reason=reason)
    since = ledger.status()[0]["since"]
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.run(
        [sys.executable, "-m", "genesis_fp16.cli", "rollout", "status"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    (row,) = [line for line in proc.stdout.splitlines() if "agent_with_a_rather_long_name" in line]
    assert since in row and reason in row and len(since) >= len("2026-01-01T00:00:00")


# -- schema versions, reset, the latest quality checks -----------------------------------------

_V1_SCHEMA = """
CREATE TABLE stages (agent TEXT PRIMARY KEY, stage TEXT NOT NULL, updated_at TEXT NOT NULL, actor TEXT NOT NULL,
    reason TEXT NOT NULL);
CREATE TABLE history (id INTEGER PRIMARY KEY AUTOINCREMENT, agent TEXT NOT NULL, at TEXT NOT NULL, actor TEXT NOT NULL,
    from_stage TEXT, to_stage TEXT NOT NULL, reason TEXT NOT NULL, severity TEXT);
CREATE TABLE shadow_gaps (id INTEGER PRIMARY KEY AUTOINCREMENT, agent TEXT NOT NULL, at TEXT NOT NULL,
    val_loss REAL NOT NULL, fp32_val_loss REAL NOT NULL, gap REAL, precision TEXT NOT NULL);
CREATE TABLE recommendations (id INTEGER PRIMARY KEY AUTOINCREMENT, agent TEXT NOT NULL, at TEXT NOT NULL,
    severity TEXT, changes TEXT NOT NULL, reason TEXT NOT NULL);
CREATE TABLE quality_checks (id INTEGER PRIMARY KEY AUTOINCREMENT, agent TEXT NOT NULL, at TEXT NOT NULL,
    kind TEXT NOT NULL, precision TEXT, alarm INTEGER, metrics TEXT NOT NULL);
CREATE TABLE good_checkpoints (agent TEXT PRIMARY KEY, path TEXT NOT NULL, at TEXT NOT NULL);
INSERT INTO stages VALUES ('wm', 'on', '2026-01-01T00:00:00+00:00', 'cli', 'enabled (on)');
INSERT INTO history (agent, at, actor, from_stage, to_stage, reason)
    VALUES ('wm', '2026-01-01T00:00:00+00:00', 'cli', NULL, 'on', 'enabled (on)');
"""


def test_a_ledger_without_schema_version_is_migrated_in_place(state_dir):
    path = state_dir / LEDGER_FILE
    conn = sqlite3.connect(path)
    conn.executescript(_V1_SCHEMA)
    conn.close()
    ledger = RolloutLedger(path)
    assert ledger.stage("wm") == "on" and ledger.guard_window("wm", "canary") == []
    assert ledger.push_guard_outcome("wm", "canary", True, keep=3) == [True]
    ledger.reset("wm")  # a history row with no to_stage: the old NOT NULL is gone
    assert [h["to_stage"] for h in ledger.history("wm")] == ["on", None]
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
    conn.close()
    assert RolloutLedger(path).stage("wm") is None  # the migrated ledger opens as current
    tables = {row[0] for row in sqlite3.connect(path).execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "calibrations" in tables  # version 3 added the (now unused) calibrations table


def test_a_ledger_from_a_newer_version_is_refused(state_dir):
    path = state_dir / LEDGER_FILE
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(LedgerError, match="schema version 99, newer"):
        RolloutLedger(path).stage("wm")


def test_stages_and_severities_are_str_enums(ledger):
    from genesis_fp16.rollout.ledger import Severity, Stage

    entry = ledger.rollback("wm", "bad", severity="P1")
    assert entry["to_stage"] is Stage.ROLLED_BACK and entry["severity"] is Severity.P1
    assert ledger.stage("wm") == "rolled_back" and f"{ledger.stage('wm')}" == "rolled_back"
    assert json.dumps(ledger.history("wm")[-1]["to_stage"]) == '"rolled_back"'


def test_reset_forgets_the_stage_and_keeps_history(ledger):
    ledger.enable("wm", shadow=True)
    ledger.rollback("wm", "gap", severity="P1")
    ledger.push_guard_outcome("wm", "shadow", True, keep=3)
    entry = ledger.reset("wm", actor="ops", reason="start over")
    assert entry["from_stage"] == "rolled_back" and entry["to_stage"] is None
    assert ledger.stage("wm") is None and current_stage("wm", load_settings()) is None
    assert [h["to_stage"] for h in ledger.history("wm")] == ["shadow", "rolled_back", None]
    assert ledger.history("wm")[-1]["reason"] == "start over" and ledger.guard_window("wm", "shadow") == []
    assert [row["agent"] for row in ledger.status()] == []
    with pytest.raises(ValueError, match="'wm' has no stage .* nothing to reset"):
        ledger.reset("wm")


def test_cli_reset(state_dir):
    runner.invoke(app, ["rollout", "rollback", "wm", "--reason", "gap too big"])
    r = runner.invoke(app, ["rollout", "reset", "wm", "--reason", "new profile"])
    assert r.exit_code == 0, r.output
    assert "wm: rolled_back -> unmanaged (new profile)" in r.stdout and "settings" in r.stdout
    r = runner.invoke(app, ["rollout", "history", "wm", "--json"])
    assert [h["to_stage"] for h in json.loads(r.stdout)] == ["rolled_back", None]
    assert "(reset)" in runner.invoke(app, ["rollout", "history", "wm"]).stdout
    r = runner.invoke(app, ["rollout", "reset", "wm"])
    assert r.exit_code == 2 and "nothing to reset" in r.output


def test_status_shows_the_latest_quality_check_of_each_kind(ledger):
    ledger.enable("wm")
    ledger.record_shadow_gap("wm", val_loss=0.30, fp32_val_loss=0.25, precision="bf16")
    ledger.record_quality_check(
        "wm", "canary", {"val_loss_ratio": 1.6, "alarms": 1, "confirmed": False}, "bf16", alarm=True
    )
    ledger.record_quality_check(
        "wm", "canary", {"val_loss_ratio": 1.01, "alarms": 1, "confirmed": False}, "bf16", alarm=False
    )
    ledger.record_quality_check("wm", "inference_gap", {"val_loss": 0.3, "fp32_val_loss": 0.297, "gap": 0.01}, "bf16")
    checks = ledger.status()[0]["last_checks"]
    assert checks["canary"]["metrics"]["val_loss_ratio"] == 1.01 and checks["canary"]["at"]
    assert checks["shadow_gap"]["gap"] == pytest.approx(0.2) and checks["policy_canary"] is None
    r = runner.invoke(app, ["rollout", "status"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "latest quality checks" in r.stdout
    lines = {
        line.split("│")[2].strip(): line for line in r.stdout.splitlines() if line.count("│") >= 4 and "wm" in line
    }
    assert (
        "+20.0%" in lines["shadow gap"] and "ok: 1.010x FP32" in lines["canary"] and "+1.0%" in lines["inference gap"]
    )
    assert checks["canary"]["at"] in lines["canary"]
    data = json.loads(runner.invoke(app, ["rollout", "status", "--json"]).stdout)
    assert data["agents"][0]["last_checks"]["inference_gap"]["metrics"]["gap"] == 0.01


@pytest.mark.parametrize("name", ["/elsewhere/x", "../x", "..", ".hidden", "a b", "x" * 129])
def test_ledger_refuses_a_bad_agent_name_naming_the_rule(ledger, name):
    for write in (
        lambda: ledger.enable(name),
        lambda: ledger.set_last_good_checkpoint(name, "x.pt"),
        lambda: ledger.stage(name),
    ):
        with pytest.raises(ValueError, match="an agent name is 1 to 128 characters of letters, digits"):
            write()
    assert ledger.status() == []


@pytest.mark.parametrize(
    "command",
    [
        ["rollout", "enable", "../x"],
        ["rollout", "rollback", "/elsewhere/x", "--reason", "r"],
        ["rollout", "reset", ".."],
        ["rollout", "history", "a/b"],
        ["profiles", "show", "../x"],
    ],
)
def test_cli_refuses_a_bad_agent_name_in_one_line_before_touching_the_ledger(state_dir, command):
    r = runner.invoke(app, command)
    assert r.exit_code == 2, r.output
    assert "invalid agent name" in r.output and "Traceback" not in r.output
    assert not (state_dir / LEDGER_FILE).exists()


def test_status_lists_every_agent_that_trained_enrolled_or_not(state_dir):
    """Issue 44: after a default `evolve`, `rollout status` said "no agents in
    the ledger yet" although the world model and the critic had trained with
    decisions of their own. Every guarded training call is recorded now."""
    import torch

    from genesis_fp16.training.guarded import UNGUARDED, GuardedTraining

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    training = GuardedTraining(
        "learner.Task-v0",
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        precision="fp32",
        guard=UNGUARDED,
        checkpoint_every=0,
    )
    batch = (torch.randn(8, 3), torch.randn(8, 1))
    training.run([batch] * 3, lambda m, b: ((m(b[0]) - b[1]) ** 2).mean(), val_fn=lambda m, t: 0.5)
    ledger = RolloutLedger.from_settings(load_settings())
    ledger.enable("enrolled", actor="test")
    rows = {row["agent"]: row for row in ledger.status()}
    assert set(rows) == {"enrolled", "learner.Task-v0"}
    row = rows["learner.Task-v0"]
    assert row["stage"] is None and row["reason"] == "not enrolled: the settings decide"
    assert row["last_training"]["precision"] == "fp32" and row["last_training"]["alarm"] is False
    assert (
        row["last_training"]["metrics"]["source"] == "explicit"
        and row["last_training"]["metrics"]["outcome"] == "healthy"
    )
    assert rows["enrolled"]["last_training"] is None
    result = runner.invoke(app, ["rollout", "status"])
    assert (
        result.exit_code == 0
        and "not enrolled" in result.output
        and "learner.Task-v0" in result.output.replace("\n", "")
    )

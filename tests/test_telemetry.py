import json
import threading

import pytest
from typer.testing import CliRunner

from genesis_fp16 import telemetry
from genesis_fp16.cli import app
from genesis_fp16.settings import load_settings


@pytest.fixture(autouse=True)
def _settings_decide_the_console_level():
    """A ``-v`` run sets a process-wide console level; no test leaves it behind."""
    telemetry.set_console_level(None)
    yield
    telemetry.set_console_level(None)


def _names(path):
    return [e["event"] for e in telemetry.read_events(path)]


def test_events_go_to_jsonl_under_state_dir(state_dir):
    log = telemetry.get_logger("test")
    log.info("test.hello", answer=42, path=state_dir)
    events = telemetry.read_events(load_settings().events_path)
    assert events[-1]["event"] == "test.hello" and events[-1]["answer"] == 42
    assert events[-1]["level"] == "info" and "timestamp" in events[-1]


def test_concurrent_writers_never_interleave(state_dir):
    log = telemetry.get_logger("test")

    def spam(i):
        for j in range(50):
            log.info("test.spam", writer=i, n=j, blob="x" * 200)

    threads = [threading.Thread(target=spam, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    events = [e for e in telemetry.read_events(load_settings().events_path) if e["event"] == "test.spam"]
    assert len(events) == 200


def test_torn_last_line_is_skipped_but_garbage_in_middle_fails(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps({"event": "a"}) + "\n" + '{"event": "b", "trunc')
    assert [e["event"] for e in telemetry.read_events(path)] == ["a"]
    path.write_text("garbage\n" + json.dumps({"event": "a"}) + "\n")
    with pytest.raises(ValueError, match=":1:"):
        telemetry.read_events(path)


def test_json_log_format(monkeypatch, capsys):
    monkeypatch.setenv("GENESIS_FP16_LOG_FORMAT", "json")
    telemetry.configure_logging(force=True)
    telemetry.get_logger("test").warning("test.machine", k=1)
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert json.loads(line)["event"] == "test.machine"


def test_info_goes_to_the_file_but_not_to_the_terminal_by_default(state_dir, capsys):
    log = telemetry.get_logger("test")
    log.info("test.quiet", k=1)
    log.warning("test.loud", k=2)
    err = capsys.readouterr().err
    assert "test.loud" in err and "test.quiet" not in err
    assert _names(state_dir / "events.jsonl") == ["test.quiet", "test.loud"]


def test_console_level_setting_shows_info(state_dir, capsys, monkeypatch):
    monkeypatch.setenv("GENESIS_FP16_CONSOLE_LOG_LEVEL", "info")
    telemetry.configure_logging(force=True)
    telemetry.get_logger("test").info("test.shown")
    assert "test.shown" in capsys.readouterr().err
    assert _names(state_dir / "events.jsonl") == ["test.shown"]


def test_file_level_is_separate_from_the_console_level(state_dir, capsys, monkeypatch):
    monkeypatch.setenv("GENESIS_FP16_LOG_LEVEL", "WARNING")
    monkeypatch.setenv("GENESIS_FP16_CONSOLE_LOG_LEVEL", "DEBUG")
    telemetry.configure_logging(force=True)
    log = telemetry.get_logger("test")
    log.debug("test.debug")
    log.warning("test.warning")
    err = capsys.readouterr().err
    assert "test.debug" in err and "test.warning" in err
    assert _names(state_dir / "events.jsonl") == ["test.warning"]


def test_console_shows_control_characters_as_escapes(state_dir, capsys):
    telemetry.get_logger("test").warning("test.reason", reason="\x1b[31mred\x07", path=state_dir / "a\x1bb")
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err
    assert "reason=\\x1b[31mred\\x07" in err
    assert _names(state_dir / "events.jsonl") == ["test.reason"]
    assert telemetry.read_events(state_dir / "events.jsonl")[0]["reason"] == "\x1b[31mred\x07"  # the file keeps the text


def test_cli_is_quiet_by_default_and_verbose_with_v(state_dir):
    runner = CliRunner()
    quiet = runner.invoke(app, ["rollout", "enable", "wm"])
    assert quiet.exit_code == 0, quiet.output
    assert "rollout.stage_changed" not in quiet.output and "info" not in quiet.stderr
    assert "wm: unmanaged -> on" in quiet.stdout
    loud = runner.invoke(app, ["-v", "rollout", "disable", "wm"])
    assert loud.exit_code == 0, loud.output
    assert "rollout.stage_changed" in loud.stderr and "to_stage=off" in loud.stderr
    again = runner.invoke(app, ["rollout", "enable", "wm"])  # -v lasts one invocation
    assert "rollout.stage_changed" not in again.output
    events = [e for e in telemetry.read_events(state_dir / "events.jsonl") if e["event"] == "rollout.stage_changed"]
    assert [e["to_stage"] for e in events] == ["on", "off", "on"]  # the file has all of them


def test_verbose_is_a_documented_global_option():
    result = CliRunner().invoke(app, ["--help"])
    assert "--verbose" in result.stdout and "-v" in result.stdout

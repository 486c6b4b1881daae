import json
import threading

import pytest
from typer.testing import CliRunner

from genesis_fp16.base import telemetry
from genesis_fp16.cli import app
from genesis_fp16.base.settings import load_settings


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


def test_quiet_console_keeps_errors_in_the_file_only_unless_verbose(state_dir, capsys):
    try:
        telemetry.configure_logging(load_settings(), force=True, quiet_console=True)
        telemetry.get_logger("t").error("injected.fault")
        assert "injected.fault" not in capsys.readouterr().err
        telemetry.set_console_level(telemetry.LogLevel.INFO)  # -v: the caller asked to see them
        telemetry.configure_logging(load_settings(), force=True, quiet_console=True)
        telemetry.get_logger("t").info("asked.for")
        assert "asked.for" in capsys.readouterr().err
    finally:
        telemetry.set_console_level(None)
        telemetry.configure_logging(force=True)
    names = [e["event"] for e in telemetry.read_events(state_dir / "events.jsonl")]
    assert "injected.fault" in names and "asked.for" in names


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
    assert (
        telemetry.read_events(state_dir / "events.jsonl")[0]["reason"] == "\x1b[31mred\x07"
    )  # the file keeps the text


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


# -- rotation of events.jsonl ----------------------------------------------------------


def _sink_event(sink, writer, n):
    sink(None, "info", {"event": "test.rotate", "level": "info", "writer": writer, "n": n, "pad": "x" * 60})


def _log_files(path):
    return sorted(
        p.name for p in path.parent.iterdir() if p.name.startswith(path.name) and not p.name.endswith(".lock")
    )


def _assert_gap_free_tails(path, writers, count, max_bytes):
    """Each writer's kept events are a gap-free tail of what it wrote (a writer
    that finished early may be rotated out entirely), and every rotated file was
    full when it was rotated: nothing inside the kept window was lost."""
    records = _valid_lines(path)
    for writer in range(writers):
        mine = sorted(r["n"] for r in records if r["writer"] == writer)
        assert mine == list(range(count - len(mine), count)), writer
    assert records and len(records) == len({(r["writer"], r["n"]) for r in records})
    longest = max(len(json.dumps(r, sort_keys=True)) + 1 for r in records)
    for rotated in telemetry.rotated_files(path):
        assert max_bytes - longest < rotated.stat().st_size <= max_bytes, rotated.name


def _valid_lines(path):
    """Every line of every file of the log, parsed; fails on any torn or invalid line."""
    records = []
    for p in path.parent.iterdir():
        if p.name.startswith(path.name) and not p.name.endswith(".lock"):
            for line in p.read_text(encoding="utf-8").splitlines():
                records.append(json.loads(line))
    return records


def test_rotation_keeps_at_most_keep_plus_one_files_and_loses_nothing_recent(tmp_path):
    path = tmp_path / "events.jsonl"
    sink = telemetry.JsonlSink(path, max_bytes=1000, keep=2)
    for n in range(200):
        _sink_event(sink, 0, n)
    assert _log_files(path) == ["events.jsonl", "events.jsonl.1", "events.jsonl.2"]
    assert all((tmp_path / name).stat().st_size <= 1000 for name in _log_files(path))
    assert len(_valid_lines(path)) == len(telemetry.read_events(path, include_rotated=True))
    kept = [e["n"] for e in telemetry.read_events(path, include_rotated=True)]
    assert kept == list(range(kept[0], 200)) and len(kept) > 10  # oldest first, no gap up to the last event
    assert [e["n"] for e in telemetry.read_events(path)] == kept[-len(telemetry.read_events(path)) :]


def test_rotation_disabled_with_zero_max_bytes(tmp_path):
    path = tmp_path / "events.jsonl"
    sink = telemetry.JsonlSink(path, max_bytes=0, keep=2)
    for n in range(50):
        _sink_event(sink, 0, n)
    assert _log_files(path) == ["events.jsonl"] and len(telemetry.read_events(path)) == 50


def test_rotation_from_settings(state_dir, monkeypatch):
    monkeypatch.setenv("GENESIS_FP16_EVENTS_MAX_BYTES", "2000")
    monkeypatch.setenv("GENESIS_FP16_EVENTS_KEEP", "1")
    telemetry.configure_logging(force=True)
    log = telemetry.get_logger("test")
    for n in range(100):
        log.info("test.rotate", n=n)
    assert _log_files(state_dir / "events.jsonl") == ["events.jsonl", "events.jsonl.1"]
    kept = [e["n"] for e in telemetry.read_events(state_dir / "events.jsonl", include_rotated=True)]
    assert kept == list(range(kept[0], 100))


def test_rotation_under_concurrent_threads_tears_and_loses_nothing(tmp_path):
    path = tmp_path / "events.jsonl"
    sinks = [telemetry.JsonlSink(path, max_bytes=1500, keep=3) for _ in range(2)]  # two configurations in one process

    def spam(writer):
        for n in range(150):
            _sink_event(sinks[writer % 2], writer, n)

    threads = [threading.Thread(target=spam, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(_log_files(path)) == 4
    _assert_gap_free_tails(path, writers=4, count=150, max_bytes=1500)


def _append_events(path, writer, count):
    sink = telemetry.JsonlSink(path, max_bytes=3000, keep=3)
    for n in range(count):
        _sink_event(sink, writer, n)


def test_rotation_under_concurrent_processes_tears_and_loses_nothing(tmp_path):
    import multiprocessing

    path = tmp_path / "events.jsonl"
    fork = multiprocessing.get_context("fork")  # no interpreter start-up: the test stays fast
    procs = [fork.Process(target=_append_events, args=(path, w, 300)) for w in range(3)]
    try:
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(timeout=60)
            assert proc.exitcode == 0
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join()
    assert len(_log_files(path)) == 4
    _assert_gap_free_tails(path, writers=3, count=300, max_bytes=3000)


def test_read_events_of_a_just_rotated_log(tmp_path):
    path = tmp_path / "events.jsonl"
    (tmp_path / "events.jsonl.1").write_text(json.dumps({"event": "b"}) + "\n")
    (tmp_path / "events.jsonl.2").write_text(json.dumps({"event": "a"}) + "\n")
    assert [e["event"] for e in telemetry.read_events(path, include_rotated=True)] == ["a", "b"]
    with pytest.raises(FileNotFoundError):
        telemetry.read_events(path)


def test_tune_reads_the_rotated_files_too(state_dir):
    path = state_dir / "events.jsonl"
    rollback = {
        "event": "rollout.stage_changed",
        "agent": "wm",
        "to_stage": "rolled_back",
        "actor": "guard",
        "reason": "x",
    }
    (state_dir / "events.jsonl.1").write_text(json.dumps(rollback) + "\n")
    path.write_text(json.dumps(rollback) + "\n")
    runner = CliRunner()
    both = runner.invoke(app, ["tune", "--events", str(path), "--json"])
    assert both.exit_code == 0, both.output
    assert json.loads(both.stdout)["proposals"][0]["evidence"]["rollbacks"] == 2
    one = runner.invoke(app, ["tune", "--events", str(path), "--json", "--no-rotated"])
    assert one.exit_code == 0, one.output
    assert json.loads(one.stdout)["proposals"] == []

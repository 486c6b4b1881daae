import json
import threading

import pytest

from genesis_fp16 import telemetry
from genesis_fp16.settings import load_settings


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

"""The host cache of ``auto``'s measured decisions read as untrusted input
(genesis_fp16/precision/cache.py, genesis_fp16/precision/calibration.py's
`parse_record`; issue 44, item 3): an entry is used only when its key and
workload are this workload's and its verdict follows from its own figures;
a file that is not a regular file of our format reads as absent with one
warning, never blocks, never raises, and is never overwritten or deleted;
concurrent writers keep every entry; a decision says when, by which process
and under what load it was measured.

Nothing is timed: the calibrations are built from injected figures
(`calibration.measured`), and `autotune.measure_auto` is replaced where a
workload would be measured.
"""

from __future__ import annotations

import fcntl
import json
import multiprocessing
import os
import stat
import threading
from pathlib import Path

import pytest
import torch
from structlog.testing import capture_logs
from typer.testing import CliRunner

from genesis_fp16 import FP16TrainingConfig
from genesis_fp16.training.trainer import calibration_copies
from genesis_fp16.precision import measure as autotune
from genesis_fp16.precision import calibration as cal
from genesis_fp16.precision import record as calibration_record
from genesis_fp16.precision import cache as cc
from genesis_fp16.precision.cache import CacheRefused, PrecisionCache
from genesis_fp16.cli import app
from genesis_fp16.precision.decision import Source, decide

FAST_BF16 = {"fp32": 1.0e-3, "bf16": 0.5e-3, "fp16": 5e-3}  # bf16 2x, fp16 out at the probe: the verdict is bf16


def _workload(hidden: int = 4):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, hidden)
    optimizer = torch.optim.SGD(model.parameters(), 0.1)
    batch = (torch.randn(4, 8), torch.randn(4, hidden))
    return model, optimizer, batch, cal.workload(model, optimizer, batch, "cpu")


def _calibration(described, seconds=FAST_BF16) -> cal.Calibration:
    timed = [m for m in seconds if seconds[m] <= 2 * seconds["fp32"]]
    return cal.measured(
        cal.workload_key(described),
        described,
        dict(seconds),
        {m: 1.0 for m in timed},
        0.01,
        17,
        rounds={m: [seconds[m]] * cal.ROUNDS for m in timed},
    )


def _loss(model, batch):
    return torch.nn.functional.mse_loss(model(batch[0]), batch[1])


@pytest.fixture
def cache_path(state_dir) -> Path:
    """The cache path the settings name (conftest: under the test's state dir)."""
    return Path(os.environ["GENESIS_FP16_PRECISION_CACHE"])


@pytest.fixture
def measuring(monkeypatch):
    """`measure_auto` replaced: each call returns the injected figures' calibration of the workload, counted."""
    calls: list[str] = []

    def fake(model, optimizer, batch, loss_fn, *, copy_trainer=None, device=None):
        described = cal.workload(model, optimizer, batch, device or "cpu")
        calls.append(cal.workload_key(described))
        return _calibration(described)

    monkeypatch.setattr(autotune, "measure_auto", fake)
    return calls


def _within(seconds: float, fn):
    """``fn()``'s result, failing (not hanging) when it takes longer than ``seconds``."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised in the test's thread
            box["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still running after {seconds} s: it blocked"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _warnings(logs, event: str) -> list[dict]:
    return [e for e in logs if e["event"] == event and e["log_level"] == "warning"]


def _edit(path: Path, key: str, **changes) -> None:
    data = json.loads(path.read_text())
    data["calibrations"][key].update(changes)
    path.write_text(json.dumps(data))


def _doctor(*args: str):
    return CliRunner().invoke(app, ["doctor", "--json", *args])


# -- entries: used only when they are this workload's and their verdict follows from their figures --------------
def test_a_hand_edited_verdict_is_not_used_and_the_workload_is_measured_again(cache_path, measuring):
    model, optimizer, batch, described = _workload()
    PrecisionCache(cache_path).put(_calibration(described))
    key = cal.workload_key(described)
    assert autotune.cached_calibration(model, optimizer, batch, "cpu").precision == "bf16"
    _edit(cache_path, key, precision="fp16", reason="measured here: fp16 is the fastest")  # fp16 measured at 0.20x fp32
    with capture_logs() as logs:
        assert autotune.cached_calibration(model, optimizer, batch, "cpu") is None
        found = autotune.measured_auto(
            model,
            optimizer,
            batch,
            _loss,
            copy_trainer=calibration_copies(FP16TrainingConfig(), "cpu", "auto"),
            device="cpu",
        )
    assert not found.cached and found.calibration.precision == "bf16" and measuring == [key]
    ignored = _warnings(logs, "precision.cache_entry_ignored")
    assert len(ignored) == 1 and str(cache_path) in ignored[0]["reason"]
    assert "verdict 'fp16' does not follow from its own figures: today's rule gives 'bf16'" in ignored[0]["problem"]
    assert json.loads(cache_path.read_text())["calibrations"][key]["precision"] == "bf16"  # replaced by the measurement


@pytest.mark.parametrize(
    "edit",
    [
        {"passed": {"fp32": True, "bf16": True, "fp16": True}},  # fp16 was never checked
        {"speed": {"fp32": 1.0, "bf16": 2.0, "fp16": 3.0}},  # its seconds give 0.2
        {"speed_low": {"fp32": 1.0, "bf16": 9.0, "fp16": 0.2}},  # a lower bound above the median
    ],
)
def test_figures_that_contradict_each_other_are_not_used(cache_path, edit):
    model, optimizer, batch, described = _workload()
    PrecisionCache(cache_path).put(_calibration(described))
    _edit(cache_path, cal.workload_key(described), **edit)
    assert autotune.cached_calibration(model, optimizer, batch, "cpu") is None


def test_a_record_copied_from_another_host_under_this_hosts_key_is_not_used(cache_path, measuring):
    model, optimizer, batch, described = _workload()
    key = cal.workload_key(described)
    elsewhere = {**described, "device_name": "Another CPU", "cpu_flags": ["amx_bf16", "amx_tile"]}
    foreign = _calibration(elsewhere).as_record()  # a consistent record of that host's workload
    cache_path.write_text(
        json.dumps(
            {
                "format": cc.CACHE_FORMAT,
                "version": cc.CACHE_VERSION,
                "calibrations": {
                    key: foreign,  # filed under this host's key as it was
                    "k-with-its-key-edited": {**foreign, "key": "k-with-its-key-edited"},
                },
            }
        )
    )
    with capture_logs() as logs:
        assert autotune.cached_calibration(model, optimizer, batch, "cpu") is None
        assert PrecisionCache(cache_path).all() == []
    problems = " ".join(e["problem"] for e in _warnings(logs, "precision.cache_entry_ignored"))
    assert f"filed under {key!r}" in problems and "its key is not the hash of its workload" in problems
    # its key made this host's too: the workload still differs
    forged = {**foreign, "key": key}
    with pytest.raises(calibration_record.RecordError, match="its key is not the hash"):
        calibration_record.parse_record(forged, key=key, described=described)
    with pytest.raises(
        calibration_record.RecordError, match="its workload is not this one \\(cpu_flags, device_name differ"
    ):
        calibration_record.parse_record(foreign, described=described)
    found = autotune.measured_auto(
        model,
        optimizer,
        batch,
        _loss,
        copy_trainer=calibration_copies(FP16TrainingConfig(), "cpu", "auto"),
        device="cpu",
    )
    assert not found.cached and measuring == [key]


def test_a_record_of_an_older_version_is_absent_without_a_warning(cache_path):
    model, optimizer, batch, described = _workload()
    PrecisionCache(cache_path).put(_calibration(described))
    _edit(cache_path, cal.workload_key(described), version=2)
    with capture_logs() as logs:
        assert autotune.cached_calibration(model, optimizer, batch, "cpu") is None
    assert not [e for e in logs if e["log_level"] == "warning"]


@pytest.mark.parametrize(
    "changes, problem",
    [
        ({"at": 1764300000}, "at is 1764300000 (int), expected text"),
        ({"at": "yesterday"}, "expected an ISO 8601 time"),
        ({"steps": 1e308}, "steps is 1e+308, expected an integer"),
        ({"steps": True}, "steps is True, expected an integer"),
        ({"seconds": {"fp32": "fast", "bf16": 0.5e-3, "fp16": 5e-3}}, "seconds[fp32] is 'fast'"),
        ({"loss_ratio": {"fp32": 1.0, "bf16": "1.0", "fp16": None}}, "loss_ratio[bf16] is '1.0'"),
        ({"measured_by": "me"}, "measured_by is str, expected an object"),
        ({"workload": [1, 2]}, "workload is list, expected an object"),
        ({"seconds": {"fp32": 1.0e-3, "tf32": 0.5e-3}}, "seconds names 'tf32'"),
    ],
)
def test_an_entry_of_the_wrong_types_is_absent_with_one_warning(cache_path, changes, problem):
    model, optimizer, batch, described = _workload()
    PrecisionCache(cache_path).put(_calibration(described))
    _edit(cache_path, cal.workload_key(described), **changes)
    with capture_logs() as logs:
        assert autotune.cached_calibration(model, optimizer, batch, "cpu") is None
        assert PrecisionCache(cache_path).all() == []  # the same problem: not warned twice
    ignored = _warnings(logs, "precision.cache_entry_ignored")
    assert len(ignored) == 1 and problem in ignored[0]["problem"], ignored
    result = _doctor()
    assert result.exit_code == 0 and json.loads(result.stdout)["calibrations"] == []


# -- the file: a regular file of our format, read without blocking, bounded ---------------------------------
def _unreadable(cache_path: Path, what: str) -> None:
    """Read, written and doctored, ``cache_path`` is absent with one warning naming it and ``what``, and left as it
    was."""
    model, optimizer, batch, _ = _workload()
    before = os.lstat(cache_path)
    with capture_logs() as logs:
        assert _within(5, lambda: autotune.cached_calibration(model, optimizer, batch, "cpu")) is None
        assert _within(5, lambda: PrecisionCache(cache_path).all()) == []
    unreadable = _warnings(logs, "precision.cache_unreadable")
    assert len(unreadable) == 1 and unreadable[0]["path"] == str(cache_path) and what in unreadable[0]["problem"], (
        unreadable
    )
    with pytest.raises(CacheRefused, match="saving the measured decision refused, the file left alone"):
        _within(5, lambda: PrecisionCache(cache_path).put(_calibration(_workload()[3])))
    result = _within(30, lambda: _doctor())
    assert result.exit_code == 0 and result.exception is None, result.output
    data = json.loads(result.stdout)
    assert data["calibrations"] == [] and what in data["precision_cache_problem"]
    after = os.lstat(cache_path)
    assert (after.st_ino, after.st_mode, after.st_size) == (before.st_ino, before.st_mode, before.st_size)


def test_a_fifo_is_refused_without_opening_it(cache_path, measuring):
    os.mkfifo(cache_path)
    _unreadable(cache_path, "is a FIFO, expected a regular file")
    model, optimizer, batch, _ = _workload()
    with capture_logs() as logs:
        found = _within(
            10,
            lambda: autotune.measured_auto(
                model,
                optimizer,
                batch,
                _loss,
                copy_trainer=calibration_copies(FP16TrainingConfig(), "cpu", "auto"),
                device="cpu",
            ),
        )
    assert found.calibration.precision == "bf16" and not found.cached  # the decision stands, measured
    assert len(_warnings(logs, "precision.calibration_not_saved")) == 1
    result = _within(30, lambda: _doctor("--recalibrate"))
    assert result.exit_code == 2 and "is a FIFO" in json.loads(result.stdout)["recalibrate_refused"]
    assert stat.S_ISFIFO(os.lstat(cache_path).st_mode)


def test_a_symlink_to_dev_zero_is_refused_before_it_is_read(cache_path):
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero on this system")
    cache_path.symlink_to("/dev/zero")
    _unreadable(cache_path, "is a character device (a symlink to /dev/zero)")
    assert not os.path.exists("/dev/zero.lock")  # no lock file made beside what it points to


def test_a_directory_is_refused(cache_path):
    cache_path.mkdir()
    (cache_path / "keep").write_text("x")
    _unreadable(cache_path, "is a directory, expected a regular file")
    assert (cache_path / "keep").read_text() == "x"


def test_a_symlink_to_a_cache_of_ours_is_read_and_written_through(cache_path, tmp_path):
    real = tmp_path / "shared" / "precision.json"
    real.parent.mkdir()
    _, _, _, described = _workload()
    PrecisionCache(real).put(_calibration(described))
    cache_path.symlink_to(real)
    other = _workload(hidden=6)[3]
    PrecisionCache(cache_path).put(_calibration(other))
    assert cache_path.is_symlink() and len(PrecisionCache(real).all()) == 2


def test_recalibrate_through_a_symlink_moves_the_malformed_target_aside_and_the_link_keeps_working(
    cache_path, tmp_path
):
    real = tmp_path / "shared" / "precision.json"
    real.parent.mkdir()
    real.write_text('{"format": "%s", "version": "two"}' % cc.CACHE_FORMAT)
    cache_path.symlink_to(real)
    _unreadable(cache_path, "has version 'two', expected an integer")
    result = _doctor("--recalibrate")
    assert (
        result.exit_code == 0 and Path(json.loads(result.stdout)["precision_cache_moved_aside"]).parent == real.parent
    )
    _, _, _, described = _workload()
    PrecisionCache(cache_path).put(_calibration(described))
    assert cache_path.is_symlink() and [c.key for c in PrecisionCache(real).all()] == [cal.workload_key(described)]


def test_a_file_over_the_size_limit_is_not_read(cache_path, monkeypatch):
    _, _, _, described = _workload()
    PrecisionCache(cache_path).put(_calibration(described))
    monkeypatch.setattr(cc, "MAX_BYTES", 100)
    _unreadable(cache_path, "is larger than")


@pytest.mark.parametrize("number", ["Infinity", "NaN", "-Infinity", "1e400"])
def test_a_non_finite_number_reads_as_absent(cache_path, number):
    _, _, _, described = _workload()
    PrecisionCache(cache_path).put(_calibration(described))
    key = cal.workload_key(described)
    text = cache_path.read_text().replace('"steps": 17', f'"steps": {number}')
    assert number in text
    cache_path.write_text(text)
    _unreadable(cache_path, "is not valid JSON")
    assert (
        cache_path.read_text() == text
    )  # ours by its marker, malformed: refused on write, moved aside only by --recalibrate
    result = _doctor("--recalibrate")
    data = json.loads(result.stdout)
    aside = Path(data["precision_cache_moved_aside"])
    assert result.exit_code == 0 and aside.read_text() == text
    assert json.loads(cache_path.read_text())["calibrations"] == {}  # an empty cache of ours in its place
    PrecisionCache(cache_path).put(_calibration(described))
    assert PrecisionCache(cache_path).get(key, described) is not None


def test_deep_nesting_reads_as_absent_and_recalibrate_moves_it_aside(cache_path):
    depth = 200_000
    text = '{"format": "%s", "version": %d, "calibrations": {"k": %s%s}}' % (
        cc.CACHE_FORMAT,
        cc.CACHE_VERSION,
        "[" * depth,
        "]" * depth,
    )
    cache_path.write_text(text)
    _unreadable(cache_path, "nested too deep")
    runner = CliRunner()
    result = _within(30, lambda: runner.invoke(app, ["doctor", "--recalibrate"], terminal_width=400))
    assert result.exit_code == 0 and result.exception is None, result.output
    assert "moved aside to" in result.stdout and "nothing deleted" in result.stdout
    (aside,) = cache_path.parent.glob(cache_path.name + ".corrupt-*")
    assert aside.read_text() == text
    data = json.loads(_doctor().stdout)
    assert (
        data["precision_cache_state"] == "ours"
        and data["precision_cache_problem"] is None
        and data["calibrations"] == []
    )


def test_a_file_nested_just_past_the_limit_is_refused_too(cache_path):
    inner = "[" * cc.MAX_DEPTH + "]" * cc.MAX_DEPTH  # parses (no RecursionError), then the depth check
    cache_path.write_text(
        '{"format": "%s", "version": %d, "calibrations": {"k": %s}}' % (cc.CACHE_FORMAT, cc.CACHE_VERSION, inner)
    )
    _unreadable(cache_path, f"nested more than {cc.MAX_DEPTH} levels deep")


@pytest.mark.parametrize(
    "content",
    [
        "my notes: not a cache\n",
        '{"calibrations": {}, "note": "another tool"}',
        "[" * 200_000,  # foreign and deep
    ],
)
def test_a_file_that_is_not_a_cache_of_ours_is_never_overwritten_nor_deleted(cache_path, measuring, content):
    cache_path.write_text(content)
    model, optimizer, batch, _ = _workload()
    with capture_logs() as logs:
        found = autotune.measured_auto(
            model,
            optimizer,
            batch,
            _loss,
            copy_trainer=calibration_copies(FP16TrainingConfig(), "cpu", "auto"),
            device="cpu",
        )
    assert found.calibration.precision == "bf16" and not found.cached
    not_saved = _warnings(logs, "precision.calibration_not_saved")
    assert len(not_saved) == 1 and str(cache_path) in not_saved[0]["reason"] and "left alone" in not_saved[0]["reason"]
    assert len(_warnings(logs, "precision.cache_unreadable")) == 1
    result = _doctor("--recalibrate")
    refused = json.loads(result.stdout)["recalibrate_refused"]
    assert result.exit_code == 2 and str(cache_path) in refused and "remove or move it by hand" in refused
    human = CliRunner().invoke(app, ["doctor", "--recalibrate"], terminal_width=400)
    assert human.exit_code == 2 and isinstance(human.exception, SystemExit)
    assert cache_path.read_text() == content
    assert not list(cache_path.parent.glob(cache_path.name + ".corrupt-*"))


def test_the_first_versions_file_is_ours_and_replaced(cache_path):
    cache_path.write_text(json.dumps({"calibrations": {"old": {"version": 2}}, "version": 1}))
    _, _, _, described = _workload()
    PrecisionCache(cache_path).put(_calibration(described))
    data = json.loads(cache_path.read_text())
    assert data["format"] == cc.CACHE_FORMAT and list(data["calibrations"]) == [cal.workload_key(described)]


# -- writers: merged under a lock, every entry kept ---------------------------------------------------------
def _writer(path: str, first: int, count: int, described: dict) -> None:
    cache = PrecisionCache(path)
    for i in range(first, first + count):
        cache.put(_calibration({**described, "parameters": i}))


def test_six_concurrent_writers_keep_all_120_entries(cache_path):
    try:
        ctx = multiprocessing.get_context("fork")
    except ValueError:
        pytest.skip("needs fork")
    _, _, _, described = _workload()
    writers = [ctx.Process(target=_writer, args=(str(cache_path), 20 * w, 20, described)) for w in range(6)]
    for p in writers:
        p.start()
    for p in writers:
        p.join(60)
    assert [p.exitcode for p in writers] == [0] * 6
    found = PrecisionCache(cache_path).all()
    assert len(found) == 120 and {c.workload["parameters"] for c in found} == set(range(120))


def test_a_writer_gives_up_on_a_lock_held_too_long(cache_path, monkeypatch):
    monkeypatch.setattr(cc, "LOCK_TIMEOUT_S", 0.2)
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(str(cache_path) + ".lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(CacheRefused, match="locked by another process"):
            _within(5, lambda: PrecisionCache(cache_path).put(_calibration(_workload()[3])))
    finally:
        os.close(fd)
    assert not cache_path.exists()


# -- provenance: when, by which process, under what load ---------------------------------------------------
def test_a_cached_decision_says_when_by_whom_and_under_what_load_it_was_measured(cache_path, monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (1.5, 1.0, 0.25))
    model, optimizer, batch, described = _workload()
    measured = _calibration(described)
    assert measured.load["average"] == [1.5, 1.0, 0.25] and measured.measured_by["pid"] == os.getpid()
    PrecisionCache(cache_path).put(measured)
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 9.0, 9.0))  # the load now is not the one it was measured under
    found = autotune.cached_calibration(model, optimizer, batch, "cpu")
    decision = decide(FP16TrainingConfig(precision="auto").request, "cpu", measured=found, cached=True)
    assert decision.source == Source.CACHED and decision.mode.value == "bf16"
    host, pid, command = measured.measured_by["host"], measured.measured_by["pid"], measured.measured_by["command"]
    assert decision.reason.startswith(
        f"measured {measured.at} by pid {pid} ({command}) on host {host}, load average 1.50/1.00/0.25"
    )
    assert decision.reason.endswith(
        "bf16 is the fastest that passes (cached for this host and workload, measured earlier by this process)"
    )
    data = json.loads(_doctor().stdout)
    assert data["decisions"][0]["reason"] == found.reason and data["calibrations"][0]["load"]["average"] == [
        1.5,
        1.0,
        0.25,
    ]
    human = CliRunner().invoke(app, ["doctor"], terminal_width=400).stdout
    assert f"by pid {pid}" in human and "load 1.50/1.00/0.25" in human


def test_a_decision_measured_under_load_above_the_core_count_is_not_kept_and_says_so(
    cache_path, measuring, monkeypatch
):
    """Issue 54, item 7: a measurement under a 1-minute load above the number of CPUs decides this run only; the
    next run (here: the next call) measures again, and the reason and an event say why."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (3.9, 3.0, 2.0))
    model, optimizer, batch, described = _workload()
    trainer = calibration_copies(FP16TrainingConfig(), "cpu", "auto")
    with capture_logs() as logs:
        first = autotune.measured_auto(model, optimizer, batch, _loss, copy_trainer=trainer, device="cpu")
    assert first.calibration.precision == "bf16" and not first.cached
    assert first.calibration.reason.endswith(
        "; not kept in the host cache (measured under a load average of 3.90 on 2 CPUs): the next run measures again"
    )
    assert [e["reason"] for e in logs if e["event"] == "precision.calibration_not_cached"] == [
        "measured under a load average of 3.90 on 2 CPUs"
    ]
    assert not cache_path.exists()
    monkeypatch.setattr(os, "getloadavg", lambda: (2.0, 2.0, 2.0))  # at the core count: quiet enough to keep
    second = autotune.measured_auto(model, optimizer, batch, _loss, copy_trainer=trainer, device="cpu")
    third = autotune.measured_auto(model, optimizer, batch, _loss, copy_trainer=trainer, device="cpu")
    assert not second.cached and "not kept" not in second.calibration.reason and third.cached
    assert measuring == [cal.workload_key(described)] * 2  # measured under load, measured again, then cached


def test_a_cached_decision_from_another_process_names_it(cache_path, monkeypatch):
    model, optimizer, batch, described = _workload()
    PrecisionCache(cache_path).put(_calibration(described))
    _edit(
        cache_path,
        cal.workload_key(described),
        measured_by={
            "pid": 4242,
            "host": __import__("socket").gethostname(),
            "command": "genesis-fp16 evolve --seed 3",
        },
    )
    found = autotune.cached_calibration(model, optimizer, batch, "cpu")
    decision = decide(FP16TrainingConfig(precision="auto").request, "cpu", measured=found, cached=True)
    assert (
        decision.reason.endswith("(cached for this host and workload, measured by another process)")
        and "by pid 4242 (genesis-fp16 evolve --seed 3)" in decision.reason
    )


@pytest.mark.parametrize("threads, expected", [(1, "thread_time"), (2, "process_time")])
def test_a_cpu_measurement_reads_a_cpu_clock_that_other_load_does_not_move(monkeypatch, threads, expected):
    """One torch thread (the learners run on one): the calling thread's own CPU time; more: the process's (every
    torch thread's work); never the wall clock on a CPU."""
    import time

    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    assert cal.clock("cpu") is getattr(time, expected)
    assert cal.clock("cuda") is time.perf_counter


def test_a_stored_reason_is_not_trusted(cache_path):
    model, optimizer, batch, described = _workload()
    PrecisionCache(cache_path).put(_calibration(described))
    _edit(cache_path, cal.workload_key(described), reason="measured on a quiet machine yesterday: trust me")
    found = autotune.cached_calibration(model, optimizer, batch, "cpu")
    assert (
        found is not None
        and "trust me" not in found.reason
        and found.reason.endswith("bf16 is the fastest that passes")
    )

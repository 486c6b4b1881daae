"""Storage faults: a state dir that is not a directory, a read-only ledger or
mount, a full disk during `evolve`, and output paths checked before any work.

Tests run as root in CI containers, where ``chmod 0444`` does not stop a
write. Read-only files are simulated by patching ``storage.can_write`` (the
one place that asks whether a path is writable), and one test uses a real
read-only bind mount in a user namespace (EROFS stops root too), skipped
where the kernel does not allow it.
"""

from __future__ import annotations

import errno
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from genesis_fp16.cli import app
from genesis_fp16.rollout.ledger import LEDGER_FILE, LedgerError, RolloutLedger
from genesis_fp16.base.settings import load_settings

import loop_fakes

runner = CliRunner()


def _one_error_line(result) -> str:
    """The single error line a failed command printed (no traceback)."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1, result.output
    return errors[0]


# -- the state dir -----------------------------------------------------------------


@pytest.fixture
def bad_state_dir(tmp_path, monkeypatch, request):
    kind = request.param
    afile = tmp_path / "afile"
    afile.write_text("not a directory\n")
    if kind == "file":
        state, expected = afile, f"GENESIS_FP16_STATE_DIR={afile} is a file, expected a directory"
    elif kind == "under_file":
        state, expected = afile / "state", f"parent {afile} is not a directory"
    else:
        state = tmp_path / "link"
        state.symlink_to(tmp_path / "gone")
        expected = f"GENESIS_FP16_STATE_DIR={state} is a dangling symlink to {tmp_path / 'gone'}"
    monkeypatch.setenv("GENESIS_FP16_STATE_DIR", str(state))
    return expected


@pytest.mark.parametrize("bad_state_dir", ["file", "under_file", "dangling"], indirect=True)
@pytest.mark.parametrize("command", [["rollout", "status"], ["rollout", "enable", "wm"], ["rollout", "history"]])
def test_bad_state_dir_is_one_clear_error(bad_state_dir, command):
    result = runner.invoke(app, command)
    assert result.exit_code == 2, result.output
    line = _one_error_line(result)
    assert bad_state_dir in line


@pytest.mark.parametrize("bad_state_dir", ["file", "dangling"], indirect=True)
def test_bad_state_dir_stops_evolve_before_any_episode(bad_state_dir, monkeypatch):
    from agents import evaluation

    def no_episodes(*args, **kwargs):
        raise AssertionError("an evaluator was created: the state dir was checked too late")

    monkeypatch.setattr(evaluation, "Evaluator", no_episodes)
    result = runner.invoke(app, ["evolve", "--budget", "16", "--workers", "1"])
    assert result.exit_code == 2, result.output
    assert bad_state_dir in _one_error_line(result)


@pytest.mark.parametrize("bad_state_dir", ["file"], indirect=True)
def test_bad_state_dir_stops_forensics_before_pretraining(bad_state_dir, monkeypatch):
    from genesis_fp16_tools.forensics import pretrain

    def no_build(*args, **kwargs):
        raise AssertionError("pretraining started: the state dir was checked too late")

    monkeypatch.setattr(pretrain, "build_assets", no_build)
    result = runner.invoke(app, ["forensics", "pretrain"])
    assert result.exit_code == 2, result.output
    assert bad_state_dir in _one_error_line(result)


@pytest.mark.parametrize("bad_state_dir", ["under_file"], indirect=True)
def test_bad_state_dir_in_the_replay_buffer_names_the_variable(bad_state_dir):
    from infrastructure.replay_buffer import ReplayBuffer, ReplayBufferError

    with pytest.raises(ReplayBufferError) as err:
        ReplayBuffer(settings=load_settings())
    assert bad_state_dir in str(err.value) and err.value.kind == "path"


def test_prepare_dir_creates_and_checks(tmp_path):
    from genesis_fp16.base.storage import StorageError, prepare_dir

    made = prepare_dir(tmp_path / "a" / "b", name="GENESIS_FP16_STATE_DIR")
    assert made.is_dir()
    (tmp_path / "f").write_text("x")
    with pytest.raises(
        StorageError, match="is a file, expected a directory; point it at a directory or remove the file"
    ) as err:
        prepare_dir(tmp_path / "f", name="GENESIS_FP16_STATE_DIR")
    assert err.value.kind == "path" and "GENESIS_FP16_STATE_DIR=" in str(err.value)


def test_unwritable_state_dir_says_not_writable(tmp_path, monkeypatch):
    from genesis_fp16.base import storage

    monkeypatch.setattr(storage, "can_write", lambda path: False)
    with pytest.raises(storage.StorageError, match="not writable") as err:
        storage.prepare_dir(tmp_path, name="GENESIS_FP16_STATE_DIR")
    assert "corrupt" not in str(err.value)


# -- a read-only ledger ------------------------------------------------------------------


@pytest.fixture
def ledger_with_history(state_dir):
    ledger = RolloutLedger.from_settings(load_settings())
    ledger.enable("wm", shadow=True, reason="try")
    ledger.rollback("wm", "gap too big", severity="P1")
    return state_dir / LEDGER_FILE


def _read_only(monkeypatch, *paths: Path) -> None:
    """``paths`` (and everything under them) report as not writable, as a
    0444 file or a read-only mount would for a user who is not root."""
    from genesis_fp16.base import storage

    roots = [p.resolve() for p in paths]

    def can_write(path) -> bool:
        path = Path(path).resolve()
        return not any(path == r or r in path.parents for r in roots)

    monkeypatch.setattr(storage, "can_write", can_write)


@pytest.mark.parametrize("where", ["file", "directory"])
def test_read_only_ledger_reads_work_and_writes_fail_clearly(ledger_with_history, monkeypatch, where):
    _read_only(monkeypatch, ledger_with_history if where == "file" else ledger_with_history.parent)
    result = runner.invoke(app, ["rollout", "status", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["agents"][0]["stage"] == "rolled_back"
    result = runner.invoke(app, ["rollout", "history", "wm", "--json"])
    assert result.exit_code == 0, result.output
    assert [h["to_stage"] for h in json.loads(result.stdout)] == ["shadow", "rolled_back"]
    result = runner.invoke(app, ["rollout", "enable", "wm"])
    assert result.exit_code == 1, result.output
    line = _one_error_line(result)
    assert f"ledger {ledger_with_history} is read-only" in line
    assert "corrupt" not in line and "not a usable" not in line
    monkeypatch.undo()
    assert RolloutLedger(ledger_with_history).stage("wm") == "rolled_back"  # nothing was written


def test_sqlite_refusing_a_write_is_read_only_not_corrupt(ledger_with_history, monkeypatch):
    """Whatever the permission check said, SQLite's own SQLITE_READONLY is reported as read-only."""
    from genesis_fp16.base import storage

    ledger = RolloutLedger(ledger_with_history)

    def read_only_connect(write: bool) -> sqlite3.Connection:
        return storage.connect_read_only(ledger.path)

    monkeypatch.setattr(ledger, "_connect", read_only_connect)
    with pytest.raises(LedgerError) as err:
        ledger.enable("other")
    assert err.value.kind == "read_only"
    assert "is read-only" in str(err.value) and "corrupt" not in str(err.value)


def test_read_only_directory_without_a_ledger_reads_as_empty(state_dir, monkeypatch):
    _read_only(monkeypatch, state_dir)
    result = runner.invoke(app, ["rollout", "status", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["agents"] == []
    assert not (state_dir / LEDGER_FILE).exists()


def _read_only_mount_available(directory: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        [
            "unshare",
            "-rm",
            "sh",
            "-c",
            'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && ! touch "$1/x"',
            "sh",
            str(directory),
        ],
        capture_output=True,
        timeout=30,
    )
    return probe.returncode == 0


_MOUNTED_CLI = """
import json, sys
from typer.testing import CliRunner
from genesis_fp16.cli import app
runner = CliRunner()
out = {}
for name, args in [("status", ["rollout", "status", "--json"]), ("history", ["rollout", "history", "--json"]),
                   ("enable", ["rollout", "enable", "other"])]:
    r = runner.invoke(app, args)
    out[name] = [r.exit_code, r.output]
print("RESULT " + json.dumps(out))
"""


def test_real_read_only_mount(ledger_with_history, tmp_path):
    """The ledger's directory bind-mounted read-only: EROFS, which stops root too."""
    import os

    state = ledger_with_history.parent
    if not _read_only_mount_available(tmp_path):
        pytest.skip("no user/mount namespaces here (unshare -rm) to make a read-only mount")
    env = dict(os.environ, GENESIS_FP16_STATE_DIR=str(state), GENESIS_FP16_LOG_LEVEL="ERROR")
    script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && exec "$2" -c "$3"'
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, "sh", str(state), sys.executable, _MOUNTED_CLI],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout + proc.stderr
    out = json.loads(lines[0][len("RESULT ") :])
    status_code, status_out = out["status"]
    assert status_code == 0, status_out
    assert json.loads(status_out)["agents"][0]["stage"] == "rolled_back"
    assert out["history"][0] == 0, out["history"][1]
    enable_code, enable_out = out["enable"]
    assert enable_code == 1 and "is read-only" in enable_out and "read-only file system" in enable_out, enable_out
    assert "corrupt" not in enable_out and "not a usable" not in enable_out


def test_corrupt_ledger_is_still_called_corrupt(state_dir):
    (state_dir / LEDGER_FILE).write_bytes(b"this is not sqlite" * 100)
    result = runner.invoke(app, ["rollout", "status"])
    assert result.exit_code == 2
    assert "not a usable SQLite database" in _one_error_line(result)


# -- a ledger on a full disk: reads work, writes fail in one line --------------------------------


def _no_shared_memory(monkeypatch) -> None:
    """The disk is full: every read-write or ``mode=ro`` connection fails at its first statement as SQLite's WAL
    does when it cannot size its ``-shm`` file (an I/O error where no space is left); an ``immutable`` one needs no
    ``-shm``."""
    real = sqlite3.connect

    class NoSpace:
        def __init__(self, conn: sqlite3.Connection) -> None:
            self.conn = conn

        def execute(self, *args, **kwargs):
            raise _sqlite_io_error()

        def close(self) -> None:
            self.conn.close()

    def connect(database, *args, **kwargs):
        conn = real(database, *args, **kwargs)
        return conn if "immutable=1" in str(database) or str(database) == ":memory:" else NoSpace(conn)

    _free_space(monkeypatch, 8 * 1024)
    monkeypatch.setattr(sqlite3, "connect", connect)


def test_a_full_disk_keeps_ledger_reads_working_and_writes_fail_in_one_line(ledger_with_history, monkeypatch):
    """Issue 52 (D10): on a full disk ``rollout status`` and ``history`` failed with "nothing of this change was
    written"; they read the ledger read-only now, as in a read-only directory."""
    _no_shared_memory(monkeypatch)
    result = runner.invoke(app, ["rollout", "status", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["agents"][0]["stage"] == "rolled_back"
    result = runner.invoke(app, ["rollout", "history", "wm", "--json"])
    assert result.exit_code == 0, result.output
    assert [h["to_stage"] for h in json.loads(result.stdout)] == ["shadow", "rolled_back"]
    result = runner.invoke(app, ["rollout", "enable", "wm"])
    assert result.exit_code == 1, result.output
    line = _one_error_line(result)
    assert "the disk is full" in line and "nothing of this change was written" in line
    assert str(ledger_with_history) in line


_FULL_LEDGER = """
set -u
mount -t tmpfs -o size=1m tmpfs "$1/mnt"
export GENESIS_FP16_STATE_DIR="$1/mnt/state"
"$2" -m genesis_fp16.cli rollout enable wm --shadow > "$1/first.out" 2>&1 || exit 3
dd if=/dev/zero of="$1/mnt/fill" bs=4k 2>/dev/null
"$2" -m genesis_fp16.cli rollout status --json > "$1/status.out" 2> "$1/status.err"; echo $? > "$1/status.rc"
"$2" -m genesis_fp16.cli rollout enable other > "$1/enable.out" 2> "$1/enable.err"; echo $? > "$1/enable.rc"
"""


def test_a_real_full_disk_keeps_ledger_reads_working(tmp_path):
    """The ledger on a 1 MiB tmpfs filled to the last block: ``rollout status`` reads it, ``rollout enable`` is one
    line saying the disk is full."""
    import os

    (tmp_path / "mnt").mkdir()
    if not _tmpfs_available(tmp_path / "mnt"):
        pytest.skip("no user/mount namespaces here (unshare -rm) to mount a small tmpfs")
    env = dict(os.environ, GENESIS_FP16_LOG_LEVEL="ERROR")
    proc = subprocess.run(
        ["unshare", "-rm", "bash", "-c", _FULL_LEDGER, "bash", str(tmp_path), sys.executable],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr + (tmp_path / "first.out").read_text()
    read = lambda name: (tmp_path / name).read_text()  # noqa: E731
    assert read("status.rc").strip() == "0", read("status.err")
    assert [a["stage"] for a in json.loads(read("status.out"))["agents"]] == ["shadow"]
    assert read("enable.rc").strip() == "1" and "the disk is full" in read("enable.err"), read("enable.err")
    assert read("enable.err").count("\n") == 1 and "Traceback" not in read("enable.err")


# -- classification ------------------------------------------------------------------------


def test_classification_of_real_sqlite_errors(tmp_path):
    from genesis_fp16.base.storage import connect_read_only, fault_kind

    path = tmp_path / "db.sqlite"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE t (x BLOB)")
    conn.close()
    ro = connect_read_only(path)
    with pytest.raises(sqlite3.OperationalError) as err:
        ro.execute("INSERT INTO t VALUES (1)")
    ro.close()
    assert fault_kind(err.value) == "read_only"

    conn = sqlite3.connect(path, isolation_level=None)
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count={pages}")
    with pytest.raises(sqlite3.OperationalError) as err:
        conn.execute("INSERT INTO t VALUES (?)", (b"x" * 100_000,))
    conn.close()
    assert fault_kind(err.value) == "full"

    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    other = sqlite3.connect(path, timeout=0.0, isolation_level=None)
    with pytest.raises(sqlite3.OperationalError) as err:
        other.execute("BEGIN IMMEDIATE")
    holder.execute("ROLLBACK")
    holder.close()
    other.close()
    assert fault_kind(err.value) == "locked"

    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"garbage " * 512)
    with pytest.raises(sqlite3.DatabaseError) as err:
        sqlite3.connect(junk).execute("SELECT * FROM sqlite_master").fetchall()
    assert fault_kind(err.value) == "corrupt"


@pytest.mark.parametrize(
    "code, kind", [(errno.ENOSPC, "full"), (errno.EROFS, "read_only"), (errno.EACCES, "permission"), (errno.EIO, "io")]
)
def test_classification_of_os_errors_through_wrappers(code, kind):
    from genesis_fp16.training.checkpoint import CheckpointError
    from genesis_fp16.base.storage import fault_kind

    assert fault_kind(OSError(code, "x")) == kind
    # torch.save on a full disk raises RuntimeError('unexpected pos ...') with the OSError as its context
    try:
        try:
            raise OSError(code, "x")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc] unexpected pos")
    except RuntimeError as inner:
        wrapped = CheckpointError("x.pt: could not write checkpoint")
        wrapped.__cause__ = inner
    assert fault_kind(wrapped) == kind


def test_replay_buffer_read_only_is_not_called_corrupt(tmp_path, monkeypatch):
    from genesis_fp16.base import storage
    from infrastructure.replay_buffer import ReplayBuffer, ReplayBufferError

    path = tmp_path / "replay.sqlite"
    ReplayBuffer(path)
    monkeypatch.setattr(ReplayBuffer, "_connect", lambda self: storage.connect_read_only(self.path))
    with pytest.raises(ReplayBufferError) as err:
        ReplayBuffer(path)
    assert err.value.kind == "read_only"
    assert "read-only" in str(err.value) and "corrupt" not in str(err.value) and "move it aside" not in str(err.value)


# -- a full disk during evolve ---------------------------------------------------------------


# the CLI's evolve with tiny learners (generations of 8 candidates, one real episode each: the population while
# refining)
TINY = [
    "--workers",
    "1",
    "--wm-steps",
    "20",
    "--ensemble",
    "2",
    "--refine-steps",
    "4",
    "--critic-updates",
    "0.02",
    "--model-rollouts",
    "16",
    "--rollout-horizon",
    "2",
    "--eval-timeout-s",
    "60",
]


@pytest.fixture(autouse=True)
def _restore_threads():
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_full_disk_in_the_replay_buffer_is_one_clear_error(monkeypatch, state_dir):
    """Generation 0 commits; the disk fills while generation 1 is written (SQLite's SQLITE_FULL)."""
    from infrastructure.replay_buffer import ReplayBuffer

    original = ReplayBuffer.append_generation

    def append(self, agent, generation, trajectories):
        if generation >= 1:
            pages = sqlite3.connect(self.path).execute("PRAGMA page_count").fetchone()[0]
            connect = type(self)._connect

            def full_disk(buffer=self):
                conn = connect(buffer)
                conn.execute(f"PRAGMA max_page_count={pages}")
                return conn

            self._connect = full_disk
        return original(self, agent, generation, trajectories)

    monkeypatch.setattr(ReplayBuffer, "append_generation", append)
    result = runner.invoke(app, ["evolve", "--budget", "40", *TINY])
    assert result.exit_code == 1, result.output
    line = _one_error_line(result)
    assert "full" in line and "replay.sqlite" in line
    assert "1 generation(s) (15 real episodes) are committed" in line
    assert "corrupt" not in line


def _evolve_with_no_space_for(monkeypatch, full) -> str:
    """``evolve`` where every atomic write of a path ``full(path)`` accepts
    fails with ENOSPC; the one error line it prints."""
    from genesis_fp16.base import storage as checkpoint  # where the atomic writes live

    original = checkpoint.atomic_write

    def no_space(path, write):
        if not full(Path(path)):
            return original(path, write)
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(checkpoint, "atomic_write", no_space)
    result = runner.invoke(app, ["evolve", "--budget", "40", *TINY])
    assert result.exit_code == 1, result.output
    return _one_error_line(result)


@pytest.mark.parametrize("learner", ["world_model", "critic"])
def test_full_disk_writing_a_checkpoint_is_one_clear_error(monkeypatch, state_dir, learner):
    """The world model's or the critic's checkpoint cannot be written (ENOSPC from the atomic write)."""
    line = _evolve_with_no_space_for(monkeypatch, lambda path: path.name.startswith(learner))
    assert "disk is full" in line and "No space left on device" in line
    assert "0 generation(s) (0 real episodes) are committed" in line and "replay.sqlite" in line


def test_full_disk_writing_the_run_manifest_is_one_clear_error(monkeypatch, state_dir):
    """The run manifest cannot be written at all (ENOSPC): the run stops before any episode."""
    line = _evolve_with_no_space_for(monkeypatch, lambda path: path.name == "run.json")
    assert "disk is full" in line and "run.json" in line and "run again" in line
    assert "0 generation(s)" in line


def _sqlite_io_error() -> sqlite3.OperationalError:
    """What SQLite raises when growing its WAL index fails for lack of space:
    an I/O error, not SQLITE_FULL."""
    exc = sqlite3.OperationalError("disk I/O error")
    exc.sqlite_errorcode = 4874  # SQLITE_IOERR_SHMSIZE
    return exc


def _free_space(monkeypatch, free_bytes: int) -> None:
    """The file system reports ``free_bytes`` free (in 4 KiB blocks)."""
    from types import SimpleNamespace

    from genesis_fp16.base import storage

    fake = SimpleNamespace(
        f_bavail=free_bytes // 4096, f_frsize=4096, f_bsize=4096, f_blocks=1 << 20, f_bfree=free_bytes // 4096
    )
    monkeypatch.setattr(storage.os, "statvfs", lambda path: fake)


@pytest.mark.parametrize("free, kind", [(64 * 1024, "full"), (10 * 2**30, "io")])
def test_an_sqlite_io_error_is_a_full_disk_only_where_no_space_is_left(tmp_path, monkeypatch, free, kind):
    from infrastructure.replay_buffer import ReplayBuffer

    buffer = ReplayBuffer(tmp_path / "replay.sqlite")
    _free_space(monkeypatch, free)
    error = buffer._fault(_sqlite_io_error())
    assert error.kind == kind
    assert ("the disk is full" in str(error)) == (kind == "full") and str(tmp_path / "replay.sqlite") in str(error)
    assert (": I/O error (" in str(error)) == (kind == "io")  # a real I/O error keeps its message
    assert "corrupt" not in str(error)


def test_an_sqlite_io_error_on_a_full_disk_during_evolve_names_the_full_disk(monkeypatch, state_dir):
    """Generation 0 commits; generation 1's rows meet an SQLite I/O error on a
    disk with no space left: one line naming the full disk, the file and the
    committed generations."""
    from infrastructure.replay_buffer import ReplayBuffer

    original = ReplayBuffer.append_generation

    def append(self, agent, generation, trajectories):
        if generation >= 1:
            _free_space(monkeypatch, 8 * 1024)
            raise self._fault(_sqlite_io_error())
        return original(self, agent, generation, trajectories)

    monkeypatch.setattr(ReplayBuffer, "append_generation", append)
    result = runner.invoke(app, ["evolve", "--budget", "40", *TINY])
    assert result.exit_code == 1, result.output
    line = _one_error_line(result)
    assert "the disk is full" in line and "replay.sqlite" in line and ": I/O error (" not in line
    assert "1 generation(s) (15 real episodes) are committed" in line and "--resume" in line


def _tmpfs_available(directory: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o size=1m tmpfs "$1"', "sh", str(directory)],
        capture_output=True,
        timeout=30,
    )
    return probe.returncode == 0


_FULL_THEN_RESUME = """
set -u
mount -t tmpfs -o size=4m tmpfs "$1/mnt"
export GENESIS_FP16_STATE_DIR="$1/mnt/state"
"$2" -m genesis_fp16.cli evolve --budget 40 --seed 0 --workers 1 --precision fp32 \\
    --json "$1/first.json" > "$1/first.log" 2>&1
echo $? > "$1/first.rc"
mount -o remount,size=256m "$1/mnt"
"$2" -m genesis_fp16.cli evolve --resume "$(ls "$1/mnt/state/runs")" --json "$1/resumed.json" > "$1/resumed.log" 2>&1
echo $? > "$1/resumed.rc"
"""


def test_a_real_full_disk_then_resume_gives_the_uninterrupted_report(tmp_path):
    """``evolve`` on a 4 MiB tmpfs (room for a few generations' world-model
    and critic checkpoints) stops with a full-disk line; with space freed,
    ``--resume`` gives the uninterrupted run's report, each generation once
    (the generation cut off by the full disk was never committed)."""
    import os

    (tmp_path / "mnt").mkdir()
    if not _tmpfs_available(tmp_path / "mnt"):
        pytest.skip("no user/mount namespaces here (unshare -rm) to mount a small tmpfs")
    env = dict(os.environ, OMP_NUM_THREADS="1", GENESIS_FP16_LOG_LEVEL="ERROR")
    subprocess.run(
        ["unshare", "-rm", "bash", "-c", _FULL_THEN_RESUME, "bash", str(tmp_path), sys.executable],
        check=True,
        timeout=300,
        env=env,
    )
    first_log = (tmp_path / "first.log").read_text()
    assert (tmp_path / "first.rc").read_text().strip() == "1" and "the disk is full" in first_log, first_log
    assert (tmp_path / "resumed.rc").read_text().strip() == "0", (tmp_path / "resumed.log").read_text()

    whole = dict(env, GENESIS_FP16_STATE_DIR=str(tmp_path / "whole"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "genesis_fp16.cli",
            "evolve",
            "--budget",
            "40",
            "--seed",
            "0",
            "--workers",
            "1",
            "--precision",
            "fp32",
            "--json",
            str(tmp_path / "whole.json"),
        ],
        check=True,
        timeout=300,
        env=whole,
        capture_output=True,
    )
    resumed, expected = (json.loads((tmp_path / name).read_text()) for name in ("resumed.json", "whole.json"))
    assert resumed["resumed_from"]["generation"] >= 0, (
        first_log
    )  # it continued after a generation the full disk left committed
    assert [g["generation"] for g in resumed["generations"]] == [g["generation"] for g in expected["generations"]]
    volatile = {*loop_fakes.RUN_SPECIFIC, *loop_fakes.RESUMED}
    same = {k: v for k, v in resumed.items() if k not in volatile}
    assert same == {k: v for k, v in expected.items() if k not in volatile}
    strip = {"elapsed_s", "wm_wall_s", "critic_wall_s", "time"}
    assert [{k: v for k, v in g.items() if k not in strip} for g in resumed["generations"]] == [
        {k: v for k, v in g.items() if k not in strip} for g in expected["generations"]
    ]


# -- output paths checked before any work ---------------------------------------------------------


@pytest.fixture
def afile(tmp_path):
    path = tmp_path / "afile"
    path.write_text("x\n")
    return path


def test_check_output_path(tmp_path, afile, monkeypatch):
    from genesis_fp16.base import storage

    assert (
        storage.check_output_path(tmp_path / "new" / "deeper" / "r.json", "--json")
        == tmp_path / "new" / "deeper" / "r.json"
    )
    with pytest.raises(storage.StorageError, match=f"--json {afile}/r.json: {afile} is a file, not a directory"):
        storage.check_output_path(afile / "r.json", "--json")
    with pytest.raises(storage.StorageError, match="is a directory; expected a file"):
        storage.check_output_path(tmp_path, "--json")
    monkeypatch.setattr(storage, "can_write", lambda path: False)
    with pytest.raises(storage.StorageError, match="not writable"):
        storage.check_output_path(tmp_path / "r.json", "--json")


@pytest.mark.parametrize("flag", ["--checkpoint", "--json"])
def test_ppo_bad_output_path_fails_before_training(afile, monkeypatch, flag):
    from agents.ppo import ppo

    def no_training(*args, **kwargs):
        raise AssertionError("PPO was built: the output path was checked too late")

    monkeypatch.setattr(ppo, "PPO", no_training)
    result = runner.invoke(app, ["ppo", "--env", "CartPole-v1", "--total-steps", "256", flag, str(afile / "x.out")])
    assert result.exit_code == 2, result.output
    line = _one_error_line(result)
    assert f"{flag} {afile}/x.out" in line and "is a file, not a directory" in line


def test_ppo_output_path_that_is_a_directory(tmp_path, monkeypatch):
    from agents.ppo import ppo

    monkeypatch.setattr(ppo, "PPO", lambda *a, **k: pytest.fail("PPO was built"))
    result = runner.invoke(app, ["ppo", "--checkpoint", str(tmp_path)])
    assert result.exit_code == 2
    assert "is a directory" in _one_error_line(result)


def test_evolve_bad_json_path_fails_before_any_work(afile, monkeypatch, state_dir):
    from agents import se_darwin_agent

    monkeypatch.setattr(se_darwin_agent, "SEDarwinAgent", lambda *a, **k: pytest.fail("the loop started"))
    monkeypatch.setattr(se_darwin_agent, "run_cma_baseline", lambda *a, **k: pytest.fail("the baseline started"))
    for extra in ([], ["--baseline", "cma"]):
        result = runner.invoke(app, ["evolve", "--budget", "16", "--json", str(afile / "r.json"), *extra])
        assert result.exit_code == 2, result.output
        assert f"--json {afile}/r.json" in _one_error_line(result)
    assert not (state_dir / "replay.sqlite").exists()


@pytest.mark.parametrize("flag", ["--json", "--csv", "--plot", "--markdown"])
def test_bench_bad_output_path_fails_before_measuring(afile, monkeypatch, flag):
    from genesis_fp16_tools.bench import runner as bench_runner

    monkeypatch.setattr(bench_runner, "run_benchmark", lambda *a, **k: pytest.fail("the benchmark ran"))
    result = runner.invoke(app, ["bench", "--quick", flag, str(afile / "out")])
    assert result.exit_code == 2, result.output
    assert f"{flag} {afile}/out" in _one_error_line(result)


@pytest.mark.parametrize(
    "args",
    [
        ["pretrain", "--json", "{bad}/m.json"],
        ["probe", "--json", "{bad}/p.json"],
        ["freeze", "--out", "{bad}/t.pt"],
        ["freeze", "--out", "{tmp}/t.pt", "--json", "{bad}/f.json"],
        ["replay", "--trajectories", "{tmp}/t.pt", "--json", "{bad}/r.json"],
        ["sweep", "--out", "{bad}/sweep"],
        ["sweep", "--out", "{afile}"],
        ["sweep", "--json", "{bad}/s.json"],
    ],
)
def test_forensics_bad_output_path_fails_before_any_work(afile, tmp_path, monkeypatch, args):
    from genesis_fp16.base.storage import atomic_write_bytes
    from genesis_fp16_tools.forensics import pretrain

    atomic_write_bytes(tmp_path / "t.pt", b"placeholder")  # replay checks its output before reading this
    monkeypatch.setattr(pretrain, "ensure_assets", lambda *a, **k: pytest.fail("assets were loaded or built"))
    args = [a.format(bad=afile, tmp=tmp_path, afile=afile) for a in args]
    result = runner.invoke(app, ["forensics", *args])
    assert result.exit_code == 2, result.output
    line = _one_error_line(result)
    assert str(afile) in line


def test_full_disk_writing_the_json_report_is_one_clear_error(monkeypatch, tmp_path):
    from genesis_fp16.base import storage as checkpoint  # where the atomic writes live

    def no_space(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(checkpoint, "atomic_write_text", no_space)
    result = runner.invoke(app, ["evolve", "--budget", "16", *TINY, "--json", str(tmp_path / "r.json")])
    assert result.exit_code == 1, result.output
    line = _one_error_line(result)
    assert "the report could not be written" in line and "No space left on device" in line and "replay.sqlite" in line
    assert "best return, held-out" in result.output  # the table was printed before


# -- state files read as untrusted input (untrusted.read_untrusted, parse_json, read_json) ----------------------


@pytest.fixture
def odd_path(tmp_path, request):
    """Something that is not a regular file where one is read: (its path, how the error names it)."""
    import os

    path = tmp_path / "state.json"
    if request.param == "fifo":
        os.mkfifo(path)
        return path, "is a FIFO, expected a regular file"
    if request.param == "dev_zero":
        path.symlink_to("/dev/zero")
        return path, "is a character device (a symlink to /dev/zero), expected a regular file"
    path.mkdir()
    return path, "is a directory, expected a regular file"


@pytest.mark.timeout(10)
@pytest.mark.parametrize("odd_path", ["fifo", "dev_zero", "directory"], indirect=True)
def test_what_is_not_a_regular_file_is_named_before_it_is_opened(odd_path):
    from genesis_fp16.base.untrusted import UntrustedFileError, read_json

    path, named = odd_path
    with pytest.raises(UntrustedFileError) as err:
        read_json(path, "the thing", "fix it", max_bytes=100, max_depth=4)
    assert str(err.value) == f"the thing {path} {named}; fix it"
    assert err.value.kind == "path" and err.value.exit_code == 2


@pytest.mark.timeout(10)
def test_a_fifo_swapped_in_after_the_check_is_opened_without_blocking(tmp_path, monkeypatch):
    """The check and the open are two steps: the open is non-blocking, so a FIFO that appears between them (no writer)
    is still refused at once, never waited on."""
    import os

    from genesis_fp16.base import untrusted

    path = tmp_path / "swapped"
    os.mkfifo(path)
    monkeypatch.setattr(untrusted, "not_regular", lambda path: None)  # the check saw a regular file
    with pytest.raises(untrusted.UntrustedFileError, match="changed into a FIFO while being opened"):
        untrusted.read_untrusted(path, "the thing", "fix it", 100)


def test_the_untrusted_reader_bounds_size_and_depth_and_parses_strictly(tmp_path):
    from genesis_fp16.base.untrusted import UntrustedFileError, read_json

    path = tmp_path / "x.json"

    def problem(text: str, **limits) -> str:
        path.write_text(text)
        with pytest.raises(UntrustedFileError) as err:
            read_json(path, "the thing", "fix it", **{"max_bytes": 1000, "max_depth": 4, **limits})
        assert err.value.kind == "corrupt" and str(err.value).startswith(f"the thing {path} ")
        return err.value.problem

    assert problem('{"a": "' + "x" * 2000 + '"}') == "is larger than 1000 bytes"
    deep = "[" * 100_000 + "]" * 100_000
    assert problem(deep, max_bytes=300_000) == "is nested too deep to read (more than 4 levels)"
    assert problem("[[[[[1]]]]]") == "is nested more than 4 levels deep"
    for not_strict in ('{"a": NaN}', '{"a": Infinity}', '{"a": 1e400}', '{"a": 1', "\xff"):
        assert problem(not_strict).startswith("is not valid JSON"), not_strict
    path.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(UntrustedFileError, match=r"is not UTF-8 text \(byte 0xff at offset 7\)"):
        read_json(path, "the thing", "fix it", max_bytes=1000, max_depth=4)
    path.write_text('{"a": [[1.5]]}')
    assert read_json(path, "the thing", "fix it", max_bytes=1000, max_depth=4) == {"a": [[1.5]]}
    with pytest.raises(FileNotFoundError):
        read_json(tmp_path / "absent.json", "the thing", "fix it", max_bytes=1000, max_depth=4)

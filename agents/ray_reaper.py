"""Ends a local Ray's processes once the driver that started it is gone.

A driver that starts a local Ray (``ray.init()`` without an address) is the
parent of its GCS server and raylet, which Ray ends with the driver; but the
raylet's own children (the dashboard and runtime-env agents, idle workers)
only notice the raylet is gone after their own timeouts: after a ``kill -9``
of ``evolve --backend ray`` they were seen alive for more than 60 s. The
process pool's workers die with their parent at once (``agents.worker_limits``);
this gives a local Ray the same property.

`start_reaper` starts this module as a small process of its own (its own
session, so a signal to the driver's process group does not end it first).
The driver tells it the Ray session's directory over a pipe it alone holds,
and ``stop`` when it shuts Ray down itself. When the pipe closes without a
``stop`` (the driver died) or the driver's process is gone, the reaper kills
every process with a file open in that session directory (every Ray process
of the session has its logs there; no other process has), until none is
left, and exits. A driver killed inside ``ray.init``, before it could name
the directory, is covered by Ray's name for it, which ends in the pid of the
process that started the session.

Standard library and psutil only: it starts in a fraction of a second.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from typing import IO, Optional

import psutil

STOP = "stop"
WATCH_INTERVAL_S = 0.5
REAP_FOR_S = 30.0  # scan again while processes are found (a worker starting as the raylet died), at most this long


class Reaper:
    """The driver's end of a reaper `start_reaper` started: `session` tells
    it what to reap, `stop` ends it without reaping."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc

    def session(self, session_dir: str) -> None:
        """The Ray session to end if this process dies."""
        self._send(os.path.abspath(session_dir))

    def stop(self) -> None:
        """Ray was shut down here: end the reaper without reaping."""
        self._send(STOP)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _send(self, line: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
            if line == STOP:
                self.proc.stdin.close()
        except (BrokenPipeError, ValueError):  # the reaper is gone already: nothing to tell it
            pass


def start_reaper() -> Reaper:
    """A reaper for this process (the driver), started before Ray: a driver
    killed before it could name its session (`Reaper.session`) still has
    its processes reaped, found by Ray's session name (`session_pattern`)."""
    # run as a file, not as ``-m agents.ray_reaper``: the package would import torch, seconds of start-up
    run = f"import runpy; runpy.run_path({os.path.abspath(__file__)!r}, run_name='__main__')"
    proc = subprocess.Popen(
        [sys.executable, "-c", run, str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # a Ctrl-C or kill of the driver's process group leaves it to do its work
    )
    return Reaper(proc)


def session_pattern(session_dir: str) -> re.Pattern[str]:
    """Paths inside ``session_dir``, and the directory itself."""
    return re.compile(re.escape(session_dir.rstrip(os.sep)) + r"(?:$|" + re.escape(os.sep) + ")")


def started_by(driver_pid: int) -> re.Pattern[str]:
    """Paths inside any session ``driver_pid`` started: Ray names a session
    ``session_<date>_<time>_<microseconds>_<pid of the process that started it>``."""
    return re.compile(r"[/\\]session_[0-9_-]+_" + str(driver_pid) + r"(?:$|[/\\])")


def in_session(proc: psutil.Process, session: re.Pattern[str]) -> bool:
    """Whether ``proc`` belongs to the session: a file open there (its logs,
    its stdout and stderr) or the directory in its command line."""
    try:
        if any(session.search(f.path) for f in proc.open_files()):
            return True
        return any(session.search(arg) for arg in proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def reap(session: re.Pattern[str], *, for_s: float = REAP_FOR_S) -> int:
    """Kill every process of the session (`session_pattern`, `started_by`)
    until a scan finds none (or ``for_s`` passes); returns how many were killed."""
    me, killed = os.getpid(), 0
    deadline = time.monotonic() + for_s
    while time.monotonic() < deadline:
        found = [p for p in psutil.process_iter() if p.pid != me and in_session(p, session)]
        if not found:
            break
        for proc in found:
            try:
                proc.kill()
                killed += 1
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        psutil.wait_procs(found, timeout=WATCH_INTERVAL_S)
    return killed


def watch(driver_pid: int, commands: IO[str]) -> Optional[str]:
    """Wait until the driver is gone; returns the session dir it named, or
    None. Exits the process when the driver says ``stop``."""
    try:
        driver = psutil.Process(driver_pid)
    except psutil.NoSuchProcess:
        driver = None
    gone = threading.Event()
    session: list[Optional[str]] = [None]

    def read() -> None:
        for line in commands:
            line = line.strip()
            if line == STOP:
                os._exit(0)  # the driver shut Ray down itself: nothing to reap
            if line:
                session[0] = line
        gone.set()  # the pipe closed without a stop: the driver died

    threading.Thread(target=read, name="reaper-commands", daemon=True).start()
    # the pipe closes when the driver dies, however it dies; polling the pid too
    # covers a pipe that some other process kept open
    while not gone.wait(WATCH_INTERVAL_S) and alive(driver):
        pass
    return session[0]


def alive(proc: Optional[psutil.Process]) -> bool:
    """Running and not a zombie (a dead driver whose parent has not reaped it yet)."""
    try:
        return proc is not None and proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def main(argv: list[str]) -> int:
    """``DRIVER_PID``: wait for the driver to go, then reap the session it
    named, or any session it started if it named none."""
    driver_pid = int(argv[0])
    session_dir = watch(driver_pid, sys.stdin)
    reap(session_pattern(session_dir) if session_dir is not None else started_by(driver_pid))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

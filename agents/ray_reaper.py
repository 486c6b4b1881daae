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
left, and exits.

Standard library and psutil only: it starts in a fraction of a second.
"""

from __future__ import annotations

import os
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
    """The driver's end: `started` the reaper, `session` tells it what to
    reap, `stop` ends it without reaping (Ray was shut down cleanly)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc

    def session(self, session_dir: str) -> None:
        self._send(os.path.abspath(session_dir))

    def stop(self) -> None:
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
    """A reaper for this process (the driver), before Ray starts: a driver
    killed while Ray is still starting is then covered too, once it has
    said which session to reap (`Reaper.session`)."""
    # run as a file, not as ``-m agents.ray_reaper``: the package would import torch, seconds of start-up
    run = f"import runpy; runpy.run_path({os.path.abspath(__file__)!r}, run_name='__main__')"
    proc = subprocess.Popen(
        [sys.executable, "-c", run, str(os.getpid())],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
        start_new_session=True,  # a Ctrl-C or kill of the driver's process group leaves it to do its work
    )
    return Reaper(proc)


def in_session(proc: psutil.Process, session_dir: str) -> bool:
    """Whether ``proc`` belongs to the Ray session at ``session_dir``: a file
    open there (its logs, its stdout and stderr) or the directory in its command line."""
    prefix = session_dir.rstrip(os.sep) + os.sep
    try:
        if any(f.path.startswith(prefix) for f in proc.open_files()):
            return True
        return any(prefix in arg or arg.endswith(session_dir) for arg in proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def reap(session_dir: str, *, for_s: float = REAP_FOR_S) -> int:
    """Kill every process of the session until a scan finds none (or
    ``for_s`` passes); returns how many were killed."""
    me, killed = os.getpid(), 0
    deadline = time.monotonic() + for_s
    while time.monotonic() < deadline:
        found = [p for p in psutil.process_iter() if p.pid != me and in_session(p, session_dir)]
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
    """Wait until the driver is gone; returns the session dir to reap, or
    None (told to stop, or never told a session)."""
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
    session_dir = watch(int(argv[0]), sys.stdin)
    if session_dir is not None:
        reap(session_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

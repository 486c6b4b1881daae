"""Helpers for tests that start real processes: read a line with a deadline,
wait for processes to be gone, and clean up whatever is left. Every wait polls
against a deadline; the deadlines are generous so a loaded machine only makes
a test slower, never a failure."""

from __future__ import annotations

import queue
import threading
import time
from typing import IO, Callable, Iterable

import psutil

POLL_S = 0.05


def read_line(stream: IO[str], timeout_s: float, accept: Callable[[str], bool] = lambda line: True) -> str:
    """The first line from ``stream`` that ``accept`` takes, within ``timeout_s``."""
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no expected line within {timeout_s:g} s") from None
        if line is None:
            raise AssertionError("the process closed its output before the expected line")
        if accept(line):
            return line


def is_alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (an orphan's exit status may never be reaped here)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)
    return True


def still_alive(procs: Iterable[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Those of ``procs`` still alive after waiting up to ``timeout_s`` for all to be gone."""
    procs = list(procs)
    wait_until(lambda: not any(is_alive(p) for p in procs), timeout_s)
    return [p for p in procs if is_alive(p)]


def kill_all(procs: Iterable[psutil.Process]) -> None:
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass

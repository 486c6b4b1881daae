"""Limits for evaluation worker processes: a memory cap, and death with the
parent.

Kept apart from ``agents.evaluation`` on purpose: a spawned worker imports the
module of its initializer, and this one needs only the standard library (no
torch), so a fresh worker starts in a fraction of a second.

A worker must not outlive the process that started it (a ``kill -9`` of
``evolve`` would otherwise leave its workers waiting for work forever). Two
mechanisms, so either alone suffices:

* Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``; the kernel kills the worker the
  moment its parent goes. The kernel sends it when the *thread* that started
  the worker ends, so ``agents.evaluation`` starts every worker from one
  thread that lives as long as the pool.
* Everywhere: a daemon thread that polls whether the parent is still the one
  that started the worker (a POSIX orphan is re-parented to init or a
  subreaper; on Windows multiprocessing's handle on the parent is asked).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Optional

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
ORPHAN_EXIT_CODE = 1
WATCH_INTERVAL_S = 0.5


def init_worker(memory_limit_mb: Optional[int], parent_pid: int, mujoco_log: Optional[str] = None) -> None:
    """Pool initializer: die with ``parent_pid`` (the process that started
    this worker), then cap the memory. The watch thread starts before the cap,
    so its stack is part of the measured baseline. ``mujoco_log``: where
    MuJoCo's warnings go (``agents.mujoco_log``), for a task whose env is MuJoCo."""
    die_with_parent(parent_pid)
    if mujoco_log is not None:
        from .mujoco_log import route_mujoco_log

        route_mujoco_log(Path(mujoco_log))
    limit_worker_memory(memory_limit_mb)


def set_death_signal() -> bool:
    """Linux: have the kernel SIGKILL this process when its parent thread
    ends. False where that is not available (another OS, a sandbox refusing
    prctl); the watch thread covers those."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def parent_gone(parent_pid: int) -> bool:
    """Whether the process that started this one has ended."""
    if os.getppid() != parent_pid:  # POSIX re-parents an orphan
        return True
    if sys.platform == "win32":  # Windows keeps the dead parent's pid: ask the handle multiprocessing holds
        parent = multiprocessing.parent_process()
        return parent is not None and not parent.is_alive()
    return False


def watch_parent(parent_pid: int, interval_s: float = WATCH_INTERVAL_S) -> threading.Thread:
    """A daemon thread that ends this process once ``parent_pid`` is gone."""

    def watch() -> None:
        while not parent_gone(parent_pid):
            time.sleep(interval_s)
        os._exit(ORPHAN_EXIT_CODE)

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread


def die_with_parent(parent_pid: int, *, watch: bool = True) -> None:
    """End this process when ``parent_pid`` ends: the death signal where the
    kernel has one, and (``watch``) the polling thread everywhere."""
    set_death_signal()
    if parent_gone(parent_pid):
        # the parent died before the death signal was set, so none will come
        os._exit(ORPHAN_EXIT_CODE)
        return  # reached only where a test has replaced os._exit
    if watch:
        watch_parent(parent_pid)


def _vm_size_bytes() -> Optional[int]:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def limit_worker_memory(headroom_mb: Optional[int]) -> None:
    """Pool initializer: cap this process's address space at what it holds now
    plus ``headroom_mb`` (None: no cap). The baseline is measured, not guessed,
    because the libraries' thread pools reserve address space per core."""
    if not headroom_mb:
        return
    try:
        import resource
    except ImportError:  # not POSIX: the timeout still applies
        return
    base = _vm_size_bytes()
    if base is None:  # no /proc (not Linux): no measured baseline to add the headroom to
        return
    limit = base + int(headroom_mb) * 1024 * 1024
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))

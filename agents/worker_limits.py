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
  thread that lives as long as the pool. A spawned worker re-imports the
  parent's main module (``genesis_fp16.cli``, then torch) and the
  initializer's package before any initializer runs: seconds on a loaded
  machine, during which a worker of a killed parent used to run on. So the
  pool's context (`death_signal_context`) sets the signal in the first line
  the new interpreter runs, before it reads anything from the parent.
* Everywhere: a daemon thread that polls whether the parent is still the one
  that started the worker (a POSIX orphan is re-parented to init or a
  subreaper; on Windows multiprocessing's handle on the parent is asked).
"""

from __future__ import annotations

import io
import multiprocessing
import os
import signal
import sys
import threading
import time
from multiprocessing import context, popen_spawn_posix, reduction, spawn, util
from pathlib import Path
from typing import Any, Optional

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
ORPHAN_EXIT_CODE = 1
WATCH_INTERVAL_S = 0.5

# Run by a spawned worker before multiprocessing's own bootstrap: the standard
# library only (the parent's sys.path is not set yet), and no exception may
# escape (a sandbox refusing prctl leaves the watch thread of `init_worker`).
# The pid check closes the race of a parent that died before the signal was set.
_ARM_PRELUDE = """\
import os
try:
    import ctypes, signal
    ctypes.CDLL(None, use_errno=True).prctl({option}, signal.SIGKILL, 0, 0, 0)
except Exception:
    pass
if os.getppid() != {parent}:
    os._exit({code})
"""


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


class _ArmedPopen(popen_spawn_posix.Popen):
    """multiprocessing's spawn, with `_ARM_PRELUDE` run first in the child.

    ``_launch`` is CPython's (3.8 to 3.13 alike) with one change, the command
    line: the standard library has no hook between exec and the import of the
    parent's main module."""

    def _launch(self, process_obj: Any) -> None:
        from multiprocessing import resource_tracker

        tracker_fd = resource_tracker.getfd()
        self._fds.append(tracker_fd)
        prep_data = spawn.get_preparation_data(process_obj._name)
        fp = io.BytesIO()
        context.set_spawning_popen(self)
        try:
            reduction.dump(prep_data, fp)
            reduction.dump(process_obj, fp)
        finally:
            context.set_spawning_popen(None)

        parent_r = child_w = child_r = parent_w = None
        try:
            parent_r, child_w = os.pipe()
            child_r, parent_w = os.pipe()
            cmd = armed_command_line(spawn.get_command_line(tracker_fd=tracker_fd, pipe_handle=child_r), os.getpid())
            self._fds.extend([child_r, child_w])
            self.pid = util.spawnv_passfds(spawn.get_executable(), cmd, self._fds)
            self.sentinel = parent_r
            with open(parent_w, "wb", closefd=False) as f:
                f.write(fp.getbuffer())
        finally:
            fds_to_close = [fd for fd in (parent_r, parent_w) if fd is not None]
            self.finalizer = util.Finalize(self, util.close_fds, fds_to_close)
            for fd in (child_r, child_w):
                if fd is not None:
                    os.close(fd)


def armed_command_line(cmd: list[str], parent_pid: int) -> list[str]:
    """multiprocessing's spawn command line ``cmd`` with `_ARM_PRELUDE` put
    before its ``-c`` program (unchanged where it has none: a frozen executable)."""
    if "-c" not in cmd:
        return cmd
    at = cmd.index("-c") + 1
    prelude = _ARM_PRELUDE.format(option=PR_SET_PDEATHSIG, parent=int(parent_pid), code=ORPHAN_EXIT_CODE)
    return cmd[:at] + [prelude + cmd[at]] + cmd[at + 1 :]


class _ArmedProcess(context.SpawnProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> _ArmedPopen:
        return _ArmedPopen(process_obj)


class _ArmedContext(context.SpawnContext):
    Process = _ArmedProcess


def death_signal_context() -> multiprocessing.context.BaseContext:
    """The spawn context for a pool whose workers must die with this process:
    on Linux each worker sets its death signal before it imports anything of
    ours; elsewhere plain spawn (`init_worker`'s watch thread covers it)."""
    if sys.platform.startswith("linux"):
        return _ArmedContext()
    return multiprocessing.get_context("spawn")


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

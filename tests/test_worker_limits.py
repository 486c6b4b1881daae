"""Evaluation workers die with their parent: after a `kill -9` of the process
that owns the pool (idle workers, and workers in the middle of an episode),
and through the portable parent watch alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from process_helpers import is_alive, kill_all, read_line, still_alive, wait_until

from agents import worker_limits

ROOT = Path(__file__).resolve().parents[1]
STARTUP_S = 120  # imports and worker start-up on a loaded machine
GONE_S = 10  # from the parent's death to its workers'

# A small evolve-like parent: an Evaluator with two worker processes, idle
# after one evaluation or busy in one that hangs; it prints the workers' pids.
PARENT = """
import dataclasses, functools, json, multiprocessing, sys, threading, time
import numpy as np
from agents import pendulum_task
from agents.evaluation import Evaluator

if __name__ == "__main__":
    evaluator = Evaluator(workers=2, timeout_s=3600)
    params, states = np.zeros(pendulum_task.N_PARAMS), [[0.0, 0.0], [1.0, 0.0]]
    if sys.argv[1] == "idle":
        evaluator.evaluate(params, states)
    else:
        # an env that takes an hour to make: the workers are busy when the parent dies
        evaluator.spec = dataclasses.replace(evaluator.spec, env_factory=functools.partial(time.sleep, 3600))
        threading.Thread(target=evaluator.evaluate, args=(params, states), daemon=True).start()
        while len(multiprocessing.active_children()) < 2:
            threading.Event().wait(0.05)
    print("workers", json.dumps(sorted(p.pid for p in multiprocessing.active_children())), flush=True)
    threading.Event().wait()
"""


@pytest.mark.parametrize("state", ["idle", "busy"])
def test_workers_die_when_their_parent_is_killed(state):
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, state], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    family: list[psutil.Process] = []
    try:
        line = read_line(parent.stdout, STARTUP_S, lambda text: text.startswith("workers "))
        pids = json.loads(line.split(" ", 1)[1])
        assert len(pids) == 2
        family = psutil.Process(parent.pid).children(
            recursive=True
        )  # the workers and multiprocessing's resource tracker
        assert set(pids) <= {p.pid for p in family}
        parent.kill()
        parent.wait(timeout=STARTUP_S)
        left = still_alive(family, GONE_S)
        assert not left, f"alive {GONE_S} s after their parent was killed: {[(p.pid, p.cmdline()) for p in left]}"
    finally:
        parent.kill()
        parent.wait(timeout=STARTUP_S)
        kill_all(family)


# An evolve-like parent whose main module takes long to import in a spawned
# worker (as `genesis_fp16.cli` and torch do on a loaded machine): it prints
# the workers' pids as soon as they exist, long before they reach the pool's
# initializer. Run from a file: spawn re-runs a main module that has a path.
SLOW_MAIN = """
import json, multiprocessing, os, sys, threading, time
if __name__ == "__mp_main__":  # a spawned worker re-running this module
    time.sleep(600)
from concurrent.futures import ProcessPoolExecutor
from agents import worker_limits

if __name__ == "__main__":
    pool = ProcessPoolExecutor(2, mp_context=worker_limits.death_signal_context(),
                               initializer=worker_limits.init_worker, initargs=(None, os.getpid()))
    for _ in range(2):
        pool.submit(int)
    print("workers", json.dumps(sorted(p.pid for p in multiprocessing.active_children())), flush=True)
    threading.Event().wait()
"""


@pytest.mark.skipif(
    not sys.platform.startswith("linux"),
    reason="PR_SET_PDEATHSIG is Linux's; elsewhere the watch thread starts in the initializer",
)
def test_workers_killed_while_still_importing_die_with_their_parent(tmp_path):
    """A `kill -9` of the parent while its workers are still importing its
    main module (before any pool initializer can run) ends them too: the death
    signal is set before the worker imports anything."""
    script = tmp_path / "slow_main.py"
    script.write_text(SLOW_MAIN)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    parent = subprocess.Popen(
        [sys.executable, str(script)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    family: list[psutil.Process] = []
    try:
        line = read_line(parent.stdout, STARTUP_S, lambda text: text.startswith("workers "))
        pids = json.loads(line.split(" ", 1)[1])
        assert len(pids) == 2
        family = psutil.Process(parent.pid).children(recursive=True)
        assert set(pids) <= {p.pid for p in family}
        parent.kill()
        parent.wait(timeout=STARTUP_S)
        left = still_alive(family, GONE_S)
        assert not left, f"alive {GONE_S} s after their parent was killed: {[(p.pid, p.cmdline()[-3:]) for p in left]}"
    finally:
        parent.kill()
        parent.wait(timeout=STARTUP_S)
        kill_all(family)


def test_the_armed_command_line_sets_the_signal_before_multiprocessing_starts():
    """The prelude goes in front of multiprocessing's own program, and exits
    at once in a child whose parent is already gone (no signal will come)."""
    cmd = [
        "python",
        "-I",
        "-c",
        "from multiprocessing.spawn import spawn_main; spawn_main(pipe_handle=5)",
        "--multiprocessing-fork",
    ]
    armed = worker_limits.armed_command_line(cmd, 4242)
    assert armed[:3] == cmd[:3] and armed[4:] == cmd[4:]
    assert armed[3].endswith(cmd[3]) and "prctl(1, signal.SIGKILL" in armed[3] and "!= 4242" in armed[3]
    assert worker_limits.armed_command_line(["frozen.exe", "--multiprocessing-fork"], 4242) == [
        "frozen.exe",
        "--multiprocessing-fork",
    ]
    orphan = subprocess.run(
        [sys.executable, "-c", worker_limits.armed_command_line(["-c", "print('ran')"], os.getpid() + 1)[1]],
        capture_output=True,
        text=True,
        timeout=STARTUP_S,
    )
    assert (orphan.returncode, orphan.stdout) == (worker_limits.ORPHAN_EXIT_CODE, "")
    kept = subprocess.run(
        [sys.executable, "-c", worker_limits.armed_command_line(["-c", "print('ran')"], os.getpid())[1]],
        capture_output=True,
        text=True,
        timeout=STARTUP_S,
    )
    assert (kept.returncode, kept.stdout) == (0, "ran\n")


WATCHED = """
import os, threading
from agents import worker_limits

if __name__ == "__main__":
    pid = os.fork()
    if pid == 0:  # the worker, watched by the polling thread alone (as where prctl is missing or fails)
        worker_limits.watch_parent(os.getppid(), interval_s=0.05)
        print("worker", os.getpid(), flush=True)
        threading.Event().wait()
    else:
        os.waitpid(pid, 0)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the test process is forked (POSIX)")
def test_parent_watch_alone_ends_an_orphaned_worker():
    parent = subprocess.Popen(
        [sys.executable, "-c", WATCHED], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    worker = None
    try:
        line = read_line(parent.stdout, STARTUP_S, lambda text: text.startswith("worker "))
        worker = psutil.Process(int(line.split()[1]))
        assert is_alive(worker)
        parent.kill()
        parent.wait(timeout=STARTUP_S)
        assert wait_until(lambda: not is_alive(worker), GONE_S), "the watch thread did not end the orphaned worker"
    finally:
        parent.kill()
        parent.wait(timeout=STARTUP_S)
        if worker is not None:
            kill_all([worker])


def test_worker_whose_parent_died_before_the_death_signal_was_set_exits(monkeypatch):
    """The race prctl leaves open: the parent died between starting the worker
    and the worker setting its death signal, so no signal will ever come. The
    worker sees another parent pid and exits at once."""
    exits, set_signal = [], []
    monkeypatch.setattr(
        worker_limits, "set_death_signal", lambda: set_signal.append(True) or True
    )  # not on the test process
    monkeypatch.setattr(worker_limits.os, "_exit", exits.append)
    worker_limits.die_with_parent(os.getppid() + 1, watch=False)  # "the original parent" is not our parent now
    assert set_signal == [True] and exits == [worker_limits.ORPHAN_EXIT_CODE]
    exits.clear()
    worker_limits.die_with_parent(os.getppid(), watch=False)  # the parent is still there: carry on
    assert exits == []


SIGNALLED = """
import os, threading
from agents import worker_limits

if __name__ == "__main__":
    pid = os.fork()
    if pid == 0:  # the worker, with the kernel's death signal alone (no watch thread)
        print("worker", os.getpid(), worker_limits.set_death_signal(), flush=True)
        threading.Event().wait()
    else:
        os.waitpid(pid, 0)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_death_signal_alone_ends_an_orphaned_worker():
    parent = subprocess.Popen(
        [sys.executable, "-c", SIGNALLED], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    worker = None
    try:
        line = read_line(parent.stdout, STARTUP_S, lambda text: text.startswith("worker "))
        _, pid, armed = line.split()
        worker = psutil.Process(int(pid))
        assert armed == "True" and is_alive(worker)
        parent.kill()
        parent.wait(timeout=STARTUP_S)
        assert wait_until(lambda: not is_alive(worker), GONE_S), "the death signal did not end the orphaned worker"
    finally:
        parent.kill()
        parent.wait(timeout=STARTUP_S)
        if worker is not None:
            kill_all([worker])


def test_workers_outlive_the_thread_that_asked_for_them():
    """The death signal follows the thread that started a worker; a call from
    a short-lived thread (as asyncio.to_thread's) must not cost the pool its
    workers once that thread ends."""
    import threading

    import numpy as np

    from agents import pendulum_task
    from agents.evaluation import Evaluator

    params, states = np.zeros(pendulum_task.N_PARAMS), [[0.0, 0.0], [1.0, 0.0]]
    with Evaluator(workers=2, timeout_s=120) as evaluator:
        first = []
        caller = threading.Thread(target=lambda: first.append(evaluator.evaluate(params, states)))
        caller.start()
        caller.join(timeout=STARTUP_S)
        assert first and not caller.is_alive()
        workers = [psutil.Process(p.pid) for p in evaluator._get_pool()._processes.values()]
        assert len(workers) == 2
        again = evaluator.evaluate(params, states)  # the same workers, still there
        assert again.returns == first[0].returns
        assert all(is_alive(p) for p in workers)


@pytest.mark.parametrize("routed", [True, False])
def test_a_workers_mujoco_warnings_go_to_the_routed_log_not_the_cwd(tmp_path, monkeypatch, routed):
    pytest.importorskip("mujoco")
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    import task_envs

    cwd, log = tmp_path / "cwd", tmp_path / "state" / "MUJOCO_LOG.TXT"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # the spawned worker starts here, as evolve's workers start in the user's directory
    with ProcessPoolExecutor(
        1,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=worker_limits.init_worker,
        initargs=(None, os.getpid(), str(log) if routed else None),
    ) as pool:
        assert pool.submit(task_envs.mujoco_warning).result(timeout=120) == 1
    stray = cwd / "MUJOCO_LOG.TXT"
    if routed:
        assert "QVEL" in log.read_text() and not stray.exists()
    else:  # MuJoCo's own default, which the routing exists to avoid
        assert stray.exists() and not log.exists()

"""The reaper of a local Ray (``agents.ray_reaper``), without Ray: a
stand-in "session" process with a file open in its session directory is
killed once the driver dies (whether or not the driver named the session),
and left alone when the driver stops the reaper."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from process_helpers import is_alive, kill_all, read_line, wait_until

from agents import ray_reaper

ROOT = Path(__file__).resolve().parents[1]
STARTUP_S = 120
GONE_S = 20

# a process of the session: its log open in the session directory, as every Ray process has
SESSION_PROCESS = """
import sys, threading
log = open(sys.argv[1], "a")
print("up", flush=True)
threading.Event().wait()
"""

# the driver: starts the reaper, then a session named as Ray names it (ending
# in the driver's pid) with one process in it; "named" tells the reaper the
# session, "unnamed" dies before that (as inside ray.init), "stop" stops the
# reaper as a clean shutdown does. Prints the pids.
DRIVER = """
import os, subprocess, sys, threading
from agents.ray_reaper import start_reaper

reaper = start_reaper()
session_dir = os.path.join(sys.argv[1], f"session_2026-01-01_00-00-00_000000_{os.getpid()}")
os.makedirs(os.path.join(session_dir, "logs"))
member = subprocess.Popen([sys.executable, "-c", sys.argv[2], session_dir + "/logs/raylet.out"],
                          stdout=subprocess.PIPE, text=True)
member.stdout.readline()
if sys.argv[3] != "unnamed":
    reaper.session(session_dir)
if sys.argv[3] == "stop":
    reaper.stop()
print("pids", member.pid, reaper.proc.pid, reaper.proc.returncode, flush=True)
threading.Event().wait()
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX process sessions")
@pytest.mark.parametrize("how", ["named", "unnamed", "stop"])
def test_the_session_dies_with_the_driver_unless_the_reaper_was_stopped(how, tmp_path):
    outsider = subprocess.Popen(
        [sys.executable, "-c", SESSION_PROCESS, str(tmp_path / "other.log")], stdout=subprocess.PIPE, text=True
    )
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(tmp_path), SESSION_PROCESS, how],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    procs = [psutil.Process(outsider.pid)]
    try:
        _, member_pid, reaper_pid, reaper_rc = read_line(
            driver.stdout, STARTUP_S, lambda text: text.startswith("pids ")
        ).split()
        member = psutil.Process(int(member_pid))
        procs.append(member)
        if how == "stop":
            assert reaper_rc == "0"  # stopped, and waited for: it reaps nothing
        else:
            reaper = psutil.Process(int(reaper_pid))
            procs.append(reaper)
        driver.kill()
        driver.wait(timeout=STARTUP_S)
        if how == "stop":
            assert is_alive(member)  # the driver's death does not end it by itself, and no reaper did
        else:
            assert wait_until(lambda: not is_alive(member), GONE_S), "the session's process outlived its driver"
            assert wait_until(lambda: not is_alive(reaper), GONE_S), "the reaper did not exit after its work"
        assert is_alive(psutil.Process(outsider.pid))  # a process of no session is never touched
    finally:
        driver.kill()
        driver.wait(timeout=STARTUP_S)
        kill_all(procs)
        ray_reaper.reap(ray_reaper.started_by(driver.pid), for_s=10)  # a session process this test never got the pid of
        outsider.wait(timeout=STARTUP_S)


def test_a_process_is_in_a_session_by_its_open_files(tmp_path):
    session_dir = str(tmp_path / "session_2026-01-01_00-00-00_000000_4242")
    me = psutil.Process()
    pattern = ray_reaper.session_pattern(session_dir)
    assert not ray_reaper.in_session(me, pattern)
    os.makedirs(session_dir)
    with open(os.path.join(session_dir, "worker.out"), "w"):
        assert ray_reaper.in_session(me, pattern) and ray_reaper.in_session(me, ray_reaper.started_by(4242))
        assert not ray_reaper.in_session(
            me, ray_reaper.session_pattern(session_dir[:-1])
        )  # a session whose name starts alike
        assert not ray_reaper.in_session(me, ray_reaper.started_by(242))  # a pid that ends alike
    assert not ray_reaper.in_session(me, pattern)

"""Whether `evolve`'s processes die with it: start a small `evolve` run, wait
until its evaluation workers exist, `kill -9` it at a random moment, and look
1.0 s later for any process it started (workers, multiprocessing's resource
tracker) still alive. Half the runs with a busy loop on every core.

    python scripts/kill_evolve_check.py [--runs 20] [--seed 0] [--grace 1.0] [--backend process|ray]

With ``--backend ray``: a local Ray, ready once a Ray worker (``ray::``)
runs; its processes (GCS, raylet, agents, workers, and the reaper that ends
them) count the same way. Each line also says when the last one was gone
(looked for up to `LINGER_S`).

Run from the repository root with the project's Python. Processes are found by
the state directory each run is given (inherited by everything it starts), so
an orphan re-parented away from `evolve` is still found. Exit status 1 when
any run left a process behind.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import psutil

from genesis_fp16.base.seeds import stream_seed

ROOT = Path(__file__).resolve().parents[1]
STATE_ENV = "GENESIS_FP16_STATE_DIR"
WORKER_MARK = "--multiprocessing-fork"
STARTUP_S = 180.0
LINGER_S = 30.0
EVOLVE = ["-m", "genesis_fp16.cli", "evolve", "--no-world-model", "--budget", "100000", "--workers", "2", "--seed", "0"]


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def started_for(state_dir: str) -> list[psutil.Process]:
    """Every live process whose environment names ``state_dir``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(STATE_ENV) == state_dir and alive(proc):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            pass
    return found


def left_of(state_dir: str, family: list[psutil.Process]) -> list[psutil.Process]:
    """What is alive of the run: by its environment, and of the descendants seen at the kill."""
    found = {p.pid: p for p in started_for(state_dir)}
    found.update((p.pid, p) for p in family if alive(p))
    return list(found.values())


def workers_of(pid: int, backend: str) -> list[psutil.Process]:
    try:
        family = psutil.Process(pid).children(recursive=True)
        if backend == "ray":
            return [p for p in family if p.name().startswith("ray::")]
        return [p for p in family if WORKER_MARK in " ".join(p.cmdline())]
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return []


def burners(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def one_run(index: int, loaded: bool, delay_s: float, grace_s: float, backend: str = "process") -> tuple[bool, str]:
    work = tempfile.mkdtemp(prefix="kill-evolve-")
    state_dir = os.path.join(work, "state")
    env = dict(os.environ, **{STATE_ENV: state_dir, "PYTHONPATH": str(ROOT)})
    load = burners(os.cpu_count() or 2) if loaded else []
    evolve: Optional[subprocess.Popen] = None
    try:
        started = time.monotonic()
        evolve = subprocess.Popen(
            [sys.executable, *EVOLVE, "--backend", backend],
            cwd=work,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        while not workers_of(evolve.pid, backend):
            if evolve.poll() is not None:
                return False, f"evolve ended (exit {evolve.returncode}) before its workers started"
            if time.monotonic() - started > STARTUP_S:
                return False, f"no workers within {STARTUP_S:g} s"
            time.sleep(0.02)
        first_worker_s = time.monotonic() - started
        time.sleep(delay_s)
        if evolve.poll() is not None:
            return False, f"evolve ended (exit {evolve.returncode}) before the kill"
        family = [p for p in psutil.Process(evolve.pid).children(recursive=True)]
        evolve.send_signal(signal.SIGKILL)
        evolve.wait()
        killed = time.monotonic()
        time.sleep(grace_s)
        left = left_of(state_dir, family)
        detail = (
            f"workers after {first_worker_s:.1f} s, killed {delay_s:.2f} s later with {len(family)} descendants; "
            f"{len(left)} alive {grace_s:g} s later"
        )
        if left:
            detail += ": " + ", ".join(f"{p.pid} {' '.join(p.cmdline())[-60:]!r}" for p in left)
            while left_of(state_dir, family) and time.monotonic() - killed < LINGER_S:
                time.sleep(0.05)
            lingering = left_of(state_dir, family)
            detail += (
                f"; still {len(lingering)} after {LINGER_S:g} s"
                if lingering
                else f"; all gone {time.monotonic() - killed:.1f} s after the kill"
            )
        return not left, detail
    finally:
        if evolve is not None and evolve.poll() is None:
            evolve.kill()
            evolve.wait()
        for proc in load:
            proc.kill()
            proc.wait()
        for proc in started_for(state_dir):  # whatever was left: not to spoil the next run
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        shutil.rmtree(work, ignore_errors=True)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--grace", type=float, default=1.0, help="seconds after the kill before looking")
    parser.add_argument("--backend", choices=("process", "ray"), default="process")
    parser.add_argument(
        "--max-delay", type=float, default=2.0, help="the kill comes 0 to this many seconds after the first worker"
    )
    args = parser.parse_args(argv)
    rng = random.Random(stream_seed(args.seed, "kill_evolve_check.delays"))
    clean = {True: 0, False: 0}
    runs = {True: 0, False: 0}
    for i in range(args.runs):
        loaded = i % 2 == 0
        delay = rng.uniform(0.0, args.max_delay)
        ok, detail = one_run(i, loaded, delay, args.grace, args.backend)
        runs[loaded] += 1
        clean[loaded] += ok
        print(f"run {i + 1:2d} {'loaded' if loaded else 'quiet '} {'clean' if ok else 'LEFT '}: {detail}", flush=True)
    total = clean[True] + clean[False]
    print(
        f"{total} of {args.runs} clean within {args.grace:g} s (loaded: {clean[True]}/{runs[True]}, quiet: "
        f"{clean[False]}/{runs[False]})"
    )
    return 0 if total == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())

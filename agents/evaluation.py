"""Real evaluations in worker processes, with a timeout and a memory limit.

A small pool (spawn context: no forked torch/thread state) is created once and
reused across generations. A candidate that does not finish within the
timeout is abandoned: the pool's processes are terminated and a fresh pool
starts, so a hanging candidate cannot hang the loop. Each worker's address
space may grow at most ``memory_limit_mb`` over what it holds once started
(``RLIMIT_AS``, where the platform has it): a runaway evaluation gets a
``MemoryError`` in its own process instead of taking the machine's memory.
A worker dies with the process that started it (``agents.worker_limits``), so
a ``kill -9`` of the loop leaves no worker behind. How a call is split into
chunks and put back together is shared with the Ray backend
(``agents.evaluation_contract``).
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, TypeVar, Union

from genesis_fp16.base.extras import require
from genesis_fp16.base.telemetry import get_logger

from .evaluation_contract import (
    Chunk,
    Evaluation,
    EvaluationBackend,
    EvaluationEnvError,
    EvaluationError,
    EvaluationMemoryError,
    EvaluationTimeout,
    EvaluationWorkerLost,
    EpisodesDone,
    Job,
    SingleEvaluation,
    assemble,
    capped,
    check_limits,
    collect,
    default_task,
    over_memory,
    split_jobs,
    timed_out,
    worker_lost,
)
from .tasks import EpisodeSpec, ResolvedTask, run_episodes
from .worker_limits import death_signal_context, init_worker

__all__ = [
    "BACKENDS",
    "Evaluation",
    "EvaluationBackend",
    "EvaluationEnvError",
    "EvaluationError",
    "EvaluationMemoryError",
    "EvaluationTimeout",
    "EvaluationWorkerLost",
    "Evaluator",
    "make_evaluator",
]

T = TypeVar("T")

BACKENDS = ("process", "ray")


def make_evaluator(
    task: ResolvedTask,
    *,
    backend: str = "process",
    workers: int = 2,
    timeout_s: float = 60.0,
    memory_limit_mb: Optional[int] = 2048,
    mujoco_log: Optional[Path] = None,
) -> EvaluationBackend:
    """The evaluator ``backend`` names: 'process' (a local spawn pool) or 'ray'
    (tasks on the Ray cluster this process is connected to). ``mujoco_log``:
    see `Evaluator` (the process pool only)."""
    if backend == "process":
        return Evaluator(
            task, workers=workers, timeout_s=timeout_s, memory_limit_mb=memory_limit_mb, mujoco_log=mujoco_log
        )
    if backend == "ray":
        from .ray_evaluation import RayEvaluator

        return RayEvaluator(task, workers=workers, timeout_s=timeout_s, memory_limit_mb=memory_limit_mb)
    raise ValueError(f"backend={backend!r}: expected one of {', '.join(BACKENDS)}")


class Evaluator(SingleEvaluation):
    """``evaluate(params, states)`` runs one real episode per start state of
    ``task`` (default: the built-in Pendulum task), split over ``workers`` processes.
    ``mujoco_log``: the file the workers' MuJoCo warnings go to (default: MuJoCo's
    own, ``MUJOCO_LOG.TXT`` in the working directory)."""

    def __init__(
        self,
        task: Optional[ResolvedTask] = None,
        workers: int = 2,
        timeout_s: float = 60.0,
        memory_limit_mb: Optional[int] = 2048,
        mujoco_log: Optional[Path] = None,
    ) -> None:
        check_limits(workers, timeout_s, memory_limit_mb)
        require("gymnasium", "real episodes of the evolution loop")  # here, not in the workers: they never import torch
        self.task = task or default_task()
        self.spec = self.task.episode_spec
        self.workers = workers
        self.timeout_s = timeout_s
        self.memory_limit_mb = memory_limit_mb
        self.mujoco_log = mujoco_log
        self._pool: Optional[ProcessPoolExecutor] = None
        self._spawner: Optional[ThreadPoolExecutor] = None
        self._lock = threading.Lock()
        self._log = get_logger("agents.evaluation")

    def _get_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=death_signal_context(),
                initializer=init_worker,
                initargs=(self.memory_limit_mb, os.getpid(), None if self.mujoco_log is None else str(self.mujoco_log)),
            )
        return self._pool

    def _on_spawner(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` on this evaluator's own thread. A process pool starts its
        workers in the thread that submits, and Linux's parent-death signal
        fires when that *thread* ends: a worker started from a short-lived
        thread (``asyncio.to_thread``'s, a caller's) would be killed with it.
        This thread lives until `close`."""
        if self._spawner is None:
            self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="evaluator-spawner")
        return self._spawner.submit(fn, *args).result()

    def _kill_pool(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        for proc in list((pool._processes or {}).values()):  # the executor has no public kill
            if proc.is_alive():
                proc.terminate()
        pool.shutdown(wait=False, cancel_futures=True)

    def evaluate_many(
        self,
        jobs: Sequence[Job],
        *,
        per_job_env_errors: bool = False,
        on_episodes: Optional[EpisodesDone] = None,
        max_steps: Optional[int] = None,
    ) -> list[Union[Evaluation, EvaluationEnvError]]:
        """Several candidates at once: every (params, states) job is split
        into per-worker chunks and all chunks share the pool. An env that
        raises fails the whole call, or with ``per_job_env_errors`` only its
        own job, whose place in the list then holds the error (every other
        job's episodes ran and are returned). ``on_episodes(n)`` is called as
        each chunk of ``n`` episodes is collected (in submission order).
        ``max_steps``: each episode ends after at most this many steps (fewer than the task's: a cut episode)."""
        with self._lock:
            submitted = self._on_spawner(self._submit, jobs, capped(self.spec, max_steps))
            deadline = time.monotonic() + self.timeout_s

            def get(fut: Future[dict[str, Any]]) -> dict[str, Any]:
                return fut.result(timeout=max(0.0, deadline - time.monotonic()))

            try:
                results, env_errors = collect(
                    submitted, get, jobs, per_job_env_errors=per_job_env_errors, log=self._log, on_episodes=on_episodes
                )
            except FutureTimeout:
                error = timed_out(self._log, jobs, self.timeout_s)
                self._kill_pool()
                raise error from None
            except MemoryError:
                # raised inside a worker by its RLIMIT_AS; the worker itself survives, but
                # the other chunks of this call are abandoned with a fresh pool
                error = over_memory(self._log, jobs, self.memory_limit_mb)
                self._kill_pool()
                raise error from None
            except EvaluationEnvError:  # the env raised: the workers are fine, the pool stays
                for _, fut in submitted:
                    fut.cancel()
                raise
            except BrokenProcessPool as exc:  # a worker died (killed, or the env called os._exit)
                error = worker_lost(self._log, jobs, 0, str(exc), "lost a worker process")
                self._kill_pool()  # the next call starts a fresh pool
                raise error from None
            except BaseException:
                self._kill_pool()
                raise
        return assemble(jobs, results, env_errors)

    def _submit(self, jobs: Sequence[Job], spec: EpisodeSpec) -> list[tuple[Chunk, Future[dict[str, Any]]]]:
        """Every job's chunks on the pool, each with its future."""
        pool = self._get_pool()
        return [
            (chunk, pool.submit(run_episodes, spec, chunk.params, chunk.states))
            for chunk in split_jobs(jobs, self.workers)
        ]

    def terminate(self) -> None:
        """Stop the workers now (Ctrl-C): running episodes are abandoned."""
        self._kill_pool()  # no lock: the thread holding it may be the one waiting on these workers

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        spawner, self._spawner = self._spawner, None
        if spawner is not None:  # after the pool: its workers are gone, so the thread may end
            spawner.shutdown(wait=True)

    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

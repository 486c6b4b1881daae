"""Real evaluations in worker processes, with a timeout and a memory limit.

A small pool (spawn context: no forked torch/thread state) is created once and
reused across generations. A candidate that does not finish within the
timeout is abandoned: the pool's processes are terminated and a fresh pool
starts, so a hanging candidate cannot hang the loop. Each worker's address
space may grow at most ``memory_limit_mb`` over what it holds once started
(``RLIMIT_AS``, where the platform has it): a runaway evaluation gets a
``MemoryError`` in its own process instead of taking the machine's memory.
A worker dies with the process that started it (``agents.worker_limits``), so
a ``kill -9`` of the loop leaves no worker behind.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Protocol, Sequence, TypeVar, Union

import numpy as np

from genesis_fp16.extras import require
from genesis_fp16.telemetry import get_logger

from .tasks import EnvFailure, ResolvedTask, run_episodes
from .worker_limits import init_worker

T = TypeVar("T")


class EvaluationError(RuntimeError):
    """A real evaluation failed in its worker: the candidate is charged and skipped."""


class EvaluationTimeout(EvaluationError):
    """A real evaluation did not finish within its timeout."""


class EvaluationMemoryError(EvaluationError):
    """A real evaluation went over its worker's memory limit."""


class EvaluationWorkerLost(EvaluationError):
    """A worker process (or a Ray worker or node, on every retry) died while
    running the evaluation: charged and skipped like a timeout."""


class EvaluationEnvError(EvaluationError):
    """The task's environment raised in make, reset or step."""


@dataclass
class Evaluation:
    returns: list[float]
    episodes: list[dict[str, np.ndarray]] = field(default_factory=list)

    @property
    def mean_return(self) -> float:
        return float(np.mean(self.returns)) if self.returns else float("-inf")

    @property
    def env_steps(self) -> int:
        """Real env steps of these episodes."""
        return sum(len(ep["reward"]) for ep in self.episodes if "reward" in ep)


BACKENDS = ("process", "ray")


class EvaluationBackend(Protocol):
    """What the loop needs of an evaluator: `Evaluator` (a local
    process pool, the default) or ``agents.ray_evaluation.RayEvaluator``."""

    task: ResolvedTask
    workers: int
    timeout_s: float

    def evaluate(
        self, params: Sequence[float], states: Sequence[Sequence[float]], *, hang_seconds: float = 0.0, alloc_mb: int = 0
    ) -> Evaluation: ...

    def evaluate_many(
        self,
        jobs: Sequence[tuple[Sequence[float], Sequence[Sequence[float]]]],
        *,
        hang_seconds: float = 0.0,
        alloc_mb: int = 0,
        per_job_env_errors: bool = False,
    ) -> list[Union[Evaluation, EvaluationEnvError]]: ...

    def terminate(self) -> None: ...

    def close(self) -> None: ...


def check_limits(workers: int, timeout_s: float, memory_limit_mb: Optional[int]) -> None:
    if workers < 1:
        raise ValueError(f"workers={workers}: expected >= 1")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s={timeout_s}: expected > 0")
    if memory_limit_mb is not None and memory_limit_mb < 1:
        raise ValueError(f"memory_limit_mb={memory_limit_mb}: expected >= 1 or None (no limit)")


def default_task() -> ResolvedTask:
    from .tasks.builtin import pendulum

    return pendulum().resolve()


def make_evaluator(
    task: ResolvedTask, *, backend: str = "process", workers: int = 2, timeout_s: float = 60.0, memory_limit_mb: Optional[int] = 2048,
    mujoco_log: Optional[Path] = None,
) -> EvaluationBackend:
    """The evaluator ``backend`` names: 'process' (a local spawn pool) or 'ray'
    (tasks on the Ray cluster this process is connected to). ``mujoco_log``:
    see `Evaluator` (the process pool only)."""
    if backend == "process":
        return Evaluator(task, workers=workers, timeout_s=timeout_s, memory_limit_mb=memory_limit_mb, mujoco_log=mujoco_log)
    if backend == "ray":
        from .ray_evaluation import RayEvaluator

        return RayEvaluator(task, workers=workers, timeout_s=timeout_s, memory_limit_mb=memory_limit_mb)
    raise ValueError(f"backend={backend!r}: expected one of {', '.join(BACKENDS)}")


class SingleEvaluation:
    """``evaluate`` for a backend that has ``evaluate_many``."""

    def evaluate(
        self, params: Sequence[float], states: Sequence[Sequence[float]], *, hang_seconds: float = 0.0, alloc_mb: int = 0
    ) -> Evaluation:
        """One real episode per start state for one candidate."""
        (result,) = self.evaluate_many([(params, states)], hang_seconds=hang_seconds, alloc_mb=alloc_mb)  # type: ignore[attr-defined]
        assert isinstance(result, Evaluation)  # an env error raised: per_job_env_errors is off
        return result


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
                mp_context=multiprocessing.get_context("spawn"),
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
        jobs: Sequence[tuple[Sequence[float], Sequence[Sequence[float]]]],
        *,
        hang_seconds: float = 0.0,
        alloc_mb: int = 0,
        per_job_env_errors: bool = False,
    ) -> list[Union[Evaluation, EvaluationEnvError]]:
        """Several candidates at once: every (params, states) job is split
        into per-worker chunks and all chunks share the pool. An env that
        raises fails the whole call, or with ``per_job_env_errors`` only its
        own job, whose place in the list then holds the error (every other
        job's episodes ran and are returned)."""
        with self._lock:
            submitted = self._on_spawner(self._submit, jobs, hang_seconds, alloc_mb)
            deadline = time.monotonic() + self.timeout_s
            results = []
            env_errors: dict[int, EvaluationEnvError] = {}
            try:
                for j, idx, fut in submitted:
                    try:
                        results.append((j, idx, fut.result(timeout=max(0.0, deadline - time.monotonic()))))
                    except EnvFailure as exc:
                        if not per_job_env_errors:
                            raise
                        self._log.warning("evolve.evaluation_env_error", episodes=len(jobs[j][1]), error=str(exc))
                        env_errors.setdefault(j, EvaluationEnvError(f"real evaluation of {len(jobs[j][1])} episodes failed: {exc}"))
            except FutureTimeout:
                n = sum(len(s) for _, s in jobs)
                self._log.warning("evolve.evaluation_timeout", timeout_s=self.timeout_s, episodes=n)
                self._kill_pool()
                raise EvaluationTimeout(f"real evaluation of {n} episodes did not finish within {self.timeout_s:g} s") from None
            except MemoryError:
                # raised inside a worker by its RLIMIT_AS; the worker itself survives, but
                # the other chunks of this call are abandoned with a fresh pool
                n = sum(len(s) for _, s in jobs)
                self._log.warning("evolve.evaluation_memory_limit", memory_limit_mb=self.memory_limit_mb, episodes=n)
                self._kill_pool()
                raise EvaluationMemoryError(
                    f"real evaluation of {n} episodes went over the worker memory limit ({self.memory_limit_mb} MiB)"
                ) from None
            except EnvFailure as exc:  # the env raised: the workers are fine, the pool stays
                n = sum(len(s) for _, s in jobs)
                self._log.warning("evolve.evaluation_env_error", episodes=n, error=str(exc))
                for _, _, fut in submitted:
                    fut.cancel()
                raise EvaluationEnvError(f"real evaluation of {n} episodes failed: {exc}") from None
            except BrokenProcessPool as exc:  # a worker died (killed, or the env called os._exit)
                n = sum(len(s) for _, s in jobs)
                self._log.warning("evolve.evaluation_worker_lost", episodes=n, retries=0, error=str(exc))
                self._kill_pool()  # the next call starts a fresh pool
                raise EvaluationWorkerLost(f"real evaluation of {n} episodes lost a worker process: {exc}") from None
            except BaseException:
                self._kill_pool()
                raise
        out: list[Union[Evaluation, EvaluationEnvError]] = []
        for j, (_, states) in enumerate(jobs):
            if j in env_errors:
                out.append(env_errors[j])
                continue
            returns: list[float] = [0.0] * len(states)
            episodes: list[dict[str, np.ndarray]] = [{} for _ in states]
            for jj, idx, res in results:
                if jj != j:
                    continue
                for k, i in enumerate(idx):
                    returns[i] = res["returns"][k]
                    episodes[i] = res["episodes"][k]
            out.append(Evaluation(returns=returns, episodes=episodes))
        return out

    def _submit(self, jobs: Sequence[tuple[Sequence[float], Sequence[Sequence[float]]]], hang_seconds: float, alloc_mb: int) -> list[tuple[int, list[int], Future[dict[str, Any]]]]:
        """Every job split into per-worker chunks on the pool: (job index, state indices, future)."""
        pool = self._get_pool()
        submitted = []
        for j, (params, states) in enumerate(jobs):
            states = [list(map(float, s)) for s in states]
            plist = [float(v) for v in params]
            for w in range(self.workers):
                idx = list(range(len(states)))[w :: self.workers]
                if idx:
                    fut = pool.submit(run_episodes, self.spec, plist, [states[i] for i in idx], hang_seconds, alloc_mb)
                    submitted.append((j, idx, fut))
        return submitted

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

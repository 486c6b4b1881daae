"""Real evaluations as Ray tasks: ``genesis-fp16 evolve --backend ray``.

The same contract as the process pool (`agents.evaluation.Evaluator`; both
split and reassemble in ``agents.evaluation_contract``): every candidate's
start states are split into ``workers`` chunks, one stateless Ray task per
chunk (several episodes per task, never one per step); all of a call's tasks
must finish within ``timeout_s`` (``ray.wait``), and a late one is cancelled
with ``ray.cancel(force=True)``, which kills its worker.
The memory limit is set inside the task (``RLIMIT_AS``, as in a pool worker):
Ray's own ``memory=`` only schedules. A system failure (the worker process or
its node died) is retried by Ray up to ``max_retries`` times, then the call
fails with `EvaluationWorkerLost`, charged and skipped like a timeout.
An env that raises is an `EvaluationEnvError`, exactly as in the pool.

A local Ray that `connect_ray` starts is tied to this process: a reaper
(``agents.ray_reaper``) ends its processes once this process is gone, even
after a ``kill -9``; `disconnect_ray` shuts it down and stops the reaper.

Ray is imported only here, and only when this backend is chosen.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, Optional, Sequence, Union

from genesis_fp16.base.extras import require
from genesis_fp16.base.telemetry import get_logger

from .evaluation_contract import (
    Chunk,
    Evaluation,
    EvaluationEnvError,
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
from .ray_reaper import Reaper, start_reaper
from .ray_task import run_chunk
from .tasks import EnvFailure, EpisodeSpec, ResolvedTask

__all__ = ["EvaluationWorkerLost", "RayConnectError", "RayEvaluator", "connect_ray", "disconnect_ray", "ray_connection"]

RAY = "genesis-fp16 evolve --backend ray"
PROBE_TIMEOUT_S = 3.0
_reaper: Optional[Reaper] = None  # of the local Ray this process started, while it runs


class RayConnectError(ConnectionError):
    """``--ray-address`` names no running Ray cluster."""


def _probe(address: str) -> None:
    """Fail fast where HOST:PORT accepts no connection: ``ray.init`` would
    retry a dead address for minutes."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise RayConnectError(
            f"--ray-address {address!r}: expected 'auto' or HOST:PORT (the head node's GCS address, port 6379 by "
            "default)"
        )
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=PROBE_TIMEOUT_S).close()
    except OSError as exc:
        raise RayConnectError(
            f"--ray-address {address}: no Ray cluster answers there ({exc}); start one with `ray start --head` "
            "and pass the address it prints, or leave --ray-address out to start a local Ray"
        ) from None


def connect_ray(address: Optional[str], num_cpus: Optional[int]) -> Any:
    """Connect to the Ray cluster at ``address`` ('auto' or HOST:PORT), or
    without one start a local Ray with ``num_cpus`` CPUs whose processes end
    with this one (`disconnect_ray` shuts it down). Returns the ``ray``
    module; raises `RayConnectError` when nothing answers there."""
    global _reaper
    ray = require("ray", RAY)
    if address is None:
        reaper = start_reaper()  # first: a driver killed while Ray starts is covered once Ray says where its session is
        try:
            context = ray.init(
                num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING
            )
            reaper.session(context.address_info["session_dir"])
        except BaseException:
            reaper.stop()
            raise
        _reaper = reaper
        return ray
    if address != "auto":
        _probe(address)
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    except ConnectionError as exc:
        raise RayConnectError(f"--ray-address {address}: {exc}") from None
    return ray


@contextmanager
def ray_connection(address: Optional[str], num_cpus: Optional[int]) -> Iterator[Any]:
    """`connect_ray` for a ``with`` block, `disconnect_ray` after it."""
    ray = connect_ray(address, num_cpus)
    try:
        yield ray
    finally:
        disconnect_ray()


def disconnect_ray() -> None:
    """Disconnect from Ray; a local Ray `connect_ray` started is shut down and its reaper stopped."""
    global _reaper
    require("ray", RAY).shutdown()
    reaper, _reaper = _reaper, None
    if reaper is not None:  # after the shutdown: a driver killed during it is still covered
        reaper.stop()


class RayEvaluator(SingleEvaluation):
    """``evaluate(params, states)`` as Ray tasks on the cluster this process
    is connected to (`connect_ray`; without a connection, a local Ray
    with ``workers`` CPUs is started and shut down by `close`)."""

    def __init__(
        self,
        task: Optional[ResolvedTask] = None,
        workers: int = 2,
        timeout_s: float = 60.0,
        memory_limit_mb: Optional[int] = 2048,
        max_retries: int = 2,
    ) -> None:
        check_limits(workers, timeout_s, memory_limit_mb)
        if max_retries < 0:
            raise ValueError(f"max_retries={max_retries}: expected >= 0")
        require("gymnasium", "real episodes of the evolution loop")
        self._ray = require("ray", RAY)
        self._own_ray = not self._ray.is_initialized()
        if self._own_ray:
            connect_ray(None, workers)
        self.task = task or default_task()
        self.spec = self.task.episode_spec
        self.workers = workers
        self.timeout_s = timeout_s
        self.memory_limit_mb = memory_limit_mb
        self.max_retries = max_retries
        self._remote = self._ray.remote(num_cpus=1, max_retries=max_retries, retry_exceptions=False)(run_chunk)
        self._running: list[Any] = []
        self._spec_ref: Optional[tuple[Any, Any]] = None  # (spec, its object ref): serialised once, not once per task
        self._lock = threading.Lock()
        self._log = get_logger("agents.evaluation")

    def evaluate_many(
        self,
        jobs: Sequence[Job],
        *,
        per_job_env_errors: bool = False,
        on_episodes: Optional[EpisodesDone] = None,
        max_steps: Optional[int] = None,
    ) -> list[Union[Evaluation, EvaluationEnvError]]:
        """Several candidates at once, as `agents.evaluation.Evaluator.evaluate_many` (``on_episodes`` told of each
        task as it finishes, in the order they finish; ``max_steps`` as there)."""
        with self._lock:
            submitted = self._submit(jobs, capped(self.spec, max_steps))
            self._running = [ref for _, ref in submitted]
            try:
                late = self._wait(submitted, on_episodes)
                if late:
                    error = timed_out(self._log, jobs, self.timeout_s)
                    self._cancel()
                    raise error
                results, env_errors = collect(
                    submitted,
                    lambda ref: self._get(ref, jobs),
                    jobs,
                    per_job_env_errors=per_job_env_errors,
                    log=self._log,
                )  # every task has finished: on_episodes was told as they did
            except BaseException:
                self._cancel()
                raise
            finally:
                self._running = []
        return assemble(jobs, results, env_errors)

    def _wait(self, submitted: Sequence[tuple[Chunk, Any]], on_episodes: Optional[EpisodesDone]) -> list[Any]:
        """Wait for every task until ``timeout_s`` from now; returns those still running then (none: all finished).
        Without ``on_episodes`` one wait for them all, else one per finished task, each told as it finishes."""
        ray, refs = self._ray, [ref for _, ref in submitted]
        if on_episodes is None:
            _, late = ray.wait(refs, num_returns=len(refs), timeout=self.timeout_s)
            return list(late)
        sizes = {ref: len(chunk.indices) for chunk, ref in submitted}
        deadline, left = time.monotonic() + self.timeout_s, refs
        while left:
            ready, left = ray.wait(left, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                return list(left)
            for ref in ready:
                on_episodes(sizes[ref])
        return []

    def _get(self, ref: Any, jobs: Sequence[Job]) -> dict[str, Any]:
        """One task's result; its failure as this module's errors (EnvFailure passes through)."""
        ray = self._ray
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause
            if isinstance(cause, EnvFailure):
                raise cause from None
            if isinstance(cause, MemoryError):
                raise over_memory(self._log, jobs, self.memory_limit_mb) from None
            if isinstance(cause, SystemExit):
                raise self._lost(jobs, f"the task exited ({cause})")
            raise
        except (
            ray.exceptions.WorkerCrashedError,
            ray.exceptions.NodeDiedError,
            ray.exceptions.LocalRayletDiedError,
            ray.exceptions.ObjectLostError,
        ) as exc:
            raise self._lost(jobs, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")

    def _lost(self, jobs: Sequence[Job], why: str) -> EvaluationWorkerLost:
        return worker_lost(
            self._log, jobs, self.max_retries, why, f"lost its Ray worker on every try ({1 + self.max_retries})"
        )

    def _submit(self, jobs: Sequence[Job], spec: EpisodeSpec) -> list[tuple[Chunk, Any]]:
        """Every job's chunks as Ray tasks, each with its object ref (``spec``: the task's, or a capped copy)."""
        if self._spec_ref is None or self._spec_ref[0] is not spec:
            self._spec_ref = (spec, self._ray.put(spec))
        spec = self._spec_ref[1]
        return [
            (chunk, self._remote.remote(spec, chunk.params, chunk.states, self.memory_limit_mb))
            for chunk in split_jobs(jobs, self.workers)
        ]

    def _cancel(self) -> None:
        """Force-cancel the running tasks that have not finished, once each.
        A finished task is left alone: force-cancelling one whose error had
        already been read (the memory-limit test) aborted Ray 2.60's driver
        once in a full test run ("Tried to complete task that was not
        pending"), and the whole process died with it."""
        refs, self._running = list(self._running), []
        if not refs:
            return
        _, unfinished = self._ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in unfinished:
            self._ray.cancel(ref, force=True)

    def terminate(self) -> None:
        """Stop the running tasks now (Ctrl-C): their workers are killed."""
        self._cancel()  # no lock: the thread holding it may be the one waiting on these tasks

    def close(self) -> None:
        self._cancel()
        if self._own_ray:
            self._own_ray = False
            disconnect_ray()

    def __enter__(self) -> "RayEvaluator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

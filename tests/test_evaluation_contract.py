"""What both evaluation backends share: the split of a call's jobs into
chunks, the collection of the chunks' results and their assembly, on plain
data (no worker process, no Ray)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from agents.evaluation_contract import (
    Chunk,
    Evaluation,
    EvaluationEnvError,
    EvaluationMemoryError,
    EvaluationTimeout,
    EvaluationWorkerLost,
    assemble,
    collect,
    over_memory,
    split_jobs,
    timed_out,
    worker_lost,
)
from agents.tasks import EnvFailure


class Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.levels: list[str] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))
        self.levels.append("warning")

    def info(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))
        self.levels.append("info")


def _run(chunk: Chunk) -> dict[str, Any]:
    """A fake worker: each episode's return names its job and start state."""
    returns = [10.0 * chunk.job + s[0] for s in chunk.states]
    return {"returns": returns, "episodes": [{"reward": np.zeros(int(s[0]) + 1)} for s in chunk.states]}


JOBS = [(np.array([1.0, 2.0]), [[0.0], [1.0], [2.0], [3.0], [4.0]]), ([3], [[5.0], [6.0]]), ([4.0], [])]


def test_states_are_dealt_round_robin_as_plain_floats():
    chunks = split_jobs(JOBS, 2)
    assert [(c.job, c.indices) for c in chunks] == [(0, [0, 2, 4]), (0, [1, 3]), (1, [0]), (1, [1])]
    assert chunks[0].states == [[0.0], [2.0], [4.0]] and chunks[2].params == [3.0]
    assert all(type(v) is float for c in chunks for v in [*c.params, *(x for s in c.states for x in s)])
    assert [c.indices for c in split_jobs(JOBS[:1], 3)] == [[0, 3], [1, 4], [2]]
    assert [c.indices for c in split_jobs(JOBS[1:2], 8)] == [[0], [1]]  # no empty chunk


@pytest.mark.parametrize("workers", [1, 2, 3, 7])
def test_assembly_puts_every_return_back_in_its_start_states_place(workers):
    chunks = split_jobs(JOBS, workers)
    results, errors = collect([(c, c) for c in reversed(chunks)], _run, JOBS, per_job_env_errors=False, log=Log())
    out = assemble(JOBS, results, errors)
    assert [e.returns for e in out] == [[0.0, 1.0, 2.0, 3.0, 4.0], [15.0, 16.0], []]
    assert [[len(ep["reward"]) for ep in e.episodes] for e in out] == [[1, 2, 3, 4, 5], [6, 7], []]
    assert out[0].env_steps == 15 and out[2].mean_return == float("-inf")


def _failing(job: int):
    def get(chunk: Chunk) -> dict[str, Any]:
        if chunk.job == job:
            raise EnvFailure("env 'X' raised in step: boom")
        return _run(chunk)

    return get


def test_an_env_error_fails_only_its_job_when_asked():
    log = Log()
    submitted = [(c, c) for c in split_jobs(JOBS, 2)]
    results, errors = collect(submitted, _failing(0), JOBS, per_job_env_errors=True, log=log)
    out = assemble(JOBS, results, errors)
    assert (
        isinstance(out[0], EvaluationEnvError)
        and str(out[0]) == "real evaluation of 5 episodes failed: env 'X' raised in step: boom"
    )
    assert isinstance(out[1], Evaluation) and out[1].returns == [15.0, 16.0]
    assert [f["episodes"] for _, f in log.events] == [5, 5]  # both of job 0's chunks failed
    assert log.levels == ["info", "info"]  # the caller charges the job and warns of it, once


def test_collect_tells_of_each_chunks_episodes_as_it_comes():
    done: list[int] = []
    submitted = [(c, c) for c in split_jobs(JOBS, 2)]
    results, errors = collect(submitted, _failing(0), JOBS, per_job_env_errors=True, log=Log(), on_episodes=done.append)
    assert done == [len(c.indices) for c in split_jobs(JOBS, 2)] and sum(done) == 7  # failed chunks too: they ran


def test_an_env_error_fails_the_whole_call_otherwise():
    log = Log()
    with pytest.raises(
        EvaluationEnvError, match="^real evaluation of 7 episodes failed: env 'X' raised in step: boom$"
    ):
        collect([(c, c) for c in split_jobs(JOBS, 2)], _failing(1), JOBS, per_job_env_errors=False, log=log)
    assert log.events == [("evolve.evaluation_env_error", {"episodes": 7, "error": "env 'X' raised in step: boom"})]


def test_a_backends_own_failure_passes_through_collect():
    def get(chunk: Chunk) -> dict[str, Any]:
        raise MemoryError

    with pytest.raises(MemoryError):
        collect([(c, c) for c in split_jobs(JOBS, 2)], get, JOBS, per_job_env_errors=True, log=Log())


def test_the_failures_both_backends_charge():
    log = Log()
    assert isinstance(timed_out(log, JOBS, 1.0), EvaluationTimeout)
    assert str(timed_out(log, JOBS, 2.5)) == "real evaluation of 7 episodes did not finish within 2.5 s"
    assert str(over_memory(log, JOBS, 64)) == "real evaluation of 7 episodes went over the worker memory limit (64 MiB)"
    assert isinstance(over_memory(log, JOBS, 64), EvaluationMemoryError)
    lost = worker_lost(log, JOBS, 2, "WorkerCrashedError: gone", "lost its Ray worker on every try (3)")
    assert isinstance(lost, EvaluationWorkerLost)
    assert str(lost) == "real evaluation of 7 episodes lost its Ray worker on every try (3): WorkerCrashedError: gone"
    assert [e for e, _ in log.events] == ["evolve.evaluation_timeout"] * 2 + ["evolve.evaluation_memory_limit"] * 2 + [
        "evolve.evaluation_worker_lost"
    ]
    assert log.events[-1][1] == {"episodes": 7, "retries": 2, "error": "WorkerCrashedError: gone"}

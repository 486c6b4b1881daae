"""What every evaluation backend shares: the process pool
(`agents.evaluation.Evaluator`) and Ray tasks
(`agents.ray_evaluation.RayEvaluator`).

The result (`Evaluation`), the errors a caller charges a candidate for, and
the two ends of a call: its jobs split into chunks (`split_jobs`), and the
chunks' results put back into one `Evaluation` per job (`collect`,
`assemble`). A backend only runs chunks and waits for them; since both split
and reassemble here, the same seed gives the same returns and episodes on
either. Both log the same events (logger ``agents.evaluation``) with the same
fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Protocol, Sequence, TypeVar, Union

import numpy as np

from .tasks import EnvFailure, EpisodeSpec, ResolvedTask

Job = tuple[Sequence[float], Sequence[Sequence[float]]]  # (policy params, start states): one candidate
EpisodesDone = Callable[[int], None]
"""``on_episodes(n)``: called as a chunk of ``n`` episodes finishes (the run's progress; from the calling thread)."""
Handle = TypeVar("Handle")  # what a backend waits on for one chunk: a future, a Ray object ref


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
    """One candidate's real episodes: per start state, in their order, its
    return and its transitions (obs, action, reward, next_obs, done)."""

    returns: list[float]
    episodes: list[dict[str, np.ndarray]] = field(default_factory=list)

    @property
    def mean_return(self) -> float:
        return float(np.mean(self.returns)) if self.returns else float("-inf")

    @property
    def env_steps(self) -> int:
        """Real env steps of these episodes."""
        return sum(len(ep["reward"]) for ep in self.episodes if "reward" in ep)


class EvaluationBackend(Protocol):
    """What the loop needs of an evaluator: `agents.evaluation.Evaluator` (a
    local process pool, the default) or ``agents.ray_evaluation.RayEvaluator``.
    ``on_episodes`` is passed only while the run reports its progress (an
    evaluator of one's own may leave it out then)."""

    task: ResolvedTask
    workers: int
    timeout_s: float

    def evaluate(
        self, params: Sequence[float], states: Sequence[Sequence[float]], *, on_episodes: Optional[EpisodesDone] = None
    ) -> Evaluation: ...

    def evaluate_many(
        self,
        jobs: Sequence[Job],
        *,
        per_job_env_errors: bool = False,
        on_episodes: Optional[EpisodesDone] = None,
        max_steps: Optional[int] = None,
    ) -> list[Union[Evaluation, EvaluationEnvError]]: ...

    def terminate(self) -> None: ...

    def close(self) -> None: ...


class SingleEvaluation:
    """``evaluate`` for a backend that has ``evaluate_many``."""

    def evaluate(
        self, params: Sequence[float], states: Sequence[Sequence[float]], *, on_episodes: Optional[EpisodesDone] = None
    ) -> Evaluation:
        """One real episode per start state for one candidate (``on_episodes``: see `EpisodesDone`)."""
        progress = {} if on_episodes is None else {"on_episodes": on_episodes}
        (result,) = self.evaluate_many([(params, states)], **progress)  # type: ignore[attr-defined]
        assert isinstance(result, Evaluation)  # an env error raised: per_job_env_errors is off
        return result


def capped(spec: EpisodeSpec, max_steps: Optional[int]) -> EpisodeSpec:
    """``spec`` with its episodes cut at ``max_steps`` (None: as it is). The loop's last episode of a step
    budget runs this way: the budget's last steps are spent, and an episode the cap cut is not judged
    (`agents.real_episodes`)."""
    if max_steps is None or max_steps >= spec.steps:
        return spec
    if max_steps < 1:
        raise ValueError(f"max_steps={max_steps}: expected >= 1 (an episode of at least one step) or None")
    return replace(spec, steps=max_steps)


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


@dataclass(frozen=True)
class Chunk:
    """Some of one job's start states, run by one worker as one task."""

    job: int  # the job's index in the call
    indices: list[int]  # which of the job's start states, in the order they run
    params: list[float]
    states: list[list[float]]


def split_jobs(jobs: Sequence[Job], workers: int) -> list[Chunk]:
    """Every job's start states dealt round-robin into at most ``workers``
    chunks (state i into chunk i mod ``workers``), job after job. Plain
    floats, so a chunk pickles small and the same way on every backend."""
    chunks = []
    for j, (params, states) in enumerate(jobs):
        plist = [float(v) for v in params]
        slist = [[float(v) for v in s] for s in states]
        for w in range(workers):
            idx = list(range(w, len(slist), workers))
            if idx:
                chunks.append(Chunk(j, idx, plist, [slist[i] for i in idx]))
    return chunks


def episodes_in(jobs: Sequence[Job]) -> int:
    return sum(len(states) for _, states in jobs)


def collect(
    submitted: Sequence[tuple[Chunk, Handle]],
    get: Callable[[Handle], dict[str, Any]],
    jobs: Sequence[Job],
    *,
    per_job_env_errors: bool,
    log: Any,
    on_episodes: Optional[EpisodesDone] = None,
) -> tuple[list[tuple[Chunk, dict[str, Any]]], dict[int, EvaluationEnvError]]:
    """Each chunk's result, in submission order, through ``get`` (which
    raises the backend's own failures), ``on_episodes`` told of each as it
    comes. A chunk whose env raised (`EnvFailure`) fails the whole call with
    `EvaluationEnvError`, or with ``per_job_env_errors`` only its job: the
    second value maps that job's index to its error, and the other chunks are
    still collected."""
    results = []
    env_errors: dict[int, EvaluationEnvError] = {}
    for chunk, handle in submitted:
        try:
            results.append((chunk, get(handle)))
            if on_episodes is not None:
                on_episodes(len(chunk.indices))
        except EnvFailure as exc:
            if not per_job_env_errors:
                n = episodes_in(jobs)
                log.warning("evolve.evaluation_env_error", episodes=n, error=str(exc))
                raise EvaluationEnvError(f"real evaluation of {n} episodes failed: {exc}") from None
            n = len(jobs[chunk.job][1])
            # the caller charges the job and warns of it (`evolve.candidate_failed`): one warning per failure
            log.info("evolve.evaluation_env_error", episodes=n, error=str(exc))
            env_errors.setdefault(chunk.job, EvaluationEnvError(f"real evaluation of {n} episodes failed: {exc}"))
            if on_episodes is not None:
                on_episodes(len(chunk.indices))
    return results, env_errors


def assemble(
    jobs: Sequence[Job], results: Sequence[tuple[Chunk, dict[str, Any]]], env_errors: dict[int, EvaluationEnvError]
) -> list[Union[Evaluation, EvaluationEnvError]]:
    """One entry per job, in the jobs' order: its `Evaluation` with returns
    and episodes in the order of its start states, or its env error."""
    out: list[Union[Evaluation, EvaluationEnvError]] = []
    for j, (_, states) in enumerate(jobs):
        if j in env_errors:
            out.append(env_errors[j])
            continue
        returns: list[float] = [0.0] * len(states)
        episodes: list[dict[str, np.ndarray]] = [{} for _ in states]
        for chunk, res in results:
            if chunk.job == j:
                for k, i in enumerate(chunk.indices):
                    returns[i] = res["returns"][k]
                    episodes[i] = res["episodes"][k]
        out.append(Evaluation(returns=returns, episodes=episodes))
    return out


def timed_out(log: Any, jobs: Sequence[Job], timeout_s: float) -> EvaluationTimeout:
    """The error (and its event) for a call whose chunks did not all finish in time."""
    n = episodes_in(jobs)
    log.warning("evolve.evaluation_timeout", timeout_s=timeout_s, episodes=n)
    return EvaluationTimeout(f"real evaluation of {n} episodes did not finish within {timeout_s:g} s")


def over_memory(log: Any, jobs: Sequence[Job], memory_limit_mb: Optional[int]) -> EvaluationMemoryError:
    """The error (and its event) for a chunk that hit its worker's memory limit."""
    n = episodes_in(jobs)
    log.warning("evolve.evaluation_memory_limit", memory_limit_mb=memory_limit_mb, episodes=n)
    return EvaluationMemoryError(
        f"real evaluation of {n} episodes went over the worker memory limit ({memory_limit_mb} MiB)"
    )


def worker_lost(log: Any, jobs: Sequence[Job], retries: int, why: str, how: str) -> EvaluationWorkerLost:
    """The error (and its event) for a call that lost a worker; ``how`` says
    how it was lost on this backend."""
    n = episodes_in(jobs)
    log.warning("evolve.evaluation_worker_lost", episodes=n, retries=retries, error=why)
    return EvaluationWorkerLost(f"real evaluation of {n} episodes {how}: {why}")

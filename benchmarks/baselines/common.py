"""What every model-free baseline shares: its options, the clocks, the
start states a target is judged on, the steps-to-target bookkeeping and the
report, in the shape of the evolution loop's report where the two meet.

Steps to target, for a baseline: after every ``check_every`` real episodes
(at the end of a CMA-ES generation, an ARS iteration, a SAC episode; left
``None``: every generation or iteration, every 5 episodes for SAC) the
current solution (the CMA-ES mean, ARS's theta, SAC's deterministic policy)
is evaluated OFF the budget on the task's validation start states, or on its
training start states where the task has no validation set. The first check
whose mean return meets the target gives ``episodes_to_target`` and
``env_steps_to_target``: the real episodes and env steps spent when it ran.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import platform
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from agents.tasks import ResolvedTask, StartStates, Task, get_task


@dataclass(frozen=True)
class BaselineConfig:
    """Options every baseline takes; a bad value raises ValueError naming it."""

    env_id: str = "Pendulum-v1"
    """A registered task name or any gymnasium id, as `genesis-fp16 evolve --env`."""
    seed: int = 0
    """Seeds the start states (the loop's for the same seed), the search and the env."""
    budget: int = 200
    """Real episodes the run may spend."""
    budget_steps: Optional[int] = None
    """Real env steps the run may spend as well; None: episodes only. No episode starts once it is spent; episodes
    that run side by side (one batch of workers) may together pass it by less than one batch."""
    target: Optional[float] = None
    """None: the task's, else the env spec's reward_threshold."""
    policy: Optional[str] = None
    """`linear` or `mlp:H` for CMA-ES (None: the task's); ARS and SAC have their own policies."""
    episode_steps: Optional[int] = None
    """None: the task's, else the env spec's max_episode_steps."""
    check_every: Optional[int] = None
    """Real episodes between off-budget target checks (see the module doc); None: the method's default."""
    stop_at_target: bool = False
    """Stop at the first check that meets the target (as the loop stops); False: spend the whole budget."""
    workers: int = 2
    """Processes running real episodes (CMA-ES only; ARS and SAC run in this process)."""
    eval_timeout_s: float = 120.0
    """Seconds one batch of CMA-ES episodes may take."""
    eval_memory_mb: Optional[int] = 2048
    """Address space in MiB an evaluation worker may add; None: no limit."""

    def validate(self) -> None:
        problems = []
        if self.budget < 1:
            problems.append(f"budget={self.budget}: expected at least 1 real episode")
        if self.budget_steps is not None and self.budget_steps < 1:
            problems.append(f"budget_steps={self.budget_steps}: expected at least 1 env step, or None (episodes only)")
        if self.check_every is not None and self.check_every < 1:
            problems.append(
                f"check_every={self.check_every}: expected at least 1 real episode, or None (the method's default)"
            )
        if self.workers < 1:
            problems.append(f"workers={self.workers}: expected at least 1")
        if problems:
            raise ValueError("; ".join(problems))

    def resolve(self, task: Optional[Task] = None) -> ResolvedTask:
        """The task, checked, with target, policy and episode length filled in (TaskError, a ValueError, says what to
        fix)."""
        self.validate()
        return (task or get_task(self.env_id)).resolve(
            target=self.target, policy=self.policy, episode_steps=self.episode_steps
        )

    def spent(self, episodes: int, env_steps: int, next_episodes: int = 1) -> bool:
        """Whether ``next_episodes`` more episodes no longer fit the budget."""
        return episodes + next_episodes > self.budget or (
            self.budget_steps is not None and env_steps >= self.budget_steps
        )


def target_states(starts: StartStates) -> tuple[np.ndarray, str]:
    """The start states a target check runs on and their name: the task's
    validation set (as the loop confirms its target), else the training states."""
    if len(starts.validation):
        return np.asarray(starts.validation), "validation"
    return np.asarray(starts.train), "training"


class Clock:
    """Wall and CPU seconds since it was made. CPU: this process, plus the
    child processes (evaluation workers) that ended and were waited for since."""

    def __init__(self) -> None:
        self.wall0, self.cpu0, self.children0 = time.perf_counter(), time.process_time(), _children_cpu()

    @property
    def wall_s(self) -> float:
        return time.perf_counter() - self.wall0

    @property
    def cpu_s(self) -> float:
        return time.process_time() - self.cpu0 + _children_cpu() - self.children0


def _children_cpu() -> float:
    try:
        import resource
    except ImportError:  # not POSIX: this process only
        return 0.0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class TargetWatch:
    """When a baseline's current solution first met the target (module doc)."""

    target: float
    every: int
    episodes_to_target: Optional[int] = None
    env_steps_to_target: Optional[int] = None
    checks: list[dict[str, Any]] = field(default_factory=list)
    last_check: int = 0
    check_wall_s: float = 0.0  # wall time of the checks (off the budget, inside the run's wall_s)
    started: Optional[float] = None

    def due(self, episodes: int) -> bool:
        """Whether a check is due; the time until `record` counts as the check's."""
        if episodes - self.last_check >= self.every:
            self.started = time.perf_counter()
            return True
        return False

    def record(self, generation: int, episodes: int, env_steps: int, mean_return: float) -> bool:
        """Note one check; True when it is the first to meet the target."""
        self.last_check = episodes
        if self.started is not None:
            self.check_wall_s += time.perf_counter() - self.started
            self.started = None
        self.checks.append(
            {
                "generation": generation,
                "real_episodes": episodes,
                "env_steps": env_steps,
                "best_return": mean_return,
                "best_full": True,  # the names the loop's records and the plots use
            }
        )
        if self.episodes_to_target is None and mean_return >= self.target:
            self.episodes_to_target, self.env_steps_to_target = episodes, env_steps
            return True
        return False

    @property
    def reached(self) -> bool:
        return self.episodes_to_target is not None


def baseline_report(
    method: str,
    cfg: BaselineConfig,
    task: ResolvedTask,
    starts: StartStates,
    *,
    watch: TargetWatch,
    checked_on: str,
    real_episodes: int,
    env_steps: int,
    train_return: Optional[float],
    heldout_return: Optional[float],
    clock: Clock,
    settings: dict[str, Any],
    failures: Optional[list[dict[str, Any]]] = None,
    stop_reason: Optional[str] = None,
) -> dict[str, Any]:
    """A baseline's report: the loop's keys where they mean the same
    (``mode`` is the method, for evolution_table.py), plus ``method``,
    ``env_steps_to_target``, ``target_checked_on``, ``cpu_s``, the off-budget
    checks' episodes and wall time (``check_episodes``, ``check_wall_s``, both
    inside ``wall_s``), and the method's own ``settings``."""
    reason = stop_reason or ("target" if watch.reached and cfg.stop_at_target else "budget")
    n_check = len(target_states(starts)[0])
    report = {
        "mode": method,
        "method": method,
        "env": task.env_id,
        "seed": cfg.seed,
        "budget": cfg.budget,
        "budget_steps": cfg.budget_steps,
        "target": task.target,
        "real_episodes": real_episodes,
        "env_steps": env_steps,
        "episodes_to_target": watch.episodes_to_target,
        "env_steps_to_target": watch.env_steps_to_target,
        "target_reached": watch.reached,
        "target_checked_on": f"{checked_on} start states ({n_check}), off the budget, every {watch.every} real "
        "episode(s) at most",
        "train_return": _finite(train_return),
        "heldout_return": _finite(heldout_return),
        "heldout_episodes": len(starts.heldout),
        "train_start_states": len(starts.train),
        "precision": "none",
        "wall_s": clock.wall_s,
        "cpu_s": clock.cpu_s,
        "check_wall_s": watch.check_wall_s,
        "check_episodes": len(watch.checks) * n_check,
        "stop_reason": reason,
        "generations": watch.checks,
        "failed_candidates": failures or [],
        "settings": settings,
        "config": dataclasses.asdict(cfg),
    }
    report["stop_detail"] = stop_detail(report)
    return report


def stop_detail(report: dict[str, Any]) -> str:
    if report["stop_reason"] == "failed":
        return (
            f"every real episode failed ({len(report['failed_candidates'])} failures); the first: "
            f"{report['failed_candidates'][0]['error']}"
        )
    reached = (
        (
            f"target {report['target']:g} first met after {report['episodes_to_target']} real episodes "
            f"({report['env_steps_to_target']} env steps)"
        )
        if report["target_reached"]
        else f"target {report['target']:g} not met"
    )
    if report["stop_reason"] == "target":
        return f"stopped at the target: {reached}"
    steps = f" / {report['budget_steps']} env steps" if report["budget_steps"] is not None else ""
    return (
        f"budget spent ({report['real_episodes']} of {report['budget']} real episodes{steps}, {report['env_steps']} "
        f"env steps); {reached}"
    )


def _finite(value: Optional[float]) -> Optional[float]:
    return float(value) if value is not None and math.isfinite(value) else None


def host() -> dict[str, Any]:
    """Where a measurement ran: CPU model and the flags that decide precision speed, cores, torch, python, date."""
    from genesis_fp16.precision.capability import cpu_flags, cpu_name

    name = cpu_name()
    import torch

    flags = sorted(
        f for f in cpu_flags() if f in ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile", "f16c")
    )
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": name,
        "flags": flags,
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }

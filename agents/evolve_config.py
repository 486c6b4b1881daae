"""The evolution loop's options, its candidates, and the config a resumed run keeps."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Optional

import numpy as np

from genesis_fp16.precision import parse_mode
from genesis_fp16.settings import PrecisionMode

from .evaluation import BACKENDS
from .runs import RunError
from .tasks import ResolvedTask, Task, TaskError, get_task

# what needs the optional packages, in a missing extra's error
EVOLVE = "genesis-fp16 evolve"


@dataclass
class EvolveConfig:
    """Options of the evolution loop (the CLI's flags map onto these)."""

    env_id: str = "Pendulum-v1"  # a task name (genesis-fp16 evolve --list-tasks) or any gymnasium id
    budget: int = 200  # real episodes, the only currency that counts
    seed: int = 0
    precision: Optional[str] = None  # None: settings and the agent's profile decide
    use_world_model: bool = True
    target: Optional[float] = None  # None: the task's, else the env spec's reward_threshold
    init_candidates: int = 8  # generation 0: random policies, one real episode each
    eval_top_k: int = 1  # candidates per generation that get real evaluations
    extra_imagined_starts: int = 16  # random start states only the model sees (regularises the search)
    horizon: Optional[int] = None  # imagined steps; None: the episode length
    wm_steps: int = 800  # optimizer steps per generation
    popsize: int = 16  # CMA-ES population inside the model
    refine_iters: int = 30
    refine_sigma: float = 0.3
    revision_iters: int = 40
    revision_sigma: float = 1.0
    revision_samples: int = 64
    recombinations: int = 3
    workers: int = 2
    backend: str = "process"  # where real episodes run: process (a local pool) or ray (the connected Ray cluster)
    eval_timeout_s: float = 120.0
    eval_memory_mb: Optional[int] = 2048  # address space an evaluation worker may add; None: no limit
    agent: str = "se_darwin"
    wm_agent: str = "world_model"
    policy: Optional[str] = None  # linear or mlp:H; None: the task's
    episode_steps: Optional[int] = None  # None: the task's, else the env spec's max_episode_steps

    def resolve(self, task: Optional[Task] = None) -> tuple["EvolveConfig", ResolvedTask]:
        """The task (``task``, else the one ``env_id`` names), checked, and this
        config with its target, policy, episode length and horizon filled in
        from it. Raises ValueError (TaskError) saying what to fix."""
        self.validate()
        resolved = (task or get_task(self.env_id)).resolve(target=self.target, policy=self.policy, episode_steps=self.episode_steps)
        cfg = replace(
            self, env_id=resolved.env_id, target=resolved.target, policy=resolved.policy.name, episode_steps=resolved.episode_steps,
            horizon=self.horizon or resolved.episode_steps,
        )
        n_train = len(resolved.start_states(cfg.seed).train)
        if cfg.budget < n_train:
            raise TaskError(f"budget={cfg.budget}: expected at least {n_train} real episodes (one full evaluation on {cfg.env_id}'s training start states)")
        return cfg, resolved

    def validate(self) -> None:
        problems = []
        if self.budget < 1:
            problems.append(f"budget={self.budget}: expected at least one real episode")
        if self.init_candidates > self.budget:
            problems.append(
                f"init_candidates={self.init_candidates}: generation 0 spends one real episode per initial candidate; "
                f"expected at most the budget ({self.budget})"
            )
        if self.precision is not None:
            try:
                parse_mode(self.precision)
            except ValueError:
                problems.append(f"precision={self.precision!r}: expected one of {', '.join(m.value for m in PrecisionMode)}")
        if self.backend not in BACKENDS:
            problems.append(f"backend={self.backend!r}: expected one of {', '.join(BACKENDS)}")
        counts = {"init_candidates": self.init_candidates, "eval_top_k": self.eval_top_k, "popsize": self.popsize,
                  "workers": self.workers, "horizon": self.horizon, "episode_steps": self.episode_steps}
        problems += [f"{name}={value}: expected >= 1" for name, value in counts.items() if value is not None and value < 1]
        if problems:
            raise ValueError("invalid evolve options: " + "; ".join(problems))


@dataclass
class Candidate:
    id: str
    params: np.ndarray
    operator: str
    generation: int
    imagined: Optional[float] = None
    real_return: Optional[float] = None  # mean over the training start states
    real_episodes: int = 0
    full: bool = False  # evaluated on every training start state

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "params": [float(v) for v in self.params]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Candidate":
        return cls(**{**data, "params": np.asarray(data["params"], dtype=float)})


CONFIG_FIELDS = {f.name for f in fields(EvolveConfig)}


def resumed_config(
    manifest: dict[str, Any], *, budget: Optional[int], workers: Optional[int], options: dict[str, Any], backend: Optional[str] = None
) -> EvolveConfig:
    """The run's own config, with the budget, workers and backend the caller may change."""
    run_id, saved = manifest["run_id"], dict(manifest["config"])
    unknown = sorted(set(saved) - CONFIG_FIELDS)
    if unknown:
        raise RunError(f"run {run_id!r}: its manifest has options this version does not know ({', '.join(unknown)}); resume it with the version that started it")
    mismatched = [f"{k}={v!r} (the run has {saved.get(k)!r})" for k, v in options.items() if saved.get(k) != v]
    if mismatched:
        raise RunError(
            f"run {run_id!r} was started with other options: {'; '.join(mismatched)}. A resumed run keeps its own options "
            "(only --budget, --workers and --backend may change); resume it without these, or start a new run"
        )
    if budget is not None:
        spent = int(manifest["real_episodes"])
        if budget < spent:
            raise RunError(f"budget={budget}: run {run_id!r} has already spent {spent} real episodes; expected a budget of at least {spent}")
        saved["budget"] = budget
    if workers is not None:
        saved["workers"] = workers
    if backend is not None:
        saved["backend"] = backend
    return EvolveConfig(**saved)

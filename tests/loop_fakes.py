"""Stand-ins for the evolution loop's two expensive parts, so loop tests run
in milliseconds and their numbers are known: an evaluator whose return is a
closed form of the parameters and the start state, and a world model with
what the loop calls (`train`, `trained`, `save`/`load`, `precision`,
`decision`, `agent`). A run with the fake world model and a critic needs
``model_rollouts=0`` (the branched rollouts need a real model)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional

import numpy as np
from agents.evaluation import Evaluation, EvaluationEnvError
from agents.tasks import ResolvedTask
from infrastructure.world_model import TrainReport

RUN_SPECIFIC = ("run_id", "run_manifest", "policy_file", "replay_db", "wall_s", "time_share")
"""A report's keys that name the run or time it (names, paths, times): what two runs of one seed may differ in."""
RUN_SPECIFIC_GENERATION = ("elapsed_s", "wm_wall_s", "critic_wall_s", "time")
"""A generation record's keys that time it."""
RESUMED = ("resumed", "resumed_from", "generations")
"""What a resumed run's report says of its resume (its generations are compared one by one, without their times)."""

STEPS = 5  # transitions per fake episode (what the replay buffer stores)


def distance_return(params: np.ndarray, state: np.ndarray) -> float:
    """-100 per unit of distance from the origin, minus 10 |theta|: the start state matters, the policy more."""
    return -100.0 * float(np.linalg.norm(np.asarray(params, dtype=float))) - 10.0 * abs(float(state[0]))


class FakeEvaluator:
    """``evaluate``/``evaluate_many`` like `agents.evaluation.Evaluator`: one
    episode per start state whose return is ``score(params, state)`` and whose
    transitions are small deterministic arrays (``STEPS`` long). ``calls``
    records the number of start states of each call; ``fail_on(params, states)``
    may return an error to raise."""

    def __init__(
        self,
        task: ResolvedTask,
        score: Callable[[np.ndarray, np.ndarray], float] = distance_return,
        fail_on: Optional[Callable[[np.ndarray, np.ndarray], Optional[Exception]]] = None,
    ) -> None:
        self.task, self.workers, self.timeout_s = task, 1, 60.0
        self.score, self.fail_on = score, fail_on
        self.calls: list[int] = []

    def _episode(self, params: np.ndarray, state: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
        ret = self.score(params, state)
        obs_dim, act_dim = self.task.policy.obs_dim, self.task.policy.act_dim
        base = np.cos(np.arange(STEPS * obs_dim, dtype=np.float32).reshape(STEPS, obs_dim) + float(state[0]))
        return ret, {
            "obs": base,
            "next_obs": base + 0.1,
            "action": np.full((STEPS, act_dim), 0.5, np.float32),
            "reward": np.full(STEPS, ret / STEPS, np.float32),
            "done": np.zeros(STEPS, np.float32),
        }

    def evaluate(self, params, states, *, max_steps: Optional[int] = None, **kw) -> Evaluation:
        """``max_steps``: each episode ends there (its return is the steps' rewards), as a worker's cap ends it."""
        params, states = np.asarray(params, dtype=float), np.asarray(states, dtype=float)
        self.calls.append(len(states))
        if self.fail_on is not None and (error := self.fail_on(params, states)) is not None:
            raise error
        returns, episodes = zip(*(self._episode(params, s) for s in states))
        if max_steps is not None and max_steps < STEPS:
            episodes = tuple({k: v[:max_steps] for k, v in e.items()} for e in episodes)
            returns = tuple(float(e["reward"].sum()) for e in episodes)
        return Evaluation(returns=list(returns), episodes=list(episodes))

    def evaluate_many(self, jobs, *, per_job_env_errors: bool = False, max_steps: Optional[int] = None, **kw):
        out = []
        for params, states in jobs:
            try:
                out.append(self.evaluate(params, states, max_steps=max_steps))
            except EvaluationEnvError as exc:
                if not per_job_env_errors:
                    raise
                out.append(exc)
        return out

    def terminate(self) -> None:
        pass

    def close(self) -> None:
        pass


class FakeWorldModel:
    """Counts its `train` calls (each returns a fixed report) and writes a
    small JSON for `save`, so the loop's bookkeeping can be checked without
    a model."""

    precision = "fp32"
    agent = "world_model.fake"
    decision = None

    def __init__(self) -> None:
        self.trained = False
        self.train_calls = 0
        self.steps: list[int] = []

    async def train(self, steps: int) -> TrainReport:
        self.trained = True
        self.train_calls += 1
        self.steps.append(steps)
        return TrainReport(
            train_loss=0.1,
            val_loss=0.2,
            precision="fp32",
            steps=steps,
            skipped_steps=0,
            wall_s=0.0,
            transitions=0,
            trajectories=0,
        )

    def save(self, path: Optional[Path] = None) -> Path:
        path = Path(path) if path is not None else Path("/dev/null")
        if path != Path("/dev/null"):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"trained": self.trained, "train_calls": self.train_calls}))
        return path

    def load(self, path: Optional[Path] = None) -> Path:
        if path is not None and Path(path).exists():
            data = json.loads(Path(path).read_text())
            self.trained, self.train_calls = bool(data["trained"]), int(data["train_calls"])
        else:
            self.trained = True
        return Path(path) if path is not None else Path("/dev/null")

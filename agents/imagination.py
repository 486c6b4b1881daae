"""The objective the operators search on: a policy's pessimistic imagined
return, and the full imagination of the candidates that get real episodes
(how the model's predictions are audited, `agents.imagination_stats`).

Imagination is the world model's ``imagine_uncertain``: particles through
sampled ensemble members, each candidate scored by the particles' mean
return minus ``kappa`` times their spread. Torch and the model load only
when a run imagines."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np

from .imagination_stats import candidate_record, summary
from .time_share import TimeShare

if TYPE_CHECKING:
    from infrastructure.imagination import Imagination
    from infrastructure.world_model import WorldModel

    from .evolve_config import Candidate
    from .tasks import ImaginedStarts, ResolvedTask

ImagineFn = Callable[[np.ndarray], np.ndarray]  # (P, D) params -> (P,) score to maximise
DIVERGED = -1e30  # the score of a candidate whose imagined rollout diverged: it ranks last


class Imaginer:
    """Imagination for one generation: ``score(params)`` is the pessimistic
    score over the generation's start observations (what the search
    maximises); ``imagine(params, start_obs)`` the full `Imagination` on any
    start observations. ``params`` are raw policy parameters (P, D). Rollouts
    use the task's projection (else a clamp into the observation box, and
    into the model's data region where the box is unbounded) and stop at its
    termination function (else the model's own estimate); a horizon shorter
    than the episode is extended to ``task.episode_steps`` by the model.
    The seconds spent go to ``time``'s ``imagine`` bucket."""

    def __init__(
        self, world_model: "WorldModel", task: "ResolvedTask", start_obs: np.ndarray, *, horizon: int, kappa: float,
        particles: Optional[int], seed: int, time: TimeShare,
    ) -> None:
        from .tasks.torch_policy import BatchedPolicy, clamp_projection

        self.world_model, self.task, self.start_obs = world_model, task, start_obs
        self.horizon, self.kappa, self.particles, self.seed, self.time = horizon, kappa, particles, seed, time
        self.policy = BatchedPolicy(task.policy)
        self.project = task.task.project or clamp_projection(task.obs_low, task.obs_high, data=world_model.observed_region())

    def imagine(self, params: np.ndarray, start_obs: np.ndarray) -> "Imagination":
        with self.time.measure("imagine"):
            return self.world_model.imagine_uncertain(
                self.policy, np.asarray(params, dtype=np.float64), np.asarray(start_obs, dtype=np.float32), self.horizon,
                particles=self.particles, kappa=self.kappa, project=self.project, terminated=self.task.task.termination,
                episode_steps=self.task.episode_steps, seed=self.seed,
            )

    def score(self, params: np.ndarray) -> np.ndarray:
        """(P,) pessimistic imagined scores over the generation's start observations."""
        scores = np.asarray(self.imagine(params, self.start_obs).score, dtype=np.float64)
        return np.where(np.isfinite(scores), scores, DIVERGED)


def make_imagine(
    world_model: "WorldModel", task: "ResolvedTask", starts: "ImaginedStarts", *, generation: int, horizon: int, kappa: float = 1.0,
    particles: Optional[int] = None, seed: int = 0, time: Optional[TimeShare] = None,
) -> Imaginer:
    """The generation's `Imaginer`: its start observations are
    ``starts.for_generation(generation)`` (training start states first, then
    states only the model sees), and its particles are drawn from a seed of
    ``seed`` and ``generation``, the same for every call of the generation
    (common random numbers: candidates differ by their parameters only)."""
    return Imaginer(
        world_model, task, starts.for_generation(generation), horizon=horizon, kappa=kappa, particles=particles,
        seed=seed * 10_000 + generation, time=time if time is not None else TimeShare(),
    )


def audit(imaginer: Imaginer, starts: "ImaginedStarts", evaluated: Sequence["Candidate"], *, every: bool = False) -> dict[str, Any]:
    """A generation's imagined-vs-real comparison (`agents.imagination_stats`):
    each candidate the search scored (``every``: each candidate, a probe
    round's), imagined again on exactly the training start states it was run
    on (one batched call per set of start states: a probe round's share one),
    with the generation's ``records`` in the order of ``evaluated``."""
    cands = [c for c in evaluated if c.imagined is not None or every]
    groups: dict[tuple[int, ...], list[int]] = {}
    for k, cand in enumerate(cands):
        groups.setdefault(tuple(cand.starts), []).append(k)
    records: list[dict[str, Any]] = [{} for _ in cands]
    for states, members in groups.items():
        im = imaginer.imagine(np.stack([cands[k].params for k in members]), starts.train_observations(list(states)))
        for j, k in enumerate(members):
            records[k] = candidate_record(
                cands[k].id, imagined_mean=float(im.mean[j]), low=float(im.low[j]), high=float(im.high[j]),
                real_mean=float(np.mean(cands[k].returns)), truncated=float(im.truncated[j]), states=len(states),
            )
    return {**summary(records), "records": records}

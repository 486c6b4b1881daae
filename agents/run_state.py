"""Everything an evolution run has done, in one typed object: what the next
generation starts from and what a resume reads back. `RunState` is the only
place these live; the agent, the learners and the real episodes hold it (or
its `Spent` part), never copies of its fields.

Its on-disk form is the run manifest's progress fields (`RunState.as_manifest`,
`RunState.from_manifest`; ``agents.runs`` reads and checks the file,
``agents.run_record`` writes it). A resume builds the state once from the
manifest and the agent is constructed with it: nothing is built fresh and then
overwritten. What is not state stays out: the config (the manifest's
``config``, `agents.evolve_config.resumed_config`), the learners' weights
(files the state names, `snapshots`) and the replay data (the replay buffer).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from .cma_search import CMASearch
from .evolve_config import EVOLVE, Candidate, EvolveConfig
from .manifest_fields import Manifest, RunError
from .search_space import ObsStats
from .time_share import TimeShare

if TYPE_CHECKING:
    from .tasks import ResolvedTask

SNAPSHOT_KEYS = ("world_model_checkpoint", "critic_checkpoint")
"""The manifest keys naming each learner's snapshot file (in the run's world-model folder)."""


class StopReason(str, Enum):
    """Why a run stopped: the target met and confirmed, a budget, or every real evaluation failed."""

    TARGET = "target"
    BUDGET = "budget"
    FAILED = "failed"


@dataclass
class Spent:
    """What the run's real episodes cost, every session together: episodes
    charged, env steps of the episodes that finished, the candidates charged
    and skipped (and why), and every confirmation tried. `agents.real_episodes`
    charges it; the budgets are checked against it."""

    real_episodes: int = 0
    env_steps: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)
    confirmations: list[dict[str, Any]] = field(default_factory=list)


LOOP_FIELDS = ("generation", "candidates_run", "reached_at", "answer", "budget_exhausted", "unconfirmed", "stop")
"""The fields of the manifest's ``state`` object (the loop's own counters and outcome)."""


@dataclass
class RunState:
    """``search``: CMA-ES (its record replays it); ``obs_stats``: the
    statistics of the search's coordinates; ``generation``: the last committed
    one (-1: none); ``candidates_run``: candidates given their one episode so
    far (candidate c runs on training start state ``order[c mod n]``);
    ``pool``: every candidate run, a failed one scored -inf; ``generations``:
    the committed generations' records; ``actor``: the policy (raw parameters)
    the refinement improved last, injected first into the next population;
    ``spent``: the budgets spent; ``time``: where the wall time went;
    ``snapshots``: each learner's snapshot file as of ``generation``
    (`SNAPSHOT_KEYS`); ``decisions``: each learner's precision decision
    (`PrecisionDecision.as_dict`), so a resume trains on it instead of
    measuring again; ``reached_at``: real episodes spent when the target was
    met and confirmed, ``answer`` that candidate's id; ``budget_exhausted``:
    ``episodes`` or ``env_steps``, the budget that stops the run;
    ``unconfirmed``: a candidate that met the target with no budget left to
    confirm it; ``stop``: why the run stopped (None while it runs)."""

    search: CMASearch
    obs_stats: ObsStats
    generation: int = -1
    candidates_run: int = 0
    pool: list[Candidate] = field(default_factory=list)
    generations: list[dict[str, Any]] = field(default_factory=list)
    actor: Optional[np.ndarray] = None
    spent: Spent = field(default_factory=Spent)
    time: TimeShare = field(default_factory=TimeShare)
    snapshots: dict[str, Optional[str]] = field(default_factory=lambda: dict.fromkeys(SNAPSHOT_KEYS))
    decisions: dict[str, dict[str, Any]] = field(default_factory=dict)
    reached_at: Optional[int] = None
    answer: Optional[str] = None
    budget_exhausted: Optional[str] = None
    unconfirmed: Optional[str] = None
    stop: Optional[StopReason] = None

    @classmethod
    def new(cls, config: EvolveConfig, task: ResolvedTask) -> "RunState":
        """A run that has done nothing yet: CMA-ES at the origin of the search's coordinates, no statistics."""
        search = CMASearch(
            np.zeros(task.n_params),
            config.sigma0,
            seed=config.seed,
            popsize=config.population(task.n_params),
            purpose=EVOLVE,
        )
        return cls(search=search, obs_stats=ObsStats(task.policy.obs_dim))

    def has_data(self) -> bool:
        """Whether any real evaluation succeeded (the replay buffer then has a trajectory)."""
        return any(c.real_return is not None and np.isfinite(c.real_return) for c in self.pool)

    # -- the manifest -----------------------------------------------------------------------
    def as_manifest(
        self,
        *,
        generation: Optional[int] = None,
        generations: Optional[list[dict[str, Any]]] = None,
        snapshots: Optional[dict[str, Optional[str]]] = None,
    ) -> dict[str, Any]:
        """The manifest's progress fields, as of the last committed generation,
        or of ``generation`` with its ``generations`` records and ``snapshots``
        (about to be committed: they join the state once the manifest holding
        them is written). A deep copy: the manifest on disk and in memory never
        shares a list a later generation grows (`CMASearch.record` hands out its
        growing ``told``; shared, a generation cut off after CMA-ES was told
        would reach the manifest written when the session ends, and a resume
        would replay a generation it then runs again)."""
        loop = {
            "generation": self.generation if generation is None else generation,
            "candidates_run": self.candidates_run,
            "reached_at": self.reached_at,
            "answer": self.answer,
            "budget_exhausted": self.budget_exhausted,
            "unconfirmed": self.unconfirmed,
            "stop": None if self.stop is None else self.stop.value,
        }
        spent = self.spent
        return copy.deepcopy(
            {
                "generation": loop["generation"],
                "state": loop,
                "real_episodes": spent.real_episodes,
                "env_steps": spent.env_steps,
                "failures": spent.failures,
                "confirmations": spent.confirmations,
                "pool": [c.as_dict() for c in self.pool],
                "generations": list(self.generations if generations is None else generations),
                "obs_stats": self.obs_stats.as_dict(),
                "search": self.search.record(),
                "actor": None if self.actor is None else [float(v) for v in self.actor],
                "time": self.time.snapshot(),
                "decisions": self.decisions,
                **(self.snapshots if snapshots is None else snapshots),
            }
        )

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any], task: ResolvedTask) -> "RunState":
        """The state `as_manifest` wrote, for ``task`` (what only the task can
        say, the sizes, is checked here; `agents.runs.read_manifest` checked
        each field's type). CMA-ES is rebuilt by replaying its record. Raises
        `RunError` naming the manifest when it cannot be continued."""
        where = (
            manifest.path if isinstance(manifest, Manifest) else None
        ) or f"run {manifest.get('run_id')!r}'s manifest"
        try:
            loop = dict(manifest["state"])
            unknown = sorted(set(loop) - set(LOOP_FIELDS))
            if unknown:
                raise ValueError(f"run state with unknown fields {unknown}")
            stop = loop.pop("stop", None)
            decisions = manifest.get("decisions") or {}
            if not isinstance(decisions, dict):
                raise ValueError("its field 'decisions' is not an object")
            actor = manifest.get("actor")
            return cls(
                search=CMASearch.replay(manifest["search"], purpose=EVOLVE),
                obs_stats=ObsStats.from_dict(task.policy.obs_dim, manifest["obs_stats"]),
                pool=[Candidate.from_dict(c) for c in manifest["pool"]],
                generations=list(manifest["generations"]),
                actor=None if actor is None else np.asarray(actor, dtype=np.float64),
                spent=Spent(
                    int(manifest["real_episodes"]),
                    int(manifest.get("env_steps") or 0),
                    list(manifest.get("failures") or []),
                    list(manifest.get("confirmations") or []),
                ),
                time=TimeShare(manifest["time"]),
                snapshots={key: manifest.get(key) for key in SNAPSHOT_KEYS},
                decisions=dict(decisions),
                stop=None if stop is None else StopReason(stop),
                **loop,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RunError(f"{where}: {exc}; the run cannot be resumed") from None

"""Probe search: what the loop does with its real episodes while the world
model has not shown that it can rank candidates.

A model that cannot order the policies it is asked about (Swimmer-v5: the
imagined-vs-real rank correlation of the candidates the loop evaluated was
-0.29 over five seeds, docs/EVOLUTION.md) only spends the budget on its own
errors: every full evaluation it asks for costs up to 16 real episodes. So
the model has to earn its say (`trust`): its proposals get real episodes only
while the Spearman correlation of imagined against real returns over the
last ``window`` audited candidates is at least ``threshold``. Until then, and
whenever it falls below, a generation is a *probe generation*, searched the
way the strongest model-free yardstick searches (`benchmarks.baselines.cma_tuned`):

* CMA-ES (pycma) in the search's normalised z-coordinates, started at the
  incumbent, proposes its population; the population and the search's
  current mean run ONE real episode each (a *probe*), all on the same
  training start state (the next of the run's race order each round), so
  their returns differ by the policy alone;
* CMA-ES is told the population's returns (rank-based: the incumbent's return
  on that start state, subtracted, changes nothing);
* the mean (CMA-ES's weighted recombination of the best probes so far,
  operator ``probe_mean``) is raced against the incumbent when
  `ProbeSearch.race_due` says: only a full evaluation can become the
  incumbent or meet the target. Where a round and the race after it no
  longer fit the budget, the mean is raced alone (the search's final answer)
  and the model's proposals get what is left.

Every probe is audited (imagined on the round's start state against its real
return: a ranking of policies, not of start states), so the model can earn
trust back in the probe rounds. Probes are
real episodes: they are charged, reach the replay buffer and train the model.

Same seed, same search: pycma draws from a NumPy generator seeded per segment
(never from ``numpy.random``), and the manifest keeps what CMA-ES was told, so
a resumed run rebuilds the same state by replaying it (`ProbeSearch.from_dict`,
which checks that the replay asks for exactly the recorded probes).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

import numpy as np

from genesis_fp16.extras import require

from .evolve_config import EVOLVE
from .imagination_stats import spearman

RACE_EVERY = 3  # rounds between races of an improving mean (`ProbeSearch.race_due`)
TOLD_FAILED = 1e300  # what pycma (a minimiser) is told for a probe whose episode failed


def trust(generations: Sequence[dict[str, Any]], *, threshold: float, window: int) -> tuple[bool, Optional[float]]:
    """Whether the model's proposals get the next generation's real
    episodes, and the rank correlation that decided it: Spearman of imagined
    against real returns over the last ``window`` audited candidates of
    ``generations`` (the generation records, oldest first). No audit yet (or
    no spread to rank): not trusted."""
    records: list[dict[str, Any]] = []
    for record in reversed(generations):
        audit = record.get("imagination") or {}
        records = list(audit.get("records") or []) + records
        if len(records) >= window:
            break
    records = records[-window:]
    rho = spearman([r["imagined_mean"] for r in records], [r["real_mean"] for r in records])
    return (rho is not None and rho >= threshold), rho


class ProbeSearch:
    """CMA-ES over one-episode probes, in segments: a segment starts at a
    point (the incumbent) with step size ``sigma0`` and goes on while the
    generations are probe generations in a row; a model generation, or
    CMA-ES's own stop (its step size collapsed, its fitness flat), ends it."""

    def __init__(self, *, seed: int, sigma0: float, popsize: Optional[int]) -> None:
        self.seed, self.sigma0, self.popsize = seed, sigma0, popsize
        self.segments: list[dict[str, Any]] = []  # {"generation", "x0", "told": [{"generation", "z", "f"}]}
        self.rounds = 0  # probe generations run so far (each on the next start state of the race order)
        self.raced = 0  # the round whose mean was raced last (0: none yet)
        self._es: Any = None
        self._rng: Optional[np.random.Generator] = None
        self._asked: Optional[np.ndarray] = None
        self._picked: Optional[dict[str, Any]] = None  # the screen's pick of the asked population (`ask`)

    def _new_es(self, x0: np.ndarray, segment: int) -> None:
        cma = require("cma", EVOLVE)
        rng = self._rng = np.random.default_rng([self.seed, 23, segment])
        options: dict[str, Any] = {"seed": math.nan, "verbose": -9, "randn": lambda *shape: rng.standard_normal(shape)}
        if self.popsize is not None:
            options["popsize"] = self.popsize
        self._es = cma.CMAEvolutionStrategy(np.asarray(x0, dtype=np.float64), self.sigma0, options)

    def active(self) -> bool:
        """Whether a segment goes on: started, not ended, and CMA-ES has not stopped."""
        return self._es is not None and not self.segments[-1].get("ended") and not self._es.stop()

    def start(self, x0: np.ndarray, generation: int) -> None:
        """A new segment at ``x0`` (z-coordinates)."""
        self.segments.append({"generation": generation, "x0": [float(v) for v in x0], "told": []})
        self._new_es(x0, len(self.segments) - 1)

    def end(self) -> None:
        """End the current segment (asked, not told): the next probe generation starts a new one."""
        self.segments[-1]["ended"] = True
        self._es = self._asked = None

    def race_due(self, has_incumbent: bool, gain: float, *, meets: bool, last: bool) -> bool:
        """Whether the mean probed this round gets a raced full evaluation:
        without an incumbent (one is needed), and when no later round could
        race it (``last``: the search's final answer, as the tuned yardstick's
        is its mean; racing stops it early if it cannot win); otherwise when it
        beat the incumbent on the round's start state (``gain`` > 0) and either
        its episode met the target or `RACE_EVERY` rounds passed since the last
        race. A full evaluation costs up to a training set's worth of
        episodes: racing each small improvement would leave a third of the
        rounds to the search."""
        if not math.isfinite(gain):
            return False
        if not has_incumbent or last:
            return True
        return gain > 0 and (meets or self.rounds - self.raced >= RACE_EVERY)

    def size(self, n_params: int) -> int:
        """Probes per round for a policy of ``n_params``: ``popsize``, else pycma's default, 4 + 3 ln n."""
        return self.popsize if self.popsize is not None else 4 + int(3 * math.log(n_params))

    @property
    def population(self) -> int:
        return int(self._es.popsize)

    def ask(self, screen: Optional[Callable[[np.ndarray], np.ndarray]] = None, oversample: int = 1) -> np.ndarray:
        """The segment's next population, (popsize, n) in z-coordinates. With
        ``screen`` (z-points -> scores, higher better) and ``oversample`` k > 1,
        CMA-ES samples k populations and the population is the ``screen``'s
        best popsize of them (pre-selection, the model picking which samples
        get a real episode); the pick is recorded so that a replay asks alike."""
        if screen is None or oversample <= 1:
            self._asked, self._picked = self._draw(None), None
            return self._asked.copy()
        pool = self._draw({"oversample": oversample})
        scores = np.asarray(screen(pool), dtype=np.float64)
        best = np.argsort(-np.where(np.isfinite(scores), scores, -np.inf), kind="stable")[: self.population]
        self._picked = {"oversample": oversample, "picked": sorted(int(i) for i in best)}
        self._asked = pool[self._picked["picked"]]
        return self._asked.copy()

    def _draw(self, screened: Optional[dict[str, Any]]) -> np.ndarray:
        """CMA-ES's next samples: one population, or ``screened["oversample"]`` of them (a screen's pool);
        with ``screened["picked"]``, the picked rows of that pool (a replay)."""
        if screened is None:
            return np.asarray(self._es.ask(), dtype=np.float64)
        pool = np.asarray(self._es.ask(number=int(screened["oversample"]) * self.population), dtype=np.float64)
        return pool[[int(i) for i in screened["picked"]]] if "picked" in screened else pool

    def tell(self, generation: int, scores: Sequence[float]) -> None:
        """The asked population's scores (higher is better; -inf: the probe failed)."""
        assert self._asked is not None and len(scores) == len(self._asked)
        f = [-float(s) if math.isfinite(s) else TOLD_FAILED for s in scores]
        self._es.tell(list(self._asked), f)
        told: dict[str, Any] = {"generation": generation, "z": self._asked.tolist(), "f": f}
        if self._picked is not None:
            told["screened"] = self._picked
        self.segments[-1]["told"].append(told)
        self._asked = self._picked = None

    @property
    def mean(self) -> np.ndarray:
        return np.asarray(self._es.mean, dtype=np.float64).copy()

    @property
    def sigma(self) -> float:
        return float(self._es.sigma)

    def as_dict(self) -> dict[str, Any]:
        """JSON for the run manifest: the current segment is enough to go on (earlier ones are kept for the record)."""
        return {"segments": self.segments, "rounds": self.rounds, "raced": self.raced}

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, seed: int, sigma0: float, popsize: Optional[int]) -> "ProbeSearch":
        """The search as the manifest left it: the last segment's CMA-ES rebuilt
        by asking and telling again. Raises ValueError when the replay does not
        ask for the recorded probes (another pycma, or an edited manifest)."""
        search = cls(seed=seed, sigma0=sigma0, popsize=popsize)
        search.segments, search.rounds = list(data.get("segments") or []), int(data.get("rounds") or 0)
        search.raced = int(data.get("raced") or 0)
        if search.segments and not search.segments[-1].get("ended"):
            last = search.segments[-1]
            search._new_es(np.asarray(last["x0"], dtype=np.float64), len(search.segments) - 1)
            for told in last["told"]:
                asked = search._draw(told.get("screened"))
                recorded = np.asarray(told["z"], dtype=np.float64)
                if asked.shape != recorded.shape or not np.allclose(asked, recorded, rtol=0.0, atol=1e-9):
                    raise ValueError(f"the probe search of generation {told['generation']} does not replay to the probes it recorded")
                search._es.tell(list(recorded), list(told["f"]))
        return search

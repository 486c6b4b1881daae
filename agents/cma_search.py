"""The one CMA-ES driver of the code base: the evolution loop, the
``--baseline cma`` run and the measured yardsticks (``benchmarks/``) all
search policy parameters through `CMASearch`.

* pycma (Hansen's ``cma`` package) with its own defaults (population
  4 + 3 ln n, weighted recombination, active covariance update), minimising;
  this driver speaks in returns (higher is better) and turns a failed
  candidate (score -inf or NaN) into `TOLD_FAILED`.
* CMA-ES keeps its tuned population of its own samples. Outside proposals
  (the refined candidates, evaluated beside the population as CEM-RL's
  refined half is, Pourchot and Sigaud 2019) are extras. While extras have
  won lately (``trusted``: a return above the population's best in one of
  the last three generations, `agents.extras.won_lately`), one joins the
  update when its return ranks among the population's parents (the better
  half); a probe (none won lately) joins only when it beats the
  population's best sample. Measured on seeds 1-5 (issue 55,
  benchmark_results/loop55_2026-11-29): on Swimmer-v5, where the learners
  never win, probes that ranked among the parents without winning took
  CMA-ES off its samples' path (the loop at 0.79x its floor's median,
  0.93x joining only on a win); on InvertedDoublePendulum-v5, extras that
  win now and then steer CMA-ES well as parents in between (the loop's
  median 402.8 with this rule, 359.4 joining only on a win). A joined extra
  takes the place of the population's worst sample, as a direction from
  the mean no longer than the population's longest sample
  (in CMA-ES's own Mahalanobis metric: pycma's ``inject`` without ``force``
  likewise uses a proposal as a direction of a sample's length). Extras that
  lose leave the update exactly as it would have been without them, so the
  search never goes where its own samples would not have taken it.
* Same seed, same search: pycma's normal draws come from a NumPy generator
  of the stream ``cma_search`` of ``seed`` (`genesis_fp16.base.seeds`; never from
  ``numpy.random``), and the driver keeps what it asked, injected and told
  (`record`), so a resumed run rebuilds the same
  state by replaying it (`CMASearch.replay`, which checks that the replay asks
  for exactly the recorded points).
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import numpy as np

from genesis_fp16.base.extras import require
from genesis_fp16.base.seeds import numpy_rng

TOLD_FAILED = 1e300
"""What pycma (a minimiser) is told for a candidate whose episode failed."""
REPLAY_ATOL = 1e-9


def default_popsize(n_params: int) -> int:
    """pycma's default population for ``n_params`` parameters: 4 + floor(3 ln n)."""
    return 4 + int(3 * math.log(n_params))


class CMASearch:
    """CMA-ES from ``x0`` with step size ``sigma0``: `ask` a population
    (injected points first), `tell` its scores (higher is better)."""

    def __init__(
        self, x0: np.ndarray, sigma0: float, *, seed: int, popsize: Optional[int] = None, purpose: str = "CMA-ES"
    ) -> None:
        if not (math.isfinite(sigma0) and sigma0 > 0):
            raise ValueError(f"sigma0={sigma0}: expected a finite number > 0 (CMA-ES's initial step size)")
        if popsize is not None and popsize < 2:
            raise ValueError(f"popsize={popsize}: expected at least 2, or None (pycma's default, 4 + 3 ln n)")
        cma = require("cma", purpose)
        self.x0, self.sigma0, self.seed, self.requested_popsize = (
            np.asarray(x0, dtype=np.float64).copy(),
            float(sigma0),
            int(seed),
            popsize,
        )
        rng = numpy_rng(self.seed, "cma_search")
        options: dict[str, Any] = {"seed": math.nan, "verbose": -9, "randn": lambda *shape: rng.standard_normal(shape)}
        if popsize is not None:
            options["popsize"] = int(popsize)
        self._es = cma.CMAEvolutionStrategy(self.x0.copy(), self.sigma0, options)
        self._asked: Optional[np.ndarray] = None
        self.told: list[dict[str, Any]] = []
        """Per generation: ``{"x": the asked population, "f": what pycma was told, "extras": how many
        extras joined, "told_x": the rows pycma was told (with ``extras`` > 0: the joined extras in the
        worst samples' places)}``."""

    @property
    def popsize(self) -> int:
        return int(self._es.popsize)

    @property
    def mean(self) -> np.ndarray:
        return np.asarray(self._es.mean, dtype=np.float64).copy()

    @property
    def sigma(self) -> float:
        return float(self._es.sigma)

    @property
    def generations(self) -> int:
        return len(self.told)

    def stopped(self) -> dict[str, Any]:
        """pycma's own stop conditions that hold now (empty: go on)."""
        return dict(self._es.stop())

    def ask(self) -> np.ndarray:
        """The next population of CMA-ES's own samples, (popsize, n)."""
        if self._asked is not None:
            raise RuntimeError("CMASearch.ask: the last population was not told yet")
        self._asked = np.asarray(self._es.ask(), dtype=np.float64)
        return self._asked.copy()

    def tell(
        self, scores: Sequence[float], extras: Sequence[tuple[np.ndarray, float]] = (), *, trusted: bool = False
    ) -> list[int]:
        """The asked population's scores, in order (higher is better; -inf or
        NaN: the candidate failed), and the ``extras`` evaluated beside it
        (point, score). ``trusted``: extras have won lately, so one that ranks
        among the parents joins; else only one that beats the population's
        best. Returns the indices of the extras that joined the update (see
        the module's docstring)."""
        if self._asked is None or len(scores) != len(self._asked):
            raise ValueError(
                f"CMASearch.tell: {len(scores)} scores for {0 if self._asked is None else len(self._asked)} asked "
                "points"
            )
        f = [-float(s) if math.isfinite(s) else TOLD_FAILED for s in scores]
        x = self._asked.copy()
        mu = max(1, len(f) // 2)
        # the (minimised) score an extra must reach: the worst parent's once extras won lately, else below the best
        bar, strict = (sorted(f)[mu - 1], False) if trusted else (min(f), True)
        ranked = sorted(
            (i for i, (_, s) in enumerate(extras) if math.isfinite(s) and (-s < bar if strict else -s <= bar)),
            key=lambda i: -extras[i][1],
        )
        joined = ranked[: len(f) - mu]  # the population's parents stay its own samples' best or better
        if joined:
            mean = np.asarray(self._es.mean, dtype=np.float64)
            longest = max(float(self._es.mahalanobis_norm(row - mean)) for row in x)
            worst = sorted(range(len(f)), key=lambda i: -f[i])
            for slot, i in zip(worst, joined):
                dx = np.asarray(extras[i][0], dtype=np.float64) - mean
                norm = float(self._es.mahalanobis_norm(dx))
                x[slot] = mean + dx * (min(1.0, longest / norm) if norm > 0 else 1.0)
                f[slot] = -float(extras[i][1])
        self._es.tell(list(x), f)
        record: dict[str, Any] = {"x": self._asked.tolist(), "f": f, "extras": len(joined)}
        if joined:
            record["told_x"] = x.tolist()
        self.told.append(record)
        self._asked = None
        return joined

    # -- resume --------------------------------------------------------------------------
    def record(self) -> dict[str, Any]:
        """JSON for a run manifest: what `replay` needs."""
        return {
            "x0": [float(v) for v in self.x0],
            "sigma0": self.sigma0,
            "seed": self.seed,
            "popsize": self.requested_popsize,
            "told": self.told,
        }

    @classmethod
    def replay(cls, data: dict[str, Any], purpose: str = "CMA-ES") -> "CMASearch":
        """The search a `record` describes, rebuilt by asking and telling
        again: each generation asks (which must give the recorded population)
        and tells pycma the recorded rows and scores, as the live run did.
        Raises ValueError when the replay does not ask for the recorded points
        (another pycma, an edited manifest, or a record of an older loop that
        injected points into the population)."""
        search = cls(
            np.asarray(data["x0"], dtype=np.float64),
            float(data["sigma0"]),
            seed=int(data["seed"]),
            popsize=data.get("popsize"),
            purpose=purpose,
        )
        for generation, told in enumerate(data.get("told") or []):
            if told.get("injected"):
                raise ValueError(
                    f"the CMA-ES record of generation {generation} injected points into the population (an older "
                    "loop's "
                    "record); this version keeps refined candidates beside the population and cannot replay it"
                )
            recorded = np.asarray(told["x"], dtype=np.float64)
            asked = search.ask()
            if asked.shape != recorded.shape or not np.allclose(asked, recorded, rtol=0.0, atol=REPLAY_ATOL):
                raise ValueError(
                    f"the CMA-ES search of generation {generation} does not replay to the points it recorded"
                )
            rows = np.asarray(told.get("told_x") or told["x"], dtype=np.float64)
            if rows.shape != recorded.shape:
                raise ValueError(
                    f"the CMA-ES record of generation {generation} told {len(rows)} rows for {len(recorded)} asked"
                )
            search._es.tell(list(rows), list(told["f"]))
            search.told.append(told)
            search._asked = None
        return search

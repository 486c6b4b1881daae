"""The one CMA-ES driver of the code base: the evolution loop, the
``--baseline cma`` run and the measured yardsticks (``benchmarks/``) all
search policy parameters through `CMASearch`.

* pycma (Hansen's ``cma`` package) with its own defaults (population
  4 + 3 ln n, weighted recombination, active covariance update), minimising;
  this driver speaks in returns (higher is better) and turns a failed
  candidate (score -inf or NaN) into `TOLD_FAILED`.
* Outside proposals join a population by pycma's ``inject(..., force=True)``:
  an injected point is asked back as it is (the refined copies of CEM-RL,
  Pourchot and Sigaud 2019, evaluated like any other candidate), and the
  update in ``tell`` trims its step where it is far off the distribution.
* Same seed, same search: pycma's normal draws come from a NumPy generator
  of the stream ``cma_search`` of ``seed`` (`genesis_fp16.seeds`; never from
  ``numpy.random``), and the driver keeps what it asked, injected and told
  (`record`), so a resumed run rebuilds the same
  state by replaying it (`CMASearch.replay`, which checks that the replay asks
  for exactly the recorded points).
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import numpy as np

from genesis_fp16.extras import require
from genesis_fp16.seeds import numpy_rng

TOLD_FAILED = 1e300
"""What pycma (a minimiser) is told for a candidate whose episode failed."""
REPLAY_ATOL = 1e-9


def default_popsize(n_params: int) -> int:
    """pycma's default population for ``n_params`` parameters: 4 + floor(3 ln n)."""
    return 4 + int(3 * math.log(n_params))


class CMASearch:
    """CMA-ES from ``x0`` with step size ``sigma0``: `ask` a population
    (injected points first), `tell` its scores (higher is better)."""

    def __init__(self, x0: np.ndarray, sigma0: float, *, seed: int, popsize: Optional[int] = None, purpose: str = "CMA-ES") -> None:
        if not (math.isfinite(sigma0) and sigma0 > 0):
            raise ValueError(f"sigma0={sigma0}: expected a finite number > 0 (CMA-ES's initial step size)")
        if popsize is not None and popsize < 2:
            raise ValueError(f"popsize={popsize}: expected at least 2, or None (pycma's default, 4 + 3 ln n)")
        cma = require("cma", purpose)
        self.x0, self.sigma0, self.seed, self.requested_popsize = np.asarray(x0, dtype=np.float64).copy(), float(sigma0), int(seed), popsize
        rng = numpy_rng(self.seed, "cma_search")
        options: dict[str, Any] = {"seed": math.nan, "verbose": -9, "randn": lambda *shape: rng.standard_normal(shape)}
        if popsize is not None:
            options["popsize"] = int(popsize)
        self._es = cma.CMAEvolutionStrategy(self.x0.copy(), self.sigma0, options)
        self._asked: Optional[np.ndarray] = None
        self._inject: list[np.ndarray] = []
        self.told: list[dict[str, Any]] = []
        """Per generation: ``{"injected": k, "inject": the k points handed to `ask`, "x": the asked
        population, "f": what pycma was told}``."""

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

    def ask(self, inject: Sequence[np.ndarray] = ()) -> np.ndarray:
        """The next population, (popsize, n): the ``inject``ed points first
        (at most popsize - 1 of them: CMA-ES keeps at least one sample of its
        own), then CMA-ES's samples."""
        if self._asked is not None:
            raise RuntimeError("CMASearch.ask: the last population was not told yet")
        inject = [np.asarray(x, dtype=np.float64) for x in inject]
        if len(inject) >= self.popsize:
            raise ValueError(f"CMASearch.ask: {len(inject)} injected points; expected at most popsize - 1 = {self.popsize - 1}")
        if inject:
            self._es.inject(inject, force=True)
        self._asked, self._inject = np.asarray(self._es.ask(), dtype=np.float64), inject
        return self._asked.copy()

    def tell(self, scores: Sequence[float]) -> None:
        """The asked population's scores, in order (higher is better; -inf or NaN: the candidate failed)."""
        if self._asked is None or len(scores) != len(self._asked):
            raise ValueError(f"CMASearch.tell: {len(scores)} scores for {0 if self._asked is None else len(self._asked)} asked points")
        f = [-float(s) if math.isfinite(s) else TOLD_FAILED for s in scores]
        self._es.tell(list(self._asked), f)
        self.told.append({"injected": len(self._inject), "inject": [x.tolist() for x in self._inject], "x": self._asked.tolist(), "f": f})
        self._asked = None

    # -- resume --------------------------------------------------------------------------
    def record(self) -> dict[str, Any]:
        """JSON for a run manifest: what `replay` needs."""
        return {"x0": [float(v) for v in self.x0], "sigma0": self.sigma0, "seed": self.seed, "popsize": self.requested_popsize,
                "told": self.told}

    @classmethod
    def replay(cls, data: dict[str, Any], purpose: str = "CMA-ES") -> "CMASearch":
        """The search a `record` describes, rebuilt by asking and telling
        again: each generation injects the points the live run handed to `ask`
        (pycma re-expresses an injected point through its mean and step size,
        so the asked row differs from it in the last bits, and re-injecting
        the asked row would drift) and tells pycma the rows its own `ask`
        returned, as the live run did. Raises ValueError when the replay does
        not ask for the recorded points (another pycma, or an edited manifest)."""
        search = cls(np.asarray(data["x0"], dtype=np.float64), float(data["sigma0"]), seed=int(data["seed"]), popsize=data.get("popsize"),
                     purpose=purpose)
        for generation, told in enumerate(data.get("told") or []):
            recorded = np.asarray(told["x"], dtype=np.float64)
            k = int(told.get("injected") or 0)
            inject = told.get("inject")
            inject = list(np.asarray(inject, dtype=np.float64)) if inject is not None else list(recorded[:k])  # records before "inject"
            if len(inject) != k:
                raise ValueError(f"the CMA-ES record of generation {generation} names {k} injected points and holds {len(inject)}")
            asked = search.ask(inject)
            if asked.shape != recorded.shape or not np.allclose(asked, recorded, rtol=0.0, atol=REPLAY_ATOL):
                raise ValueError(f"the CMA-ES search of generation {generation} does not replay to the points it recorded")
            search._es.tell(list(asked), list(told["f"]))
            search.told.append(told)
            search._asked, search._inject = None, []
        return search

"""How good the world model is, measured on what the loop already paid for:
the imagined against the real returns of the candidates that got real
episodes, on exactly the start states they were run on.

Per candidate (`candidate_record`): the imagined mean and interval (low,
high) over those states, the real mean on them, the relative error
``|imagined - real| / max(|real|, 1)`` (the floor keeps returns near 0 from
blowing it up) and whether the real mean fell inside the interval. Per
generation and per run (`summary`): Spearman's rank correlation of imagined
against real means (None below 3 candidates, or when either side has no
spread), the share inside the interval (calibration), the median relative
error, and the mean share of imagined rollouts truncated by member
disagreement.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

MIN_SPEARMAN = 3  # candidates below which a rank correlation says nothing


def ranks(values: Sequence[float]) -> np.ndarray:
    """1-based ranks, ties sharing their average rank (as scipy's rankdata)."""
    v = np.asarray(values, dtype=np.float64)
    order = np.argsort(v, kind="mergesort")
    sorted_v = v[order]
    out = np.empty(len(v))
    i = 0
    while i < len(v):
        j = i
        while j + 1 < len(v) and sorted_v[j + 1] == sorted_v[i]:
            j += 1
        out[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return out


def spearman(a: Sequence[float], b: Sequence[float]) -> Optional[float]:
    """Spearman's rho: the Pearson correlation of the ranks. None below
    `MIN_SPEARMAN` pairs or when either side is constant."""
    if len(a) != len(b):
        raise ValueError(f"spearman: {len(a)} and {len(b)} values; expected pairs")
    if len(a) < MIN_SPEARMAN:
        return None
    ra, rb = ranks(a) - (len(a) + 1) / 2.0, ranks(b) - (len(b) + 1) / 2.0
    denom = float(np.sqrt((ra**2).sum() * (rb**2).sum()))
    return None if denom == 0.0 else float((ra * rb).sum() / denom)


def relative_error(imagined: float, real: float) -> float:
    return abs(imagined - real) / max(abs(real), 1.0)


def candidate_record(cand_id: str, *, imagined_mean: float, low: float, high: float, real_mean: float, truncated: float,
                     states: int) -> dict[str, Any]:
    """One evaluated candidate's imagined-vs-real comparison (JSON-ready)."""
    return {
        "id": cand_id, "states": states, "imagined_mean": float(imagined_mean), "low": float(low), "high": float(high),
        "real_mean": float(real_mean), "inside": bool(low <= real_mean <= high),
        "rel_error": relative_error(float(imagined_mean), float(real_mean)), "truncated": float(truncated),
    }


def summary(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``spearman``, ``calibration``, ``rel_error`` (median), ``candidates``
    and ``truncated`` (mean share) over ``records``; None where there are none."""
    if not records:
        return {"spearman": None, "calibration": None, "rel_error": None, "candidates": 0, "truncated": None}
    return {
        "spearman": spearman([r["imagined_mean"] for r in records], [r["real_mean"] for r in records]),
        "calibration": float(np.mean([r["inside"] for r in records])),
        "rel_error": float(np.median([r["rel_error"] for r in records])),
        "candidates": len(records),
        "truncated": float(np.mean([r["truncated"] for r in records])),
    }


def run_summary(generations: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """`summary` pooled over the candidates of every generation record (their ``imagination.records``)."""
    return summary([r for g in generations for r in ((g.get("imagination") or {}).get("records") or [])])

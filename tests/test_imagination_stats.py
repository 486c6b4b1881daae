"""How good the model is: Spearman's rho, calibration and relative error on
known numbers, pooled over a run's generations."""

from __future__ import annotations

import numpy as np
import pytest

from agents.imagination_stats import candidate_record, ranks, relative_error, run_summary, spearman, summary


def test_ranks_average_ties():
    np.testing.assert_array_equal(ranks([10.0, 30.0, 20.0, 20.0]), [1.0, 4.0, 2.5, 2.5])


def test_spearman_on_known_numbers():
    assert spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7.5]) == pytest.approx(0.9)  # 1 - 6 * 2 / (5 * 24)
    assert spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    # with ties: the Pearson correlation of the average ranks
    a, b = [1.0, 2.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0]
    assert spearman(a, b) == pytest.approx(np.corrcoef(ranks(a), ranks(b))[0, 1])
    assert spearman([1, 2], [2, 1]) is None  # below 3 candidates
    assert spearman([1, 1, 1], [1, 2, 3]) is None  # no spread on one side
    with pytest.raises(ValueError, match="pairs"):
        spearman([1, 2, 3], [1, 2])


def test_calibration_and_relative_error():
    records = [
        candidate_record("a", imagined_mean=-100.0, low=-150.0, high=-50.0, real_mean=-120.0, truncated=0.0, states=2),
        candidate_record("b", imagined_mean=-200.0, low=-210.0, high=-190.0, real_mean=-300.0, truncated=0.5, states=16),
        candidate_record("c", imagined_mean=0.5, low=0.0, high=1.0, real_mean=0.2, truncated=0.25, states=4),
    ]
    assert [r["inside"] for r in records] == [True, False, True]
    assert records[0]["rel_error"] == pytest.approx(20 / 120)
    assert records[2]["rel_error"] == pytest.approx(0.3)  # |0.5 - 0.2| / max(0.2, 1)
    assert relative_error(5.0, 0.0) == 5.0
    assert records[1]["rel_error"] == pytest.approx(100 / 300)
    out = summary(records)
    assert out == {"spearman": pytest.approx(1.0), "calibration": pytest.approx(2 / 3), "rel_error": pytest.approx(0.3),  # the median
                   "candidates": 3, "truncated": pytest.approx(0.25)}
    gens = [{"imagination": None}, {"imagination": {**summary(records[:2]), "records": records[:2]}},
            {"imagination": {**summary(records[2:]), "records": records[2:]}}]
    assert run_summary(gens) == out  # pooled over the run
    assert summary([]) == {"spearman": None, "calibration": None, "rel_error": None, "candidates": 0, "truncated": None}

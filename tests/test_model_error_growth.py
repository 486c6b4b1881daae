"""scripts/model_error_growth.py: the open-loop error of the model's rollouts per
step, against real held-out episodes, on a tiny Pendulum run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scripts_loader import load_script

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def growth():
    return load_script("model_error_growth")


def test_a_tiny_run_reports_the_error_per_step_and_the_horizon(growth, tmp_path, capsys):
    out = tmp_path / "growth.json"
    argv = [
        "--env",
        "Pendulum-v1",
        "--episodes",
        "2",
        "--policies",
        "1",
        "--heldout",
        "1",
        "--steps",
        "30",
        "--hmax",
        "4",
        "--threshold",
        "100",
        "--json",
        str(out),
    ]
    assert growth.main(argv) == 0
    report = json.loads(out.read_text())
    assert report["episodes"] == 2 and report["transitions"] == 400 and report["heldout_transitions"] == 200
    rows = report["rows"]
    assert [r["k"] for r in rows] == [1, 2, 3, 4] and [r["windows"] for r in rows] == [200, 199, 198, 197]
    assert all(r["error"] is not None and np.isfinite(r["error"]) and 0.0 <= r["cut_share"] <= 1.0 for r in rows)
    assert report["horizon"] == 4 and report["limited_by"] == "hmax"  # every error is under 100 standard deviations
    printed = capsys.readouterr().out
    assert (
        "| 1 | 200 |" in printed
        and "largest k with the error under 100 at every step up to it: 4 (--hmax ends" in printed
    )


def test_the_horizon_stops_at_the_first_step_over_the_threshold(growth, tmp_path):
    out = tmp_path / "growth.json"
    argv = [
        "--episodes",
        "2",
        "--policies",
        "1",
        "--heldout",
        "1",
        "--steps",
        "30",
        "--hmax",
        "3",
        "--threshold",
        "1e-9",
        "--json",
        str(out),
    ]
    assert growth.main(argv) == 0
    report = json.loads(out.read_text())
    assert report["horizon"] == 0 and report["limited_by"] == "error"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--hmax", "0"], "--hmax 0: expected at least 1"),
        (["--threshold", "0"], "--threshold 0.0: expected a number > 0"),
    ],
)
def test_bad_options_are_refused(growth, capsys, argv, message):
    with pytest.raises(SystemExit):
        growth.main(argv)
    assert message in capsys.readouterr().err

"""scripts/bench_world_model.py runs and writes what it says, on a tiny grid."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_world_model.py"

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_size_bench_times_training_and_rollouts(tmp_path, monkeypatch, capsys):
    out = tmp_path / "bench.json"
    argv = [
        str(SCRIPT),
        "--ensembles",
        "1,2",
        "--hiddens",
        "8",
        "--layers",
        "1",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--rows",
        "12",
        "--horizon",
        "2",
        "--json",
        str(out),
    ]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    assert done.value.code == 0
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["rollout_rows"] == 12 and len(report["rows"]) == 2
    for row in report["rows"]:
        assert row["fp32_s"] > 0 and row["bf16_s"] > 0 and row["rollout_step_s"] > 0
        assert row["bf16_speedup"] == pytest.approx(row["fp32_s"] / row["bf16_s"])
    printed = capsys.readouterr().out
    assert "load average before" in printed and "| 2 | 8 | 1 |" in printed

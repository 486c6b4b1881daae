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


def test_the_train_calls_bench_times_world_model_calls(tmp_path, monkeypatch, capsys, state_dir):
    """``--train-calls``: a WorldModel.train call per cell after an untimed one; on the CPU the eager window only."""
    out = tmp_path / "calls.json"
    argv = [str(SCRIPT), "--train-calls", "--ensembles", "2", "--hiddens", "8", "--layers", "1", "--steps", "20",
            "--precisions", "fp32,bf16", "--json", str(out)]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    assert done.value.code == 0
    data = json.loads(out.read_text())
    assert data["tool"].endswith("--train-calls") and data["steps_per_call"] == 20
    assert [(r["ensemble"], r["hidden"], r["precision"]) for r in data["rows"]] == [(2, 8, "fp32"), (2, 8, "bf16")]
    for row in data["rows"]:
        eager = row["eager"]
        assert "captured" not in row and eager["s_per_step"] > 0 and eager["captures"] == 0
        assert eager["precision"] == row["precision"]
    assert "| 2 | 8 | 1 | fp32 |" in capsys.readouterr().out

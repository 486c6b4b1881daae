"""scripts/imagination_ranking.py: a model trained on a run's own data ranks the run's candidates."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agents.se_darwin_agent import EvolveConfig, SEDarwinAgent
from genesis_fp16.settings import load_settings
from scripts_loader import load_script


pytestmark = pytest.mark.usefixtures("one_thread")


def _script():
    return load_script("imagination_ranking")


def _tiny_run(tmp_path: Path) -> Path:
    """A tiny Pendulum run's report (its replay data stays in the state dir)."""
    config = EvolveConfig(budget=24, seed=1, workers=1, init_candidates=8, wm_steps=40, refine_iters=2, revision_iters=2,
                          revision_samples=8, popsize=6, horizon=10, imagine_starts=4, eval_timeout_s=60)
    report = asyncio.run(SEDarwinAgent(config, settings=load_settings()).evolve())
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report, default=str))
    return path


def test_ranks_a_tiny_runs_candidates(tmp_path, state_dir, capsys):
    path = _tiny_run(tmp_path)
    args = ["--report", str(path), "--state-dir", str(state_dir), "--steps", "5", "--horizons", "3", "--ensembles", "2", "1",
            "--starts", "2", "--particles", "2"]
    assert _script().main(args) == 0
    out = capsys.readouterr().out
    assert "Pendulum-v1 seed 1: " in out and "ensemble 2: validation loss" in out and "ensemble 1: validation loss" in out
    rows = [line for line in out.splitlines() if line.strip().startswith("horizon")]
    assert len(rows) == 4  # two ensembles x truncation on and off
    assert all("Spearman mean" in row and "median imagined" in row for row in rows)


def test_looks_closer_at_the_incumbent_and_its_neighbours(tmp_path, state_dir, capsys):
    path = _tiny_run(tmp_path)
    args = ["--report", str(path), "--state-dir", str(state_dir), "--steps", "5", "--horizons", "3", "7", "--ensembles", "2",
            "--starts", "2", "--particles", "2", "--incumbent", "--perturb", "4", "--sigma", "0.1"]
    assert _script().main(args) == 0
    out = capsys.readouterr().out
    assert "returns on 2 training start states" in out and "one step, teacher-forced (200 steps)" in out
    assert "first 3 steps of start 0" in out and "first 7 steps of start 0" in out
    assert "4 policies at sigma 0.1 around the incumbent" in out and "real mean of the model's top 1" in out

"""agents/plots.py: the data each figure draws, and the PNG it writes."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

from agents.plots import FULL_EVALUATION, evolve_figure, ppo_figure, table_figure, write_png
from genesis_fp16.extras import MissingExtraError

ROOT = Path(__file__).resolve().parents[1]


def _generation(n, episodes, steps, best, full=True, wm=0.01):
    return {"generation": n, "real_episodes": episodes, "env_steps": steps, "best_return": best, "best_full": full,
            "wm_val_loss": wm, "fp32_val_loss": None}


def _report(**changes):
    report = {
        "mode": "full", "env": "Pendulum-v1", "seed": 3, "target": -300.0, "precision": "fp16", "heldout_return": -280.0,
        "heldout_episodes": 20,
        "generations": [_generation(0, 8, 1600, -1100.0, full=False), _generation(1, 24, 4800, -800.0),
                        _generation(2, 40, 8000, -290.0, wm=None)],
    }
    report.update(changes)
    return report


def test_evolve_figure_full_evaluations_against_episodes_and_steps():
    figure = evolve_figure(_report())
    episodes, steps, world_model = figure.panels
    best = episodes.lines[0]
    assert best.label == FULL_EVALUATION
    # generation 0's best is a one-episode probe: another set, left out
    assert best.x == (24.0, 40.0) and best.y == (-800.0, -290.0)
    assert steps.lines[0].x == (4800.0, 8000.0)
    assert episodes.target == steps.target == -300.0
    heldout = episodes.lines[1]
    assert heldout.x == (40.0,) and heldout.y == (-280.0,) and "20 unseen start states" in heldout.label
    # the last generation met the target and trained no model
    assert world_model.lines[0].x == (0.0, 1.0) and world_model.log_y and world_model.target is None


def test_evolve_figure_without_world_model_or_env_steps():
    old = [{k: v for k, v in g.items() if k != "env_steps"} | {"wm_val_loss": None} for g in _report()["generations"]]
    figure = evolve_figure(_report(generations=old, mode="no_world_model"))
    assert [p.xlabel for p in figure.panels] == ["real episodes"]


def test_evolve_figure_skips_a_lost_candidates_score():
    gens = [_generation(1, 16, 3200, "-inf"), _generation(2, 32, 6400, -500.0)]  # strict JSON writes -inf as a string
    assert evolve_figure(_report(generations=gens)).panels[0].lines[0].y == (-500.0,)


def test_ppo_figure_training_curve_evaluation_and_target():
    result = {"env_id": "CartPole-v1", "seed": 1, "env_steps": 3072, "eval_return": 480.0, "eval_returns": [470.0, 490.0],
              "history": [{"global_step": 1024, "mean_return": None}, {"global_step": 2048, "mean_return": 20.0},
                          {"global_step": 3072, "mean_return": 35.0}]}
    (panel,) = ppo_figure(result, 475.0, "reward_threshold (env spec)").panels
    training, evaluation = panel.lines
    assert training.x == (2048.0, 3072.0) and training.y == (20.0, 35.0)
    assert evaluation.x == (3072.0,) and evaluation.y == (480.0,) and "2 deterministic" in evaluation.label
    assert panel.target == 475.0 and panel.target_label == "reward_threshold (env spec)"
    assert ppo_figure(result).panels[0].target is None


def test_table_figure_one_line_per_seed_and_method():
    results = json.loads((ROOT / "docs" / "evolution" / "pendulum.json").read_text())
    returns, world_model = table_figure(results).panels
    assert len(returns.lines) == 4 * 5  # four methods, five seeds
    assert [line.label for line in returns.lines if line.label] == [
        "SE-Darwin loop with world model (5 seeds)", "same loop, world model off (5 seeds)",
        "plain CMA-ES (same budget) (5 seeds)", "plain CMA-ES (budget 2000) (5 seeds)",
    ]
    assert len({line.color for line in returns.lines}) == 4
    assert returns.target == -300.0 and returns.log_x  # 2000 episodes beside 200
    loop = returns.lines[0]
    assert loop.x[-1] == results["runs"]["full"][0]["episodes_to_target"] and loop.y[-1] >= -300.0
    assert len(world_model.lines) == 5


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_write_png_is_a_png_of_a_sane_size(tmp_path):
    pytest.importorskip("matplotlib")
    out = write_png(evolve_figure(_report()), tmp_path / "curves.png", "test")
    width, height = _png_size(out)
    assert 800 <= width <= 2000 and 600 <= height <= 2000  # three panels, stacked
    assert [p.name for p in tmp_path.iterdir()] == ["curves.png"]  # no temporary left behind


def test_write_png_without_matplotlib_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    with pytest.raises(MissingExtraError, match=r"genesis-fp16 evolve --plot needs matplotlib.*genesis-fp16\[plots\]"):
        write_png(evolve_figure(_report()), tmp_path / "x.png", "genesis-fp16 evolve --plot")
    assert not (tmp_path / "x.png").exists()

"""agents/plots.py: the data each figure draws, and the PNG it writes."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest

from agents.plots import (
    BEST_EPISODE,
    CMA_EPISODE,
    METHOD_NAMES,
    REFINED_EPISODE,
    VERIFIED,
    evolve_figure,
    ppo_figure,
    table_figure,
    write_png,
)
from genesis_fp16.base.extras import MissingExtraError


def _candidate(generation, i, operator, real_return, full=False):
    return {
        "id": f"g{generation}-{i}-{operator}",
        "operator": operator,
        "real_return": real_return,
        "episodes": 16 if full else 1,
        "full": full,
    }


def _generation(n, episodes, steps, cma, refined=(), verified=None, wm=0.01, critic=0.5):
    """A record as agents/evolve_report.generation_record writes it: one real
    episode per candidate, ``best_return`` the best of them."""
    candidates = [_candidate(n, i, "refined:mean:200", r) for i, r in enumerate(refined)]
    candidates += [_candidate(n, len(candidates) + i, "cma", r) for i, r in enumerate(cma)]
    if verified is not None:
        candidates.append(_candidate(n, len(candidates), "cma", verified, full=True))
    best = lambda rs: max(rs) if rs else None  # noqa: E731
    return {
        "generation": n,
        "real_episodes": episodes,
        "env_steps": steps,
        "candidates": candidates,
        "best_return": best([*refined, *cma]),
        "refined_best": best(list(refined)),
        "cma_best": best(list(cma)),
        "wm_val_loss": wm,
        "critic_val_loss": critic,
    }


def _report(**changes):
    report = {
        "mode": "loop",
        "env": "Pendulum-v1",
        "seed": 3,
        "target": -300.0,
        "heldout_return": -280.0,
        "heldout_episodes": 20,
        "learners": {
            "world_model": {"agent": "world_model.Pendulum-v1", "precision": "bf16"},
            "critic": {"agent": "critic.Pendulum-v1", "precision": "fp16"},
        },
        "generations": [
            _generation(0, 8, 1600, [-1100.0, -1300.0], critic=None),
            _generation(1, 16, 3200, [-900.0, -1000.0], refined=[-800.0, -950.0]),
            _generation(2, 40, 8000, [-700.0], refined=[-250.0], verified=-290.0, wm=None, critic=0.0),
        ],
    }
    report.update(changes)
    return report


def test_evolve_figure_best_episode_refined_and_cma_against_episodes_and_steps():
    episodes, steps, world_model, critic = evolve_figure(_report()).panels
    best, refined, cma, verified, heldout = episodes.lines
    # the best single episode of each generation, a point per generation
    assert best.label == BEST_EPISODE and not best.steps
    assert best.x == (8.0, 16.0, 40.0) and best.y == (-1100.0, -800.0, -250.0)
    # generation 0 refined nothing: the refined line starts at generation 1
    assert refined.label == REFINED_EPISODE and refined.x == (16.0, 40.0) and refined.y == (-800.0, -250.0)
    assert cma.label == CMA_EPISODE and cma.x == (8.0, 16.0, 40.0) and cma.y == (-1100.0, -900.0, -700.0)
    # the candidate verified on every training start state: the set the target is judged on
    assert verified.label == VERIFIED and verified.x == (40.0,) and verified.y == (-290.0,)
    assert heldout.x == (40.0,) and heldout.y == (-280.0,) and "20 unseen start states" in heldout.label
    assert [line.x for line in steps.lines[:3]] == [
        (1600.0, 3200.0, 8000.0),
        (3200.0, 8000.0),
        (1600.0, 3200.0, 8000.0),
    ]
    assert episodes.target == steps.target == -300.0
    # the last generation trained no model; a loss of 0 has no place on a log axis
    assert world_model.lines[0].x == (0.0, 1.0) and world_model.log_y and world_model.target is None
    assert "bf16" in world_model.lines[0].label and world_model.title == "world model"
    assert (
        critic.lines[0].x == (1.0,) and critic.lines[0].y == (0.5,) and "fp16" in critic.lines[0].label and critic.log_y
    )


def test_evolve_figure_of_the_floor_has_no_refined_line_and_no_learners():
    gens = [_generation(n, 8 * (n + 1), None, [-1000.0 + 100 * n], wm=None, critic=None) for n in range(3)]
    for g in gens:
        del g["env_steps"]
    figure = evolve_figure(_report(generations=gens, mode="cma", learners={}, heldout_return=None))
    assert [p.xlabel for p in figure.panels] == ["real episodes"]
    # with CMA-ES samples only, the best episode is the CMA-ES line: drawn once
    assert [line.label for line in figure.panels[0].lines] == [BEST_EPISODE]
    assert figure.panels[0].lines[0].y == (-1000.0, -900.0, -800.0)


def test_evolve_figure_skips_a_lost_candidates_score():
    gens = [_generation(1, 16, 3200, []), _generation(2, 32, 6400, [-500.0])]
    gens[0]["best_return"] = "-inf"  # strict JSON writes -inf as a string
    assert evolve_figure(_report(generations=gens)).panels[0].lines[0].y == (-500.0,)


def test_ppo_figure_training_curve_evaluation_and_target():
    result = {
        "env_id": "CartPole-v1",
        "seed": 1,
        "env_steps": 3072,
        "eval_return": 480.0,
        "eval_returns": [470.0, 490.0],
        "history": [
            {"global_step": 1024, "mean_return": None},
            {"global_step": 2048, "mean_return": 20.0},
            {"global_step": 3072, "mean_return": 35.0},
        ],
    }
    (panel,) = ppo_figure(result, 475.0, "reward_threshold (env spec)").panels
    training, evaluation = panel.lines
    assert training.x == (2048.0, 3072.0) and training.y == (20.0, 35.0)
    assert evaluation.x == (3072.0,) and evaluation.y == (480.0,) and "2 deterministic" in evaluation.label
    assert panel.target == 475.0 and panel.target_label == "reward_threshold (env spec)"
    assert ppo_figure(result).panels[0].target is None


def _table(seeds=(0, 1, 2)):
    """A synthetic scripts/evolution_table.py report: the loop stops at the
    target (seeds end at different points), the floor runs its budget out,
    and a baseline's records are its checks."""

    def loop(seed):
        n = 2 + seed  # seed k reaches the target in generation k + 2
        gens = [
            _generation(
                g,
                8 * (g + 1),
                1600 * (g + 1),
                [-1000.0 + 100 * g],
                refined=[-900.0 + 300 * g],
                wm=0.01 / (g + 1),
                critic=0.1,
            )
            for g in range(n + 1)
        ]
        return {
            "mode": "loop",
            "seed": seed,
            "episodes_to_target": 8 * (n + 1),
            "heldout_return": -250.0 - seed,
            "generations": gens,
        }

    def floor(seed):
        gens = [_generation(g, 8 * (g + 1), 1600 * (g + 1), [-1200.0 + 50 * g], wm=None, critic=None) for g in range(5)]
        return {"mode": "cma", "seed": seed, "episodes_to_target": None, "heldout_return": -1000.0, "generations": gens}

    def sac(seed):
        checks = [
            {
                "generation": g,
                "real_episodes": 10 * (g + 1),
                "env_steps": 2000 * (g + 1),
                "best_return": -800.0 + 100 * g,
                "best_full": True,
            }
            for g in range(4)
        ]
        return {"mode": "sac", "seed": seed, "heldout_return": -500.0, "generations": checks}

    return {
        "env": "Pendulum-v1",
        "target": -300.0,
        "budget": 40,
        "seeds": list(seeds),
        "runs": {"full": [loop(s) for s in seeds], "cma": [floor(s) for s in seeds], "sac": [sac(s) for s in seeds]},
    }


def test_table_figure_one_line_per_seed_and_method():
    results = _table()
    episodes, steps, world_model, critic = table_figure(results).panels
    curves = [line for line in episodes.lines if len(line.x) > 1]
    assert len(curves) == 3 * 3  # three methods, three seeds
    assert [line.label for line in episodes.lines if line.label] == [
        f"{METHOD_NAMES['full']} (3 seeds)",
        f"{METHOD_NAMES['cma']} (3 seeds)",
        f"{METHOD_NAMES['sac']} (3 seeds)",
    ]
    assert len({line.color for line in episodes.lines}) == 3
    assert episodes.target == steps.target == -300.0 and not episodes.log_x
    # the loop's seed 0: the best episode of each generation, ending at the target
    loop = curves[0]
    assert loop.x == (8.0, 16.0, 24.0) and loop.y == (-900.0, -600.0, -300.0)
    assert loop.x[-1] == results["runs"]["full"][0]["episodes_to_target"] and loop.y[-1] >= -300.0
    # each seed's held-out return at its last point, in its method's colour
    heldout = [line for line in episodes.lines if len(line.x) == 1]
    assert [(line.x, line.y, line.color) for line in heldout[:3]] == [
        ((24.0,), (-250.0,), "C0"),
        ((32.0,), (-251.0,), "C0"),
        ((40.0,), (-252.0,), "C0"),
    ]
    assert steps.lines[0].x == (1600.0, 3200.0, 4800.0)
    # the learners' panels: the loop's seeds only (the floor learns nothing)
    assert len(world_model.lines) == len(critic.lines) == 3 and world_model.log_y and critic.log_y
    assert world_model.lines[0].y == (0.01, 0.005, 0.01 / 3)


def test_table_figure_log_x_when_one_budget_dwarfs_another():
    results = _table(seeds=(0,))
    long = [
        {"generation": 0, "real_episodes": 8, "env_steps": 1600, "best_return": -1200.0},
        {"generation": 1, "real_episodes": 2000, "env_steps": 400000, "best_return": -200.0},
    ]
    results["runs"]["cma_long"] = [{"seed": 0, "heldout_return": -210.0, "generations": long}]
    results["cma_long_budget"] = 2000
    episodes = table_figure(results).panels[0]
    assert episodes.log_x and "plain CMA-ES (budget 2000) (1 seeds)" in [line.label for line in episodes.lines]


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

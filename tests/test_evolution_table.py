"""scripts/evolution_table.py --summarize: the cross-task row the docs quote."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from scripts_loader import load_script

ROOT = Path(__file__).resolve().parents[1]
evolution_table = load_script("evolution_table")


def run(reached_at, steps=1000, heldout=-200.0):
    return {
        "target_reached": reached_at is not None,
        "episodes_to_target": reached_at,
        "env_steps": steps,
        "heldout_return": heldout,
    }


def table(cma_long, env="Pendulum-v1"):
    return {
        "env": env,
        "target": -300.0,
        "seeds": [0, 1, 2],
        "cma_long_budget": 2000,
        "runs": {
            "full": [run(40, 8000), run(56, 11200), run(None, 40000, -900.0)],
            "no_world_model": [run(None)] * 3,
            "cma": [run(None)] * 3,
            "cma_long": cma_long,
        },
    }


def test_summary_ratio_when_cma_es_gets_there_and_bound_when_it_does_not(tmp_path, capsys):
    rows = evolution_table.summary(
        [table([run(480), run(560), run(None)]), table([run(None)] * 3, env="Swimmer-v5")]
    ).splitlines()
    first, second = rows[2], rows[3]
    # the loop reached 2/3: medians over the seeds that reached (40, 56)
    assert "| Pendulum-v1 (-300) | 3 | 2/3 | 48 | 9600 | -200.0 | 0/3 | 0/3 | 2/3 | 520 | 10.8x |" == first
    assert second.endswith("| 0/3 | - | > 42x (CMA-ES not there in 2000) |")
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table([run(None)] * 3)))
    assert evolution_table.main(["--summarize", str(path)]) == 0
    assert "Pendulum-v1 (-300)" in capsys.readouterr().out


def test_summary_gives_no_median_when_most_seeds_missed():
    t = table([run(None)] * 3)
    t["runs"]["full"] = [run(40), run(None), run(None)]
    row = evolution_table.summary([t]).splitlines()[2]
    assert "| 1/3 | - | - |" in row and row.endswith("| - |")


def test_learn_termination_refuses_a_task_that_never_terminates(capsys):
    with pytest.raises(SystemExit) as exc:
        evolution_table.main(["--env", "Pendulum-v1", "--learn-termination"])
    assert exc.value.code == 2 and "never terminates" in capsys.readouterr().err


def _tiny(out, *modes):
    return [
        "--seeds",
        "0",
        "--budget",
        "16",
        "--cma-long-budget",
        "0",
        "--precision-steps",
        "0",
        "--out",
        str(out),
        "--modes",
        *modes,
    ]


def test_keep_finished_runs_only_the_missing_modes(tmp_path, monkeypatch, capsys):
    out = tmp_path / "t.json"
    assert evolution_table.main(_tiny(out, "cma")) == 0
    first = json.loads(out.read_text())["runs"]["cma"]
    ran = []
    real = evolution_table.run_mode
    monkeypatch.setattr(evolution_table, "run_mode", lambda mode, *a: ran.append(mode) or real(mode, *a))
    assert evolution_table.main([*_tiny(out, "cma", "no_world_model"), "--keep-finished"]) == 0
    report = json.loads(out.read_text())
    assert ran == ["no_world_model"]
    assert report["runs"]["cma"] == first and report["kept"]["modes"] == ["cma"]
    assert (
        "| the floor: the loop with nothing learned, a one-episode CMA-ES (same budget) |" in report["markdown"]
        and "| same loop, world model off (the critic on real data only) |" in report["markdown"]
    )
    assert "keeping cma" in capsys.readouterr().err
    assert "Modes cma kept from the run of " in report["markdown"]


def test_keep_finished_refuses_a_report_of_other_settings(tmp_path):
    out = tmp_path / "t.json"
    assert evolution_table.main(_tiny(out, "cma")) == 0
    with pytest.raises(SystemExit, match="other settings \\(budget\\)"):
        evolution_table.main([*_tiny(out, "cma"), "--budget", "32", "--keep-finished"])
    out.write_text("not json")
    with pytest.raises(SystemExit, match="not a report of this script"):
        evolution_table.main([*_tiny(out, "cma"), "--keep-finished"])
    assert out.read_text() == "not json"  # nothing lost


def _with_ranked(imagined, real):
    t = table([run(None)] * 3)
    gens = [
        {
            "evaluated": [
                {"id": f"c{i}", "imagined": a, "real_return": b} for i, (a, b) in enumerate(zip(imagined, real))
            ]
        }
    ]
    gens.append(
        {"evaluated": [{"id": "g0", "imagined": None, "real_return": -1000.0}]}
    )  # generation 0: random, never ranked
    t["runs"]["full"] = [{**run(40), "generations": gens}]
    return t


def test_plot_of_one_shipped_report(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "pendulum.png"
    assert (
        evolution_table.main(
            ["--summarize", str(ROOT / "docs" / "evolution" / "pendulum_target300.json"), "--plot", str(out)]
        )
        == 0
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert "Pendulum-v1 (-300)" in capsys.readouterr().out  # the summary is still printed


def test_plot_refuses_several_reports(tmp_path, capsys):
    reports = [str(ROOT / "docs" / "evolution" / name) for name in ("pendulum.json", "swimmer.json")]
    with pytest.raises(SystemExit) as info:
        evolution_table.main(["--summarize", *reports, "--plot", str(tmp_path / "x.png")])
    assert info.value.code == 2 and "--plot draws one report; got 2" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


# --- the model-free baselines and the imagination report (issue 26) ---


def _evolve_report(spearman=0.72, share=0.41):
    """A plain `genesis-fp16 evolve --json` report, as the loop writes it (no "runs")."""
    gens = [{"evaluated": [{"id": f"c{i}", "imagined": float(i), "real_return": float(i) * 2} for i in range(4)]}]
    return {
        **run(56, 11200, -180.0),
        "env": "Pendulum-v1",
        "target": -300.0,
        "seed": 0,
        "mode": "full",
        "budget": 200,
        "generations": gens,
        "imagination": {
            "spearman": spearman,
            "calibration": 0.8,
            "rel_error": 0.25,
            "candidates": 40,
            "truncated": 0.1,
        },
        "time_share": {"model_share": share, "real_share": 1 - share},
    }


def _baseline(reached_at, steps_to, spent, heldout, method, **settings):
    return {
        **run(reached_at, spent, heldout),
        "env_steps_to_target": steps_to,
        "wall_s": 1.0,
        "cpu_s": 2.0,
        "method": method,
        "settings": settings,
    }


def _with_baselines(ars_hits=True):
    t = table([run(None)] * 3)
    t["runs"] = {
        "full": [
            {**run(40, 8000), "wall_s": 3.0},
            {**run(56, 11200), "wall_s": 3.0},
            {**run(None, 40000, -900.0), "wall_s": 3.0},
        ]
    }
    cma = dict(sigma0=0.5, sigma_final=0.3, popsize=12, policy="linear")
    t["runs"]["cma_tuned"] = [_baseline(None, None, 40000, -500.0, "cma_tuned", **cma)] * 3
    ars = dict(version="V2-t", step_size=0.02, noise=0.01, directions=1, top=1)
    t["runs"]["ars"] = [
        {
            **_baseline(100 if ars_hits else None, 20000 if ars_hits else None, 40000, -250.0, "ars", **ars),
            "check_wall_s": 0.5,
        }
    ] * 3
    sac = dict(stable_baselines3="2.9.2", steps_asked=11200, steps_run=11200, capped=False)
    t["runs"]["sac"] = [_baseline(30, 6000, 11200, -150.0, "sac", **sac)] * 3
    t["environment"] = None
    return t


def test_comparison_gives_the_best_tuned_baselines_ratio_to_the_loop_and_sacs():
    text = evolution_table.comparison(_with_baselines())
    assert (
        "| tuned CMA-ES, 1 episode per candidate | 0/3 | - | - | 40000 | -500.0 | 1.0 | 2.0 | sigma0 0.5 (final "
        "median 0.3), popsize 12, linear |" in text
    )
    assert (
        "| ARS V2-t | 3/3 | 100 | 20000 | 40000 | -250.0 | 1.0 (0.5 in checks) | 2.0 | V2-t: alpha 0.02, nu 0.01, N "
        "1, b 1 |" in text
    )
    # the loop: a median of 9600 env steps over the seeds that reached (8000, 11200)
    assert (
        "Best tuned model-free baseline: ARS V2-t, a median of 20000 env steps to the target; the loop 9600: **2.1x** "
        "the loop's." in text
    )
    assert "SAC: a median of 6000 env steps to the target, 0.6x the loop's." in text
    text = evolution_table.comparison(_with_baselines(ars_hits=False))
    assert (
        "No tuned model-free baseline (cma_tuned, ars) reached the target on most seeds within a median of 40000 env "
        "steps: **> 4.2x**" in text
    )
    row = evolution_table.baseline_summary([_with_baselines()]).splitlines()[2]
    assert row == (
        "| Pendulum-v1 (-300) | 3 | 2/3 | 9600 | -200.0 | ARS V2-t | 3/3 | 20000 | -250.0 | 2.1x | 3/3 | 6000 | "
        "-150.0 |"
    )


def _fake_loop(monkeypatch, fields):
    made = []
    config = dataclasses.make_dataclass(
        "FakeConfig", [(name, object, dataclasses.field(default=None)) for name in fields]
    )

    class Agent:
        def __init__(self, cfg, task=None, settings=None):
            made.append(cfg)

        async def evolve(self):
            return {**run(40, 8000), "wall_s": 1.0}

    monkeypatch.setattr(evolution_table, "EvolveConfig", config)
    monkeypatch.setattr(evolution_table, "SEDarwinAgent", Agent)
    return made


BASE_FIELDS = ["seed", "budget", "use_world_model", "precision", "env_id", "target", "policy", "episode_steps"]


def test_the_loop_gets_the_ensemble_and_the_step_budget_only_where_evolve_config_has_them(monkeypatch, tmp_path):
    task = {"env_id": "Pendulum-v1", "target": None, "policy": None, "episode_steps": None}
    made = _fake_loop(monkeypatch, [*BASE_FIELDS, "ensemble", "budget_steps"])
    opts = evolution_table.Options(ensemble=5, budget_steps=900)
    evolution_table.run_mode("full", 0, 200, tmp_path, None, task, None, opts)
    evolution_table.run_mode("loop_e1", 0, 200, tmp_path, None, task, None, opts)
    evolution_table.run_mode("no_world_model", 0, 200, tmp_path, None, task, None, opts)
    assert [(c.ensemble, c.budget_steps, c.use_world_model) for c in made] == [
        (5, 900, True),
        (1, 900, True),
        (None, 900, False),
    ]
    made = _fake_loop(monkeypatch, BASE_FIELDS)
    report = evolution_table.run_mode("full", 0, 200, tmp_path, None, task, None, opts)
    assert "ensemble" not in {f.name for f in dataclasses.fields(made[0])} and report["cpu_s"] >= 0


def test_loop_e1_is_refused_without_an_ensemble_and_ensemble_is_noted(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(evolution_table, "evolve_fields", lambda: set(BASE_FIELDS))  # EvolveConfig before the ensemble
    with pytest.raises(SystemExit) as info:
        evolution_table.main(["--methods", "loop_e1", "--precision-steps", "0"])
    assert info.value.code == 2 and "EvolveConfig has no `ensemble` field" in capsys.readouterr().err
    ran = []
    monkeypatch.setattr(
        evolution_table,
        "run_mode",
        lambda mode, *a: (
            ran.append((mode, a[-1]))
            or {**run(40, 1234), "wall_s": 1.0, "seed": a[0], "train_return": -250.0, "budget": 200}
        ),
    )
    argv = [
        "--methods",
        "loop",
        "sac",
        "--ensemble",
        "5",
        "--seeds",
        "0",
        "--precision-steps",
        "0",
        "--cma-long-budget",
        "0",
        "--out",
        str(tmp_path / "t.json"),
    ]
    pytest.importorskip("stable_baselines3")  # the script checks the extra before it runs anything
    assert evolution_table.main(argv) == 0
    assert "note: --ensemble 5 not passed: EvolveConfig has no `ensemble` field" in capsys.readouterr().err
    assert [m for m, _ in ran] == ["full", "sac"] and ran[1][
        1
    ].sac_steps == 1234  # SAC runs for the loop's env steps of the same seed
    assert json.loads((tmp_path / "t.json").read_text())["notes"]


def test_a_baseline_through_the_script(tmp_path):
    out = tmp_path / "t.json"
    argv = [
        "--env",
        "MountainCarContinuous-v0",
        "--episode-steps",
        "40",
        "--methods",
        "ars",
        "--seeds",
        "0",
        "--budget",
        "32",
        "--cma-long-budget",
        "0",
        "--precision-steps",
        "0",
        "--out",
        str(out),
    ]
    assert evolution_table.main(argv) == 0
    report = json.loads(out.read_text())
    (ars,) = report["runs"]["ars"]
    assert ars["real_episodes"] == 32 and ars["env_steps"] <= 32 * 40 and ars["settings"]["directions"] == 16
    assert report["markdown"].startswith("Measured ") and "| ARS V2-t | 0/1 |" in report["markdown"]
    assert report["options"]["cma_sigma"] == 0.5 and "flags" in report["environment"]


def _seeded(seed, reached_at, heldout, **extra):
    return {**run(reached_at, 1000 * (seed + 1), heldout), "seed": seed, **extra}


def test_merge_joins_seed_groups_and_methods_of_one_task(tmp_path, capsys):
    first = table([run(None)] * 3)
    first["seeds"], first["runs"] = (
        [0, 1, 2],
        {
            "full": [_seeded(s, 40, -200.0) for s in (0, 1, 2)],
            "ars": [_seeded(s, None, -900.0, cpu_s=1.0) for s in (0, 1, 2)],
        },
    )
    second = table([run(None)] * 3)
    second["seeds"], second["runs"] = (
        [3, 4],
        {
            "full": [_seeded(s, None, -300.0, cpu_s=4.0) for s in (4, 3)],
            "loop_e1": [_seeded(s, 48, -250.0) for s in (3, 4)],
        },
    )
    other = {**table([run(None)] * 3), "env": "Swimmer-v5", "runs": {"full": [_seeded(0, None, 30.0)]}}
    paths = []
    for name, t in (("a", first), ("b", second), ("c", other)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(t))
    assert evolution_table.main(["--summarize", *map(str, paths), "--merge"]) == 0
    out = capsys.readouterr().out
    assert "Pendulum-v1, target -300, seeds 0, 1, 2, 3, 4:" in out and "Swimmer-v5, target -300, seeds 0:" in out
    # seeds in order whichever file and order they came in; a seed a method did not run is '.'
    assert (
        "| SE-Darwin loop: CMA-ES refined by the critic, the world model's rollouts training it | 3/5 | -200.0 / "
        "-200.0 / -200.0 / -300.0 / -300.0 | -200.0 | 1000 / 2000 / 3000 / - / - "
        "| 2000 | 3000 | 4 |"
    ) in out
    assert "| ARS V2-t | 0/3 | -900.0 / -900.0 / -900.0 / . / . | -900.0 | - / - / - / . / . | - | 2000 | 1 |" in out
    assert "| SE-Darwin loop, ensemble of 1 | 2/2 | . / . / . / -250.0 / -250.0 |" in out
    paths.append(tmp_path / "again.json")
    paths[-1].write_text(json.dumps(second))
    with pytest.raises(SystemExit, match="full seed 4 of Pendulum-v1 .* is in both"):
        evolution_table.main(["--summarize", *map(str, paths), "--merge"])
    with pytest.raises(SystemExit):
        evolution_table.main(["--merge"])

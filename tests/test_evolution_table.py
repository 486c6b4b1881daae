"""scripts/evolution_table.py --summarize: the cross-task row the docs quote."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("evolution_table", ROOT / "scripts" / "evolution_table.py")
evolution_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(evolution_table)


def run(reached_at, steps=1000, heldout=-200.0):
    return {"target_reached": reached_at is not None, "episodes_to_target": reached_at, "env_steps": steps, "heldout_return": heldout}


def table(cma_long, env="Pendulum-v1"):
    return {
        "env": env, "target": -300.0, "seeds": [0, 1, 2], "cma_long_budget": 2000,
        "runs": {
            "full": [run(40, 8000), run(56, 11200), run(None, 40000, -900.0)],
            "no_world_model": [run(None)] * 3,
            "cma": [run(None)] * 3,
            "cma_long": cma_long,
        },
    }


def test_summary_ratio_when_cma_es_gets_there_and_bound_when_it_does_not(tmp_path, capsys):
    rows = evolution_table.summary([table([run(480), run(560), run(None)]), table([run(None)] * 3, env="Swimmer-v5")]).splitlines()
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


@pytest.mark.parametrize("option, make", [("--summarize", "summary"), ("--imagination", "imagination")])
def test_docs_tables_are_the_commands_output_on_the_shipped_reports(option, make):
    doc = (ROOT / "docs" / "EVOLUTION.md").read_text()
    command = next(b for b in doc.split("```") if option in b)
    files = re.findall(r"docs/evolution/[\w.-]+\.json", command)
    assert files, f"the {option} command names no report"
    expected = getattr(evolution_table, make)([json.loads((ROOT / f).read_text()) for f in files]).splitlines()
    lines = doc.splitlines()
    start = lines.index(expected[0])  # the table's header row
    assert lines[start : start + len(expected)] == expected, f"docs/EVOLUTION.md's table is not the {option} output; rerun it"


def test_learn_termination_refuses_a_task_that_never_terminates(capsys):
    with pytest.raises(SystemExit) as exc:
        evolution_table.main(["--env", "Pendulum-v1", "--learn-termination"])
    assert exc.value.code == 2 and "never terminates" in capsys.readouterr().err


def _tiny(out, *modes):
    return ["--seeds", "0", "--budget", "16", "--cma-long-budget", "0", "--precision-steps", "0", "--out", str(out), "--modes", *modes]


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
    assert "| plain CMA-ES (same budget) |" in report["markdown"] and "| same loop, world model off |" in report["markdown"]
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
    gens = [{"evaluated": [{"id": f"c{i}", "imagined": a, "real_return": b} for i, (a, b) in enumerate(zip(imagined, real))]}]
    gens.append({"evaluated": [{"id": "g0", "imagined": None, "real_return": -1000.0}]})  # generation 0: random, never ranked
    t["runs"]["full"] = [{**run(40), "generations": gens}]
    return t


def test_imagination_rank_correlation_of_the_evaluated_candidates(capsys, tmp_path):
    agree = _with_ranked([1.0, 2.0, 3.0, 40.0], [-5.0, -4.0, 0.0, 7.0])
    reverse = _with_ranked([1.0, 2.0, 3.0, 40.0], [7.0, 0.0, -4.0, -5.0])
    too_few = _with_ranked([1.0, 2.0], [3.0, 4.0])
    rows = evolution_table.imagination([agree, reverse, too_few]).splitlines()
    assert rows[2] == "| Pendulum-v1 (-300) | 4 | 2.5 | -2.0 | 1.00 |"
    assert rows[3].endswith("| 4 | 2.5 | -2.0 | -1.00 |")
    assert rows[4].endswith("| 2 | - | - | - |")
    path = tmp_path / "t.json"
    path.write_text(json.dumps(agree))
    assert evolution_table.main(["--imagination", str(path)]) == 0
    assert "| 1.00 |" in capsys.readouterr().out


def test_plot_of_one_shipped_report(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "pendulum.png"
    assert evolution_table.main(["--summarize", str(ROOT / "docs" / "evolution" / "pendulum.json"), "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert "Pendulum-v1 (-300)" in capsys.readouterr().out  # the summary is still printed


def test_plot_refuses_several_reports(tmp_path, capsys):
    reports = [str(ROOT / "docs" / "evolution" / name) for name in ("pendulum.json", "swimmer.json")]
    with pytest.raises(SystemExit) as info:
        evolution_table.main(["--summarize", *reports, "--plot", str(tmp_path / "x.png")])
    assert info.value.code == 2 and "--plot draws one report; got 2" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()

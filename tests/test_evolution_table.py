"""scripts/evolution_table.py --summarize: the cross-task row the docs quote."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

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

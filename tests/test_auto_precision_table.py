"""scripts/auto_precision_table.py (the table of docs/PERFORMANCE.md, "auto by measurement") on a tiny budget: a row
per workload with
each precision's speed at length, auto's picks and their cost."""

from __future__ import annotations

import json

import pytest
from scripts_loader import load_script


def _load():
    return load_script("auto_precision_table")


def test_the_table_has_a_row_per_workload(tmp_path, capsys):
    table = _load()
    out = tmp_path / "auto.json"
    assert (
        table.main(
            ["--workloads", "S,world_model", "--repeats", "2", "--rounds", "1", "--seconds", "0.05", "--json", str(out)]
        )
        == 0
    )
    data = json.loads(out.read_text())
    assert [r["workload"] for r in data["rows"]] == ["S", "world_model"]
    for row in data["rows"]:
        assert (
            set(row["speed_vs_fp32"]) | set(row["could_not_run"]) == {"fp32", "bf16", "fp16"}
            and row["speed_vs_fp32"]["fp32"] == 1.0
        )
        assert len(row["auto_picks"]) == 2 and set(row["auto_picks"]) <= {"fp32", "bf16", "fp16"}
        assert row["fastest_passing"] in row["speed_vs_fp32"] and row["auto_vs_fastest_min"] > 0
        assert all(c > 0 for c in row["calibration_s"])
    assert "| world_model |" in capsys.readouterr().out
    assert table.main(["--render", str(out)]) == 0  # the table again, from the JSON
    assert "| S |" in capsys.readouterr().out


def test_unknown_workloads_are_refused():
    with pytest.raises(SystemExit):
        _load().main(["--workloads", "XL"])

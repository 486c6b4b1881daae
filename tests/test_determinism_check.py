"""scripts/determinism_check.py: what it compares between two runs of one
seed (everything but timings and ids), and that it names where they differ."""

from __future__ import annotations

from scripts_loader import load_script

check = load_script("determinism_check")


def test_timings_and_ids_are_left_out_and_everything_else_is_compared():
    a = {"run_id": "a", "wall_s": 1.0, "heldout_return": -200.0, "precision": "bf16",
         "generations": [{"generation": 0, "elapsed_s": 3.0, "wm_val_loss": 0.1}], "time_share": {"model": 0.5}}
    b = {"run_id": "b", "wall_s": 9.0, "heldout_return": -200.0, "precision": "bf16",
         "generations": [{"generation": 0, "elapsed_s": 7.0, "wm_val_loss": 0.1}], "time_share": {"model": 0.7}}
    assert check.differences(check.comparable(a), check.comparable(b)) == []

    c = dict(b, precision="fp32", generations=[{"generation": 0, "elapsed_s": 7.0, "wm_val_loss": 0.2}])
    assert check.differences(check.comparable(a), check.comparable(c)) == ["generations[0].wm_val_loss", "precision"]


def test_lists_of_other_lengths_differ_as_a_whole():
    assert check.differences({"g": [1, 2]}, {"g": [1]}) == ["g"]

"""The words the evolve report uses for where a return was measured and why
a run stopped."""

from __future__ import annotations

from agents.evolve_report import return_set, stop_detail


def test_return_set_names_probe_and_full():
    assert return_set(False, 1) == "probe: 1 episode on 1 start state"
    assert return_set(True, 16) == "full: 16 training start states"
    assert return_set(True, 16, train_start_states=16) == "full: 16 training start states"


def test_stop_detail_says_which_set_the_target_was_reached_on():
    report = {"stop_reason": "target", "train_start_states": 16, "train_return": -250.04, "target": -300.0,
              "episodes_to_target": 56, "real_episodes": 56, "budget": 200}
    assert stop_detail(report) == "target reached on the 16 training start states: mean return -250.0 >= -300 after 56 real episodes"
    report.update(stop_reason="budget", train_return=-400.0, episodes_to_target=None, real_episodes=192)
    assert stop_detail(report) == ("budget spent: 192 of 200 real episodes used, and another full evaluation needs 16; "
                                   "target -300 not reached on the training start states")


def test_stop_detail_of_a_run_whose_every_candidate_failed():
    report = {"stop_reason": "failed", "train_start_states": 2, "train_return": None, "target": 0.0, "episodes_to_target": None,
              "real_episodes": 8, "budget": 8, "failed_candidates": [{"error": "env 'X' returned a non-finite reward (nan)"}] * 3}
    assert stop_detail(report) == ("every candidate failed: 3 real evaluation(s), 8 of 8 real episodes charged, none gave a usable "
                                   "return; the first error: env 'X' returned a non-finite reward (nan)")

"""The words the evolve report uses for why a run stopped, the run's mode,
and the rows of the final table."""

from __future__ import annotations

from agents.evolve_config import EvolveConfig
from agents.evolve_report import mode_of, report_rows, stop_detail


def test_stop_detail_says_which_set_the_target_was_reached_on():
    report = {
        "stop_reason": "target",
        "train_start_states": 16,
        "train_return": -250.04,
        "target": -300.0,
        "episodes_to_target": 56,
        "real_episodes": 56,
        "budget": 200,
    }
    assert (
        stop_detail(report)
        == "target reached on all 16 training start states: mean return -250.0 >= -300 after 56 real episodes"
    )
    report.update(validation_return=-260.0, validation_start_states=8)
    assert stop_detail(report) == (
        "target reached on all 16 training start states: mean return -250.0 >= -300, confirmed on all "
        "8 validation start states (mean -260.0), after 56 real episodes"
    )
    # accepted by the sequential test on fewer states: says how many ran, and that the bound is over all of them
    report.update(train_states_run=9, confirmations=[{"confirmed": True, "episodes": 4}])
    assert stop_detail(report) == (
        "target reached on 9 of the 16 training start states (the sequential test's bound on the mean "
        "over all of them): mean return -250.0 >= -300, confirmed on 4 of the 8 validation start states "
        "(mean -260.0), after 56 real episodes"
    )
    report.update(
        stop_reason="budget",
        train_return=-400.0,
        episodes_to_target=None,
        real_episodes=192,
        validation_return=None,
        confirmations=[],
    )
    assert stop_detail(report) == (
        "budget spent: 192 of 200 real episodes used, and the 8 left are too few for what comes next; "
        "target -300 not reached on the training start states"
    )
    report.update(real_episodes=200)
    assert stop_detail(report).startswith("budget spent: 200 of 200 real episodes used, and none is left; ")


def test_stop_detail_of_a_budget_of_env_steps_unconfirmed_and_refuted():
    report = {
        "stop_reason": "budget",
        "budget_exhausted": "env_steps",
        "train_start_states": 16,
        "validation_start_states": 8,
        "train_return": None,
        "target": -300.0,
        "episodes_to_target": None,
        "real_episodes": 15,
        "budget": 200,
        "env_steps": 3000,
        "budget_steps": 3100,
        "config": {"episode_steps": 200},
    }
    assert stop_detail(report) == (
        "budget spent: 3000 of 3100 real env steps used (15 real episodes), and the 100 left are too few "
        "for another episode, which may run 200 steps; target -300 not reached on the training start states"
    )
    # issue 44: InvertedPendulum-v5 stopped at 2,059 of 3,000 steps saying only "budget spent"; a failed episode counts
    # at its longest
    report.update(env_steps=2059, budget_steps=3000, config={"episode_steps": 1000})
    assert (
        "2059 of 3000 real env steps used (15 real episodes), and the 941 left are too few for another episode, which "
        "may run "
        "1000 steps" in stop_detail(report)
    )
    report.update(env_steps=1000, failed_candidates=[{"episodes": 1, "error": "x"}])
    assert "2000 of 3000 real env steps used (15 real episodes), and 1000 are left" in stop_detail(report)
    report.update(env_steps=3000, budget_steps=3100, config={"episode_steps": 200}, failed_candidates=[])
    report.update(unconfirmed="g3-2-cma")
    assert stop_detail(report) == (
        "budget spent: 3000 of 3100 real env steps used (15 real episodes); g3-2-cma met the target -300 "
        "on the training start states, but the budget has no room to confirm it on the 8 validation start states"
    )
    report.update(unconfirmed=None, confirmations=[{"confirmed": False}, {"confirmed": False}])
    assert stop_detail(report).endswith(
        "target -300 met on the training start states but not confirmed on the 8 validation start states (2 tries)"
    )


def test_stop_detail_of_a_run_whose_every_candidate_failed():
    report = {
        "stop_reason": "failed",
        "train_start_states": 2,
        "train_return": None,
        "target": 0.0,
        "episodes_to_target": None,
        "real_episodes": 8,
        "budget": 8,
        "failed_candidates": [{"error": "env 'X' returned a non-finite reward (nan)"}] * 3,
    }
    assert stop_detail(report) == (
        "every candidate failed: 3 real evaluation(s), 8 of 8 real episodes charged, none gave a usable "
        "return; the first error: env 'X' returned a non-finite reward (nan)"
    )


def test_mode_of_names_the_method():
    assert mode_of(EvolveConfig()) == "loop"
    assert mode_of(EvolveConfig(use_world_model=False)) == "no_model"
    assert mode_of(EvolveConfig(use_critic=False, refine_horizon=3)) == "no_critic"
    assert mode_of(EvolveConfig(use_critic=False)) == "cma"  # nothing can refine
    assert mode_of(EvolveConfig(refined=0)) == "cma"
    assert mode_of(EvolveConfig(use_critic=False, use_world_model=False, refined=0)) == "cma"


def _report(**kw):
    report = {
        "stop_reason": "budget",
        "budget_exhausted": "episodes",
        "train_start_states": 16,
        "validation_start_states": 8,
        "heldout_episodes": 20,
        "train_return": -400.0,
        "validation_return": None,
        "heldout_return": -410.5,
        "target": -300.0,
        "target_reached": False,
        "episodes_to_target": None,
        "real_episodes": 24,
        "budget": 24,
        "env_steps": 4800,
        "budget_steps": None,
        "best_candidate": {"id": "g3-mean", "operator": "cma_mean", "params": [0.0]},
        "learners": {
            "world_model": {
                "agent": "world_model.Pendulum-v1",
                "precision": "bf16",
                "decision": {"source": "rule", "reason": "the CPU has avx512_bf16"},
            },
            "critic": {"agent": "critic.Pendulum-v1", "precision": "fp32", "decision": None},
        },
        "generations": [{}] * 4,
        "wall_s": 12.34,
        "time_share": {"model_train": 3.0, "critic": 1.5, "real_episodes": 2.0},
        "failed_candidates": [],
        "replay_db": "/state/replay.sqlite",
        "run_id": "seed0-x",
        "resumed": False,
        "resumed_from": None,
        "config": {"episode_steps": 200},
    }
    report.update(kw)
    report["stop_detail"] = stop_detail(report)
    return report


def test_report_rows_of_the_final_table():
    rows = dict(report_rows(_report()))
    assert rows["stopped"].startswith("budget spent: 24 of 24 real episodes used")
    assert rows["target reached"] == "False (target -300: mean return on the 16 training start states)"
    assert (
        rows["real episodes"] == "24 of 24" and rows["real env steps"] == "4800" and rows["episodes to target"] == "-"
    )
    assert rows["best return, full (16 training start states)"] == "-400.0"
    assert rows["best return, validation (8 validation start states)"] == "-"
    assert rows["best return, held-out (20 held-out start states)"] == "-410.5"
    assert rows["answer"] == "cma_mean"
    assert rows["world model precision"] == "bf16 (world_model.Pendulum-v1) (rule: the CPU has avx512_bf16)"
    assert rows["critic precision"] == "fp32 (critic.Pendulum-v1)"
    assert rows["generations"] == "4" and rows["wall time (s)"] == "12.3"
    assert rows["wall time"] == "model train 3.0 s, critic 1.5 s, real episodes 2.0 s"  # empty buckets left out
    assert rows["replay buffer"] == "/state/replay.sqlite" and rows["run"] == "seed0-x"
    assert "failed candidates" not in rows and "resumed after" not in rows


def test_report_rows_of_a_resumed_run_with_failures_and_a_step_budget():
    failures = [
        {"candidate": "g1-0-cma", "generation": 1, "episodes": 1, "error": "boom"},
        {"candidate": "g1-3-cma", "generation": 1, "episodes": 1, "error": "bang"},
    ]
    rows = dict(
        report_rows(
            _report(
                budget_steps=6000,
                failed_candidates=failures,
                resumed=True,
                resumed_from={"generation": 1, "real_episodes": 12},
                target_reached=True,
                heldout_return=-350.0,
            )
        )
    )
    assert rows["real env steps"] == "4800 of 6000"
    assert rows["failed candidates"] == "2 (charged 2 real episodes)"
    assert rows["skipped g1-0-cma"] == "boom" and rows["skipped g1-3-cma"] == "bang"
    assert rows["resumed after"] == "generation 1, 12 real episodes"
    assert rows["best return, held-out (20 held-out start states)"].startswith("-350.0 (below the target")


def test_a_generation_failed_alike_is_one_sentence_with_the_fix():
    """Issue 54: every candidate of generation 0 failed with the same error (an env whose reset returns None): the
    run stopped there, and its sentence says the error once, the fix, and what was spent."""
    error = "real evaluation of 1 episodes failed: env 'T' reset returned None: a gymnasium env's reset must return"
    failures = [{"candidate": f"g0-{k}-cma", "generation": 0, "episodes": 1, "error": error} for k in range(3)]
    report = _report(
        stop_reason="failed",
        budget=80,
        real_episodes=3,
        failed_candidates=failures,
        generations=[{"generation": 0, "candidates": [{"id": f["candidate"]} for f in failures]}],
    )
    assert report["stop_detail"] == (
        "every candidate of generation 0 failed with the same error: env 'T' reset returned None: a gymnasium env's "
        "reset must return; fix the env as the error says, then start a new run (3 of 80 real episodes charged, the "
        "rest not spent)"
    )
    rows = dict(report_rows(report))
    assert rows["failed candidates"] == "3 (charged 3 real episodes)"
    assert rows["skipped g0-0-cma and 2 more"] == error and not any(k.startswith("skipped g0-1") for k in rows)


def test_same_error_is_read_with_its_numbers_aside():
    from agents.fail_fast import common_error, fix_for, normalised

    assert normalised("action 0.53 at step 4 of episode 1e-3") == "action # at step # of episode #"
    step = [
        {"candidate": "a", "error": "env 'X' raised in step: actuator limit: action 0.53"},
        {"candidate": "b", "error": "env 'X' raised in step: actuator limit: action 0.91"},
    ]
    assert common_error(step, ["a", "b"]) == step[0]["error"]
    assert common_error(step, ["a"]) is None  # one failure says little
    assert common_error(step, ["a", "b", "c"]) is None  # c did not fail
    assert common_error([*step[:1], {"candidate": "b", "error": "env 'X' raised in reset: x"}], ["a", "b"]) is None
    assert "step(action)" in fix_for(step[0]["error"]) and "reset(seed=...)" in fix_for("raised in reset: OSError")
    assert "can be made" in fix_for("env 'X' raised in make: ImportError") and "new run" in fix_for("anything")


def test_rows_say_a_learner_never_built_and_name_start_up_in_the_split():
    learners = {
        "world_model": {"agent": "world_model.M", "precision": None, "decision": None, "trained": False},
        "critic": {"agent": "critic.M", "precision": "fp32", "decision": None, "trained": True},
    }
    share = {"start_up": 4.5, "model_train": 0.0, "critic": 1.5, "real_episodes": 2.0, "other": 0.5}
    rows = dict(report_rows(_report(learners=learners, time_share=share)))
    assert rows["world model precision"] == (
        "- (world_model.M): never trained, so never built nor its precision decided"
    )
    assert rows["critic precision"] == "fp32 (critic.M)"
    assert rows["wall time"] == "start up 4.5 s, critic 1.5 s, real episodes 2.0 s, other 0.5 s"


def test_a_run_resumed_before_its_first_generation_says_so_in_words():
    rows = dict(report_rows(_report(resumed=True, resumed_from={"generation": -1, "real_episodes": 0})))
    assert rows["resumed"] == "before its first generation was committed (it began again at generation 0)"
    assert "resumed after" not in rows

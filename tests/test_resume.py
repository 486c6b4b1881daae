"""`evolve --resume`: an interrupted run continues from its manifest, replay
data and world-model snapshot; the episodes it spent count against the
budget; a cut-off generation runs again; unknown, finished, running and
mismatched runs are clear errors."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from agents import evaluation, pendulum_task
from agents.evaluation import Evaluation, Evaluator
from agents.evolve_config import resumed_config
from agents.evolve_report import report_rows
from agents.runs import MANIFEST_VERSION, RunError, RunLock, manifest_path, read_manifest
from agents.se_darwin_agent import EvolveConfig, SEDarwinAgent
from genesis_fp16.cli import app
from genesis_fp16.base.errors import CheckpointError
from genesis_fp16.base.settings import load_settings
from infrastructure.replay_buffer import ReplayBuffer
from infrastructure.world_model import WorldModel

import loop_fakes

pytestmark = pytest.mark.usefixtures("one_thread")

# wall times, and the run's identity, are all that may differ between an
# interrupted-and-resumed run and an uninterrupted one
VOLATILE = {*loop_fakes.RUN_SPECIFIC, *loop_fakes.RESUMED}
VOLATILE_GENERATION = set(loop_fakes.RUN_SPECIFIC_GENERATION)


class InProcessEvaluator(Evaluator):
    """Real episodes in this process: the same returns as the worker pool,
    without its start-up time."""

    def evaluate_many(self, jobs, **kw):
        out = []
        for params, states in jobs:
            res = pendulum_task.run_episodes([float(v) for v in params], [list(map(float, s)) for s in states])
            out.append(Evaluation(returns=res["returns"], episodes=res["episodes"]))
        return out


class InterruptOnEvaluation(InProcessEvaluator):
    """KeyboardInterrupt at the n-th population (one episode per candidate),
    or at the held-out evaluation (20 states)."""

    def __init__(self, *, population: int = 0, heldout: bool = False) -> None:
        super().__init__(workers=1)
        self.population, self.heldout, self.seen = population, heldout, 0

    def evaluate_many(self, jobs, **kw):
        if len(jobs) > 1:
            self.seen += 1
            if self.seen == self.population:
                raise KeyboardInterrupt
        if len(jobs[0][1]) == pendulum_task.N_HELDOUT_STARTS and self.heldout:
            raise KeyboardInterrupt
        return super().evaluate_many(jobs, **kw)


# generations of 6 candidates, one real episode each; the world model and the critic train
# (no model rollouts: they are tested with the model env); a target no policy meets
LOOP = dict(
    popsize=6,
    wm_steps=30,
    ensemble=2,
    refine_steps=4,
    critic_updates=0.02,
    model_rollouts=0,
    target=-1.0,
    workers=1,
    eval_timeout_s=60,
)


def config(**kw) -> EvolveConfig:
    return EvolveConfig(**{"budget": 24, **LOOP, **kw})


def interrupt_after(generation: int):
    def on_generation(record):
        if record["generation"] == generation:
            raise KeyboardInterrupt

    return on_generation


def rows_per_generation(settings, data_agent: str) -> dict[int, int]:
    out: dict[int, int] = {}
    for traj in ReplayBuffer(settings=settings).sample(data_agent):
        out[traj.generation] = out.get(traj.generation, 0) + 1
    return out


def comparable(report: dict) -> dict:
    data = {k: v for k, v in report.items() if k not in VOLATILE}
    data["generations"] = [{k: v for k, v in g.items() if k not in VOLATILE_GENERATION} for g in report["generations"]]
    return data


async def test_resume_after_a_generation_gives_the_uninterrupted_result(tmp_path):
    whole = load_settings(state_dir=tmp_path / "whole")
    expected = await SEDarwinAgent(config(), settings=whole, evaluator=InProcessEvaluator(workers=1)).evolve()

    settings = load_settings(state_dir=tmp_path / "cut")
    first = SEDarwinAgent(
        config(), settings=settings, evaluator=InProcessEvaluator(workers=1), on_generation=interrupt_after(1)
    )
    with pytest.raises(KeyboardInterrupt):
        await first.evolve()
    manifest = read_manifest(settings.state_dir, first.run_id)
    # generation 1: 2 refined candidates beside CMA-ES's 6 (the population's own samples are what candidates_run counts)
    assert manifest["status"] == "interrupted" and manifest["generation"] == 1 and manifest["real_episodes"] == 14
    assert manifest["version"] == MANIFEST_VERSION and manifest["state"]["candidates_run"] == 12
    assert len(manifest["search"]["told"]) == 2 and manifest["obs_stats"]["count"] == 12 * pendulum_task.EPISODE_STEPS
    assert (
        manifest["world_model_checkpoint"] == "world_model-g0001.pt"
        and manifest["critic_checkpoint"] == "critic-g0001.pt"
    )

    agent = SEDarwinAgent.resume(first.run_id, settings=settings, evaluator=InProcessEvaluator(workers=1))
    report = await agent.evolve()
    assert report["resumed"] is True and report["run_id"] == first.run_id
    assert report["resumed_from"] == {"generation": 1, "real_episodes": 14, "discarded_trajectories": 0, "session": 2}
    assert report["real_episodes"] == 24 == expected["real_episodes"]  # the 14 spent before count against the budget
    assert [g["generation"] for g in report["generations"]] == [g["generation"] for g in expected["generations"]]
    episodes = {g["generation"]: sum(c["episodes"] for c in g["candidates"]) for g in expected["generations"]}
    assert rows_per_generation(settings, first.data_agent) == episodes and episodes[0] == 6  # nothing evaluated twice
    # the refined pair beside CMA-ES's 6 in generation 1; later ones as the records decide (the resumed session's alike)
    assert [c["operator"] for c in report["generations"][1]["candidates"]][:2] == ["refined:actor", "refined:mean:4"]
    assert comparable(report) == comparable(expected)
    assert expected["resumed"] is False and expected["resumed_from"] is None
    done = read_manifest(settings.state_dir, first.run_id)
    assert done["status"] == "finished" and len(done["sessions"]) == 2 and done["report"]["real_episodes"] == 24


class CommitThenInterrupt(ReplayBuffer):
    """Commits generation ``at``'s rows, then is interrupted before the
    generation is recorded as committed in the run manifest."""

    at = 2

    async def aappend_generation(self, agent, generation, trajectories):
        ids = await super().aappend_generation(agent, generation, trajectories)
        if generation == self.at:
            raise KeyboardInterrupt
        return ids


async def test_a_cut_off_generation_runs_again(state_dir):
    settings = load_settings()
    first = SEDarwinAgent(
        config(),
        settings=settings,
        buffer=CommitThenInterrupt(settings=settings),
        evaluator=InProcessEvaluator(workers=1),
    )
    with pytest.raises(KeyboardInterrupt):
        await first.evolve()
    cut = rows_per_generation(settings, first.data_agent)
    assert cut[0] == 6 and cut[1] == 8 and set(cut) == {0, 1, 2}  # generation 2's rows are in, uncommitted
    assert read_manifest(state_dir, first.run_id)["generation"] == 1

    agent = SEDarwinAgent.resume(first.run_id, settings=settings, evaluator=InProcessEvaluator(workers=1))
    assert agent.resumed_from["discarded_trajectories"] == cut[2]
    report = await agent.evolve()
    assert report["real_episodes"] == 24  # the cut-off generation's episodes are not charged twice
    rows = rows_per_generation(settings, first.data_agent)
    assert (
        sum(rows.values()) == 24 and rows[0] == 6 and rows[1] == 8 and rows[2] == cut[2]
    )  # generation 2 ran again, alike


async def test_resume_may_raise_the_budget(state_dir):
    settings = load_settings()
    first = SEDarwinAgent(config(budget=12), settings=settings, evaluator=InterruptOnEvaluation(heldout=True))
    with pytest.raises(KeyboardInterrupt):  # the loop spent its 12 episodes; the held-out evaluation is cut off
        await first.evolve()
    with pytest.raises(RunError, match="budget=6: .* already spent 12 real episodes"):
        SEDarwinAgent.resume(first.run_id, settings=settings, budget=6)
    report = await SEDarwinAgent.resume(
        first.run_id, settings=settings, budget=24, evaluator=InProcessEvaluator(workers=1)
    ).evolve()
    assert report["budget"] == 24 and report["real_episodes"] == 24 and report["resumed"]
    assert [g["generation"] for g in report["generations"]] == list(range(len(report["generations"]))) and len(
        report["generations"]
    ) >= 3


async def test_a_run_that_failed_is_recorded_and_resumable(state_dir):
    class SeedFails(InProcessEvaluator):
        def evaluate_many(self, jobs, **kw):
            raise RuntimeError("worker pool broke")

    settings = load_settings()
    first = SEDarwinAgent(config(budget=12), settings=settings, evaluator=SeedFails(workers=1))
    with pytest.raises(RuntimeError):
        await first.evolve()
    manifest = read_manifest(state_dir, first.run_id)
    assert (
        manifest["status"] == "interrupted"
        and "worker pool broke" in manifest["error"]
        and manifest["generation"] == -1
    )
    report = await SEDarwinAgent.resume(
        first.run_id, settings=settings, evaluator=InProcessEvaluator(workers=1)
    ).evolve()
    assert report["real_episodes"] == 12 and report["resumed_from"]["generation"] == -1
    # issue 54: the table said "resumed after generation -1"
    rows = dict(report_rows(report))
    assert rows["resumed"] == "before its first generation was committed (it began again at generation 0)"
    assert "resumed after" not in rows


def test_unknown_run_is_one_clear_error(state_dir):
    with pytest.raises(RunError, match=r"no run 'seed0-nope' in .*runs; `genesis-fp16 state list` lists the runs"):
        SEDarwinAgent.resume("seed0-nope", settings=load_settings())
    with pytest.raises(RunError, match="letters, digits"):
        SEDarwinAgent.resume("../../etc", settings=load_settings())
    assert not (state_dir / "runs").exists()  # looking up an unknown id creates nothing


async def test_finished_run_is_not_run_again(state_dir):
    settings = load_settings()
    agent = SEDarwinAgent(config(budget=12), settings=settings, evaluator=InProcessEvaluator(workers=1))
    await agent.evolve()
    before = ReplayBuffer(settings=settings).count(agent.data_agent)
    with pytest.raises(RunError, match=f"run '{agent.run_id}' already finished .*real_episodes 12.*nothing to resume"):
        SEDarwinAgent.resume(agent.run_id, settings=settings)
    assert ReplayBuffer(settings=settings).count(agent.data_agent) == before


async def test_other_options_and_a_running_run_are_refused(state_dir):
    settings = load_settings()
    first = SEDarwinAgent(
        config(), settings=settings, evaluator=InProcessEvaluator(workers=1), on_generation=interrupt_after(0)
    )
    with pytest.raises(KeyboardInterrupt):
        await first.evolve()
    with pytest.raises(RunError, match=r"seed=3 \(the run has 0\).*precision='bf16' \(the run has None\)"):
        SEDarwinAgent.resume(
            first.run_id, settings=settings, options={"seed": 3, "precision": "bf16", "env_id": "Pendulum-v1"}
        )
    holder = RunLock(state_dir, first.run_id)  # another process running it
    assert holder.acquire()
    try:
        with pytest.raises(RunError, match="is running"):
            SEDarwinAgent.resume(first.run_id, settings=settings)
    finally:
        holder.release()
    SEDarwinAgent.resume(first.run_id, settings=settings, options={"seed": 0}).recorder.lock.release()


async def test_world_model_snapshot_keeps_the_batch_sampler(tmp_path):
    rng = np.random.default_rng(0)
    trajs = [
        pendulum_task.run_episodes(pendulum_task.random_params(rng, 1)[0], [[0.5, 0.0]], steps=40)["episodes"][0]
        for _ in range(2)
    ]
    from infrastructure.replay_buffer import trajectories_from_episodes

    data = trajectories_from_episodes(trajs, "c")
    wm = WorldModel(3, 1, precision="fp32", checkpoint_dir=tmp_path, settings=load_settings(state_dir=tmp_path))
    await wm.train(20, trajectories=data)
    other = WorldModel(3, 1, precision="fp32", checkpoint_dir=tmp_path, settings=load_settings(state_dir=tmp_path))
    other.load()
    await wm.train(20, trajectories=data, save=False)
    await other.train(20, trajectories=data, save=False)
    for a, b in zip(wm.model.parameters(), other.model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # the same batches, so the same weights


def test_cli_resume_end_to_end(monkeypatch, tmp_path, state_dir):
    runner = CliRunner()
    # batches: generation 0's population, generation 1's refined pair and population, generation 2's population
    monkeypatch.setattr(evaluation, "Evaluator", lambda *a, **kw: InterruptOnEvaluation(population=4))
    flags = [
        "--budget",
        "24",
        "--workers",
        "1",
        "--popsize",
        "6",
        "--wm-steps",
        "30",
        "--ensemble",
        "2",
        "--refine-steps",
        "4",
        "--critic-updates",
        "0.02",
        "--model-rollouts",
        "0",
        "--target",
        "-1",
    ]
    cut = runner.invoke(app, ["evolve", *flags])  # interrupted in generation 2
    assert cut.exit_code == 130, cut.output
    (run_id,) = [p.name for p in (state_dir / "runs").iterdir()]
    assert f"genesis-fp16 evolve --resume {run_id}" in cut.output

    refused = runner.invoke(app, ["evolve", "--resume", run_id, "--seed", "5"])
    assert refused.exit_code == 2 and "seed=5 (the run has 0)" in refused.output

    monkeypatch.setattr(evaluation, "Evaluator", lambda *a, **kw: InProcessEvaluator(workers=1))
    out = tmp_path / "report.json"
    result = runner.invoke(app, ["evolve", "--resume", run_id, "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["resumed"] is True and report["resumed_from"]["generation"] == 1 and report["real_episodes"] == 24
    assert "resumed after" in result.output and "generation 1, 14 real episodes" in result.output
    again = runner.invoke(app, ["evolve", "--resume", run_id])
    assert again.exit_code == 2 and "already finished" in again.output and "Traceback" not in again.output
    assert json.loads(manifest_path(state_dir, run_id).read_text())["status"] == "finished"


async def test_a_run_whose_data_is_gone_or_unreadable_is_one_clear_error(state_dir):
    settings = load_settings()
    first = SEDarwinAgent(
        config(), settings=settings, evaluator=InProcessEvaluator(workers=1), on_generation=interrupt_after(0)
    )
    with pytest.raises(KeyboardInterrupt):
        await first.evolve()
    ReplayBuffer(settings=settings).delete_agents([first.data_agent])
    with pytest.raises(RunError, match="its replay data is gone"):
        SEDarwinAgent.resume(first.run_id, settings=settings)
    manifest_path(state_dir, first.run_id).write_text("{not json")
    with pytest.raises(RunError, match="not valid JSON"):
        SEDarwinAgent.resume(first.run_id, settings=settings)
    manifest_path(state_dir, first.run_id).unlink()  # as a run from before manifests were kept
    with pytest.raises(RunError, match="no manifest .* cannot be resumed"):
        SEDarwinAgent.resume(first.run_id, settings=settings)


async def test_a_run_whose_every_candidate_failed_so_far_resumes(state_dir):
    """No replay data is what such a run has, not a sign that its data was pruned."""
    import task_envs

    from agents.tasks import Task

    task = Task(env_id="NaNDrift", env_factory=task_envs.nan_reward, target=0.0, n_train=2, n_heldout=2)
    settings = load_settings()
    first = SEDarwinAgent(
        config(budget=8, popsize=4, refined=2, target=0.0),
        task=task,
        settings=settings,
        on_generation=interrupt_after(0),
    )
    with pytest.raises(KeyboardInterrupt):
        await first.evolve()
    assert read_manifest(state_dir, first.run_id)["generation"] == 0
    report = await SEDarwinAgent.resume(first.run_id, task=task, settings=settings).evolve()
    assert (
        report["resumed_from"]["generation"] == 0 and report["stop_reason"] == "failed" and report["real_episodes"] == 8
    )
    assert sum(f["episodes"] for f in report["failed_candidates"]) == 8


def test_a_run_from_before_the_cma_loop_is_refused():
    saved = dataclasses.asdict(config())
    manifest = {
        "run_id": "r",
        "version": MANIFEST_VERSION - 1,
        "real_episodes": 8,
        "config": saved,
        "state": {},
        "search": {},
        "pool": [],
        "generations": [],
        "obs_stats": {},
        "time": {},
    }
    with pytest.raises(RunError, match=f"version {MANIFEST_VERSION - 1}.*cannot continue it"):
        resumed_config(manifest, budget=None, workers=None, options={})
    manifest["version"] = MANIFEST_VERSION
    assert resumed_config(manifest, budget=None, workers=None, options={}) == config()
    # a run from before learn_per_step trained the whole wm_steps / refine_steps a generation, and goes on so
    manifest["config"] = {k: v for k, v in saved.items() if k != "learn_per_step"}
    assert resumed_config(manifest, budget=None, workers=None, options={}) == dataclasses.replace(
        config(), learn_per_step=0.0
    )
    # and one from before `discount` learned at 0.99 whatever its task, and goes on so
    manifest["config"] = {k: v for k, v in saved.items() if k != "discount"}
    assert resumed_config(manifest, budget=None, workers=None, options={}) == dataclasses.replace(
        config(), discount=0.99
    )
    manifest["config"] = {**saved, "racing": True}  # an option this version does not know
    with pytest.raises(RunError, match=r"options this version does not know \(racing\)"):
        resumed_config(manifest, budget=None, workers=None, options={})


def _cli_main(argv, monkeypatch, capsys):
    """``genesis-fp16 ARGV`` through the CLI's own `main`, in this process: (exit code, stderr)."""
    from genesis_fp16.cli import main

    monkeypatch.setenv("COLUMNS", "300")
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    return exit_.value.code, capsys.readouterr().err


@pytest.mark.parametrize(
    "edit, field, expected",
    [  # issue 44's edits first
        (lambda m: m["config"].update(seed=1.5), "config.seed: 1.5", "expected a whole number in 0..4294967295"),
        (lambda m: m["obs_stats"].update(count=-1), "obs_stats.count: -1", "expected a whole number >= 0"),
        (lambda m: m.update(pool=[{"x": 1}]), "pool[0].id: missing", "expected a string"),
        (lambda m: m.update(real_episodes=-5), "real_episodes: -5", "expected a whole number >= 0"),
        (
            lambda m: m["pool"][0].update(x=1),
            "pool[0].x: 1",
            "expected no such field (the fields are id, params, operator",
        ),
        (
            lambda m: m["pool"][1].update(params=m["pool"][1]["params"][:3]),
            "pool[1].params",
            "expected 41 numbers, one per policy parameter",
        ),
        (lambda m: m["pool"][0].update(generation="0"), 'pool[0].generation: "0"', "expected a whole number >= 0"),
        (
            lambda m: m.update(obs_stats={"count": 5, "mean": [0.0, 1.0], "m2": [1.0, 1.0]}),
            "obs_stats.mean: [0.0, 1.0]",
            "2 do not fit the mlp:8 policy's 41 parameters",
        ),
        (
            lambda m: m["obs_stats"].update(m2=[-1.0, 0.0, 0.0]),
            "obs_stats.m2",
            "expected a list of finite numbers >= 0",
        ),
        (lambda m: m["config"].update(ensemble=100000), "config.ensemble: 100000", "expected a whole number in 1..64"),
        (
            lambda m: m["config"].update(use_critic=False),
            "config: invalid evolve options: refined=4: refinement needs the critic",
            "",
        ),
        (lambda m: m["state"].update(generation=None), "state.generation: null", "expected a whole number >= -1"),
        (lambda m: m["search"].update(sigma0="big"), 'search.sigma0: "big"', "expected a finite number > 0"),
        (
            lambda m: m.update(world_model_checkpoint="../../elsewhere.pt"),
            "world_model_checkpoint",
            "a file name in the run's world-model folder",
        ),
        (lambda m: m.pop("generations"), "generations: missing", "expected what this version writes in every manifest"),
        (lambda m: m.update(env_steps=2.5), "env_steps: 2.5", "expected a whole number >= 0"),
        # issue 52 (D7): a count past 64 bits was an OverflowError from the replay buffer
        (
            lambda m: m.update(generation=10**20),
            "generation: 100000000000000000000",
            "from -9007199254740991 to 9007199254740991",
        ),
        (lambda m: m["state"].update(candidates_run=-(2**63)), "state.candidates_run", "(2**53 - 1)"),
        (lambda m: m.update(started=1e300), "started: 1e+300", "a time in seconds since 1970, before the year 10000"),
    ],
)
def test_a_hand_edited_manifest_is_one_line_naming_the_file_and_the_field(
    edit, field, expected, edited_run, monkeypatch, capsys
):
    state_dir, run_id, original = edited_run
    path = manifest_path(state_dir, run_id)
    manifest = json.loads(original)
    edit(manifest)
    path.write_text(json.dumps(manifest))
    code, err = _cli_main(["evolve", "--resume", run_id], monkeypatch, capsys)
    assert code == 2, err
    assert err.startswith(f"error: {path}: field {field}") and err.count("\n") == 1, (
        err
    )  # one line, the file and the field first
    assert expected in err and "Traceback" not in err
    with pytest.raises(RunError, match="field"):
        SEDarwinAgent.resume(run_id, settings=load_settings())  # the Python API says the same


@pytest.fixture(scope="module")
def _one_interrupted_run(tmp_path_factory):
    """A run interrupted after generation 1, made once (as conftest isolates a test): (run id, its manifest's text)."""
    import asyncio

    state = tmp_path_factory.mktemp("edited_state")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("GENESIS_FP16_STATE_DIR", str(state))
        env.setenv("GENESIS_FP16_PRECISION_CACHE", str(state / "precision-cache.json"))
        env.setenv("GENESIS_FP16_DEVICE", "cpu")
        env.setenv("GENESIS_FP16_AUTO_PRECISION", "rule")
        agent = SEDarwinAgent(
            config(),
            settings=load_settings(),
            evaluator=InProcessEvaluator(workers=1),
            on_generation=interrupt_after(1),
        )
        with pytest.raises(KeyboardInterrupt):
            asyncio.run(agent.evolve())
    return agent.run_id, manifest_path(state, agent.run_id).read_text()


@pytest.fixture
def edited_run(_one_interrupted_run, state_dir):
    """That run's manifest in this test's state dir (a resume of an edited manifest stops before it reads anything
    else)."""
    run_id, original = _one_interrupted_run
    manifest_path(state_dir, run_id).parent.mkdir(parents=True)
    return state_dir, run_id, original


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "how, said",
    [
        ("fifo", "is a FIFO, expected a regular file"),
        ("dev_zero", "is a character device (a symlink to /dev/zero), expected a regular file"),
        ("deep", "is nested too deep to read (more than 32 levels)"),
        ("huge", "is larger than 128 MiB"),
    ],
)
def test_a_manifest_that_is_no_file_of_ours_is_one_line_on_resume(how, said, edited_run, monkeypatch, capsys):
    """Issue 52 (D2): a FIFO as run.json hung ``evolve --resume``, a link to /dev/zero read 23.5 GB, a deep array
    raised RecursionError. Each is one line naming the file, what it is and the fix, before anything is read."""
    import os

    from agents import runs

    state_dir, run_id, _ = edited_run
    path = manifest_path(state_dir, run_id)
    if how == "fifo":
        os.mkfifo(path)
    elif how == "dev_zero":
        path.symlink_to("/dev/zero")
    elif how == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
    else:
        monkeypatch.setattr(runs, "MANIFEST_MAX_BYTES", 10)  # a file past the limit, made small
        path.write_text("{}" * 10)
    code, err = _cli_main(["evolve", "--resume", run_id], monkeypatch, capsys)
    assert code == 2, err
    assert err.startswith(f"error: {path}: the run manifest {said.replace('128 MiB', '10 bytes')}; "), err
    assert err.count("\n") == 1 and "Traceback" not in err and "state prune" in err


def test_candidate_and_obs_stats_records_name_the_bad_field():
    from agents.evolve_config import Candidate
    from agents.search_space import ObsStats

    good = Candidate("c", np.zeros(3), "cma", 0).as_dict()
    assert Candidate.from_dict(good).id == "c"
    for bad, message in (
        ({"x": 1}, "field id: missing"),
        ({**good, "x": 1}, "field x: 1; expected no such field"),
        ({**good, "params": [1.0, "a"]}, "field params"),
        ({**good, "starts": [0], "returns": []}, "field returns"),
        ({**good, "full": 1}, "field full: 1; expected true or false"),
    ):
        with pytest.raises(RunError, match=message):
            Candidate.from_dict(bad)
    assert ObsStats.from_dict(2, {"count": 3, "mean": [0.0, 1.0], "m2": [1.0, 2.0]}).count == 3
    for bad, message in (
        ({"count": -1, "mean": [], "m2": []}, "field count: -1; expected a whole number >= 0"),
        ({"count": 1.5, "mean": [0.0, 0.0], "m2": [0.0, 0.0]}, "field count: 1.5"),
        ({"count": 3, "mean": [0.0], "m2": [0.0]}, "field mean: \\[0.0\\]; expected 2 values"),
        ({"count": 3, "mean": [0.0, 0.0]}, "field m2: missing"),
        ([], "expected an object with count, mean and m2"),
    ):
        with pytest.raises(RunError, match=message):
            ObsStats.from_dict(2, bad)


async def test_an_edited_search_record_is_one_clear_error(state_dir):
    settings = load_settings()
    first = SEDarwinAgent(
        config(), settings=settings, evaluator=InProcessEvaluator(workers=1), on_generation=interrupt_after(1)
    )
    with pytest.raises(KeyboardInterrupt):
        await first.evolve()
    path = manifest_path(state_dir, first.run_id)
    manifest = json.loads(path.read_text())
    manifest["search"]["told"][1]["x"][5][0] += 0.5  # a CMA-ES sample the seed does not draw
    path.write_text(json.dumps(manifest))
    with pytest.raises(RunError, match="generation 1 does not replay.*cannot be resumed"):
        SEDarwinAgent.resume(first.run_id, settings=settings)


async def test_a_full_disk_at_the_resume_snapshot_commits_nothing_of_that_generation(tmp_path, monkeypatch):
    """The disk fills while generation 1's world-model snapshot is written:
    the manifest keeps generation 0 with its one record (the generation and
    its record are committed as one unit), and the resume gives the
    uninterrupted report, each generation once."""
    from genesis_fp16.base import storage as checkpoint  # where the atomic writes live

    whole = load_settings(state_dir=tmp_path / "whole")
    expected = await SEDarwinAgent(config(), settings=whole, evaluator=InProcessEvaluator(workers=1)).evolve()

    original = checkpoint.atomic_write

    def no_space_for_g1(path, write):
        if str(path).endswith("world_model-g0001.pt"):
            raise OSError(28, "No space left on device", str(path))
        return original(path, write)

    monkeypatch.setattr(checkpoint, "atomic_write", no_space_for_g1)
    settings = load_settings(state_dir=tmp_path / "full")
    first = SEDarwinAgent(config(), settings=settings, evaluator=InProcessEvaluator(workers=1))
    with pytest.raises(CheckpointError):
        await first.evolve()
    manifest = read_manifest(settings.state_dir, first.run_id)
    assert manifest["generation"] == 0 and [g["generation"] for g in manifest["generations"]] == [0]
    assert first.committed() == (1, 6)

    monkeypatch.setattr(checkpoint, "atomic_write", original)  # space freed
    report = await SEDarwinAgent.resume(
        first.run_id, settings=settings, evaluator=InProcessEvaluator(workers=1)
    ).evolve()
    assert [g["generation"] for g in report["generations"]] == list(range(len(report["generations"]))) and len(
        report["generations"]
    ) >= 3
    assert comparable(report) == comparable(expected)


async def test_a_resumed_stretch_that_trains_no_model_reports_the_precision_the_model_trained_in(
    monkeypatch, state_dir
):
    # issue 37: the last resumed stretch trained no model and reported its placeholder trainer's fp32
    # where the model had trained in bf16 (auto measured; the timings are injected)
    from genesis_fp16.precision import calibration as cal
    from genesis_fp16.precision.measure import PrecisionCache

    monkeypatch.setenv("GENESIS_FP16_AUTO_PRECISION", "measure")
    timings = {"fp32": 1.0e-3, "bf16": 0.5e-3, "fp16": 5e-3}

    def fake_time_step(mode, run, steps, device):
        run()
        return timings[mode.value]

    monkeypatch.setattr(cal, "time_step", fake_time_step)
    settings = load_settings()
    first = SEDarwinAgent(config(budget=12), settings=settings, evaluator=InterruptOnEvaluation(heldout=True))
    with pytest.raises(KeyboardInterrupt):  # the loop trained its model; the held-out evaluation is cut off
        await first.evolve()
    trained = read_manifest(settings.state_dir, first.run_id)["generations"]
    assert {g["wm_precision"] for g in trained if g["wm_wall_s"] is not None} == {"bf16"}
    assert {g["critic_precision"] for g in trained if g["critic_wall_s"] is not None} == {"bf16"}
    assert trained[0]["wm_decision"]["source"] == "measured"
    # another process, another day: the host's cache is gone and fp32 would measure faster now
    PrecisionCache.from_settings(settings).clear()
    timings.update(bf16=2e-3)
    report = await SEDarwinAgent.resume(
        first.run_id, settings=settings, evaluator=InProcessEvaluator(workers=1)
    ).evolve()
    assert report["resumed"] and [g["generation"] for g in report["generations"]] == [g["generation"] for g in trained]
    for learner in ("world_model", "critic"):  # what the learner in use trained in, not what a trainer would run now
        assert report["learners"][learner]["precision"] == "bf16", (learner, report["learners"])
        assert (
            report["learners"][learner]["decision"]["precision"] == "bf16"
            and report["learners"][learner]["decision"]["source"] == "measured"
        )


def test_resume_after_kill_9_gives_the_uninterrupted_report(tmp_path):
    """`evolve` killed by SIGKILL mid-run (no handler runs): `--resume` continues after the last committed generation,
    and the report is the one of a run never interrupted."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from process_helpers import wait_until

    root = Path(__file__).resolve().parents[1]
    flags = [
        "--budget",
        "36",
        "--popsize",
        "6",
        "--wm-steps",
        "30",
        "--ensemble",
        "2",
        "--refine-steps",
        "4",
        "--critic-updates",
        "0.02",
        "--model-rollouts",
        "16",
        "--rollout-horizon",
        "2",
        "--target",
        "-1",
        "--workers",
        "1",
    ]

    def evolve(state: Path, *args: str, **popen: object) -> subprocess.Popen:
        env = {**os.environ, "GENESIS_FP16_STATE_DIR": str(state)}
        return subprocess.Popen(
            [sys.executable, "-m", "genesis_fp16.cli", "evolve", *args],
            cwd=root,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            **popen,
        )

    whole = evolve(tmp_path / "whole", *flags, "--json", str(tmp_path / "whole.json"))
    assert whole.wait(timeout=600) == 0, whole.stderr.read()
    cut = tmp_path / "cut"
    proc = evolve(cut, *flags)
    try:

        def committed() -> bool:
            manifests = list((cut / "runs").glob("*/run.json"))
            return bool(manifests) and json.loads(manifests[0].read_text()).get("generation", -1) >= 2

        assert wait_until(committed, 300), "generation 2 was never committed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    run_id = next((cut / "runs").glob("*/run.json")).parent.name
    resumed = evolve(cut, "--resume", run_id, "--json", str(tmp_path / "resumed.json"))
    assert resumed.wait(timeout=600) == 0, resumed.stderr.read()
    expected, report = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("whole", "resumed"))
    assert report["resumed"] is True and report["resumed_from"]["generation"] >= 2
    assert comparable(report) == comparable(expected)


async def test_a_resumed_run_trains_on_its_own_precision_decisions_and_never_measures_again(monkeypatch, state_dir):
    """Issue 44: the resume restored its learners outside the run's thread
    setting, missed the host cache and measured again (under load: FP32 after
    BF16, another run). The decisions are part of the run's state now: with
    the host cache gone and FP32 measuring faster, the resumed generations
    still train in the run's BF16, and nothing is measured."""
    from genesis_fp16.precision import calibration as cal
    from genesis_fp16.precision.measure import PrecisionCache

    monkeypatch.setenv("GENESIS_FP16_AUTO_PRECISION", "measure")
    timings = {"fp32": 1.0e-3, "bf16": 0.5e-3, "fp16": 5e-3}
    measured = []

    def fake_time_step(mode, run, steps, device):
        measured.append(mode.value)
        run()
        return timings[mode.value]

    monkeypatch.setattr(cal, "time_step", fake_time_step)
    from agents import se_darwin_agent

    monkeypatch.setattr(
        se_darwin_agent, "refined_count", lambda generations, most, episode_steps=None: most
    )  # refined every generation: the learners train
    settings = load_settings()
    first = SEDarwinAgent(
        config(), settings=settings, evaluator=InProcessEvaluator(workers=1), on_generation=interrupt_after(0)
    )
    with pytest.raises(KeyboardInterrupt):
        await first.evolve()
    manifest = read_manifest(settings.state_dir, first.run_id)
    assert {k: v["precision"] for k, v in manifest["decisions"].items()} == {
        "world_model_checkpoint": "bf16",
        "critic_checkpoint": "bf16",
    }
    PrecisionCache.from_settings(settings).clear()
    timings.update(bf16=2e-3)
    measured.clear()
    report = await SEDarwinAgent.resume(
        first.run_id, settings=settings, evaluator=InProcessEvaluator(workers=1)
    ).evolve()
    resumed = [g for g in report["generations"] if g["generation"] > 0]
    assert resumed and all(g["wm_precision"] == "bf16" == g["critic_precision"] for g in resumed), resumed
    assert all(g["wm_decision"] == report["generations"][0]["wm_decision"] for g in resumed)
    assert measured == []  # never measured again

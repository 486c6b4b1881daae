"""Tasks: the registry and its entry points, policy families (numpy and torch
agree), start states, clear errors for tasks that cannot run, and a candidate
whose env raises being charged and skipped."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agents.evaluation import Evaluation, EvaluationEnvError, Evaluator
from agents.evolve_config import EvolveConfig
from agents.se_darwin_agent import SEDarwinAgent, run_cma_baseline
from agents.tasks import GROUP, Task, TaskError, get_task, parse_policy, registry, task_names
from agents.tasks.torch_policy import BatchedPolicy
from genesis_fp16.base.settings import load_settings

import task_envs

pytestmark = pytest.mark.usefixtures("one_thread")


def test_builtins_and_any_gymnasium_id():
    names = task_names()
    assert {"Pendulum-v1", "InvertedPendulum-v5", "MountainCarContinuous-v0"} <= set(names)
    car = get_task("MountainCarContinuous-v0").resolve()
    assert (car.target, car.episode_steps, car.policy.name) == (90.0, 999, "mlp:8")  # the spec's threshold and limit
    other = get_task("Ant-v5").resolve()  # not registered: the defaults
    assert other.policy.name == "linear" and other.target == 6000.0 and other.learns_termination
    assert other.task.sigma0 is None and other.task.discount is None
    assert get_task("Ant-v5").resolve(target=-10, policy="mlp:4", episode_steps=20).target == -10
    pusher = get_task("Pusher-v5").resolve()  # registered: CMA-ES's step size by measurement, no termination to learn
    assert pusher.policy.name == "linear" and pusher.target == 0.0 and not pusher.learns_termination
    assert pusher.task.sigma0 == 0.1
    reacher = get_task("Reacher-v5").resolve()  # registered: its policy by measurement, no termination to learn
    assert reacher.policy.name == "mlp:16" and reacher.target == -3.75 and not reacher.learns_termination


def test_entry_point_plugin(monkeypatch):
    class EP:
        name = "drift-plugin"

        def load(self):
            return lambda: Task(env_id="Drift", env_factory=task_envs.drift, target=-1.0, description="a test plugin")

    class Broken(EP):
        name = "broken-plugin"

        def load(self):
            raise ImportError("no module named drift_pkg")

    monkeypatch.setattr(registry, "entry_points", lambda group: [EP(), Broken()] if group == GROUP else [])
    assert task_names()["drift-plugin"] == "a test plugin"
    assert "failed to load" in task_names()["broken-plugin"]
    assert get_task("drift-plugin").resolve().episode_steps == 1000  # no spec: the default length
    with pytest.raises(TaskError, match="'broken-plugin'.*failed to load.*drift_pkg"):
        get_task("broken-plugin")


@pytest.mark.parametrize("policy", ["linear", "mlp:5"])
def test_numpy_and_torch_policies_agree(policy):
    task = Task(env_id="Drift", env_factory=task_envs.drift, target=0.0, policy=policy).resolve()
    params = task.policy.random_params(np.random.default_rng(0), 3)
    obs = np.random.default_rng(1).normal(size=(3, 4, 2))
    batched = BatchedPolicy(task.policy)(
        torch.tensor(params, dtype=torch.float32), torch.tensor(obs, dtype=torch.float32)
    )
    single = np.stack([task.policy.act(p, o) for p, o in zip(params, obs)])
    np.testing.assert_allclose(batched.numpy(), single, atol=1e-5)
    assert np.all(np.abs(single) <= 1.0)  # tanh-bounded into the action box
    with pytest.raises(ValueError, match="expected one of linear, mlp:H"):
        parse_policy("mlp:0")


def test_default_start_states_are_disjoint_reset_seeds():
    task = Task(env_id="Drift", env_factory=task_envs.drift, target=0.0).resolve()
    s0, s1 = task.start_states(0), task.start_states(1)
    assert len(s0.train) == 16 and len(s0.heldout) == 20 and len(s0.validation) == 8
    seeds = [set(s.ravel()) for s in (s0.train, s0.heldout, s0.validation, s1.train, s1.heldout, s1.validation)]
    assert sum(len(s) for s in seeds) == len(set().union(*seeds))
    assert (
        len(
            Task(env_id="Drift", env_factory=task_envs.drift, target=0.0, n_validation=3)
            .resolve()
            .start_states(0)
            .validation
        )
        == 3
    )


def test_pendulum_start_states_are_three_disjoint_sets():
    from agents.tasks import get_task

    starts = get_task("Pendulum-v1").resolve().start_states(0)
    assert (len(starts.train), len(starts.validation), len(starts.heldout)) == (16, 8, 20)
    rows = [tuple(r) for s in (starts.train, starts.validation, starts.heldout) for r in s]
    assert len(set(rows)) == len(rows)
    assert np.all(np.abs(starts.validation[:, 0]) <= np.pi) and np.all(
        np.abs(starts.validation[:, 1]) <= 1.0
    )  # Pendulum's reset range
    np.testing.assert_array_equal(
        starts.validation, get_task("Pendulum-v1").resolve().start_states(0).validation
    )  # fixed per seed


def test_tasks_that_cannot_run_are_clear_errors():
    with pytest.raises(TaskError, match=r"observation space .* is an image; expected a flat Box"):
        Task(env_id="Camera", env_factory=task_envs.camera, target=0.0).resolve()
    with pytest.raises(TaskError, match="'Drift' has no target.*pass --target R"):
        Task(env_id="Drift", env_factory=task_envs.drift).resolve()
    with pytest.raises(TaskError, match="action space Discrete"):
        get_task("CartPole-v1").resolve(target=400)
    with pytest.raises(TaskError, match="'Nope-v0' cannot be made.*--list-tasks"):
        get_task("Nope-v0").resolve()


def test_env_raising_in_step_is_an_evaluation_error():
    task = Task(env_id="ExplodingDrift", env_factory=task_envs.exploding_drift, target=0.0, policy="linear").resolve()
    up = np.array([0.0, 0.0, 5.0])  # bias 5: action tanh(5) > 0
    with Evaluator(task, workers=1, timeout_s=60) as evaluator:
        with pytest.raises(EvaluationEnvError, match="raised in step: RuntimeError: actuator limit"):
            evaluator.evaluate(up, [[1.0]])
        ok = evaluator.evaluate(-up, [[1.0], [2.0]])  # the pool survives
    assert len(ok.returns) == 2 and ok.env_steps == 10


async def test_failing_candidates_are_charged_and_reported(state_dir):
    task = Task(env_id="ExplodingDrift", env_factory=task_envs.exploding_drift, target=0.0, n_train=2, n_heldout=2)
    config = EvolveConfig(budget=12, use_world_model=False, **TINY)
    agent = SEDarwinAgent(config, task=task, settings=load_settings())
    report = await agent.evolve()
    failed = report["failed_candidates"]
    assert failed and all("raised in step" in f["error"] for f in failed)
    assert report["real_episodes"] <= 12 and report["env_steps"] <= 5 * report["real_episodes"]
    assert report["env"] == "ExplodingDrift" and report["config"]["policy"] == "linear"


def test_pyproject_lists_the_builtins_in_the_entry_point_group():
    import sys
    from pathlib import Path

    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    from agents.tasks.builtin import BUILTIN

    group = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["entry-points"][GROUP]
    assert set(group) == set(BUILTIN)
    for name, target in group.items():
        module, _, attr = target.partition(":")
        assert module == "agents.tasks.builtin" and BUILTIN[name].__name__ == attr


async def test_cma_baseline_takes_the_task(state_dir):
    task = Task(
        env_id="Drift", env_factory=task_envs.drift, target=10.0, n_train=2, n_heldout=2
    )  # -|x| never reaches 10
    report = await run_cma_baseline(EvolveConfig(budget=6, popsize=3, workers=1, eval_timeout_s=60), task=task)
    assert report["env"] == "Drift" and report["real_episodes"] == 6 and report["env_steps"] == 6 * 5
    assert report["mode"] == "cma" and [len(g["candidates"]) for g in report["generations"]] == [3, 3]
    assert report["heldout_episodes"] == 2 and report["failed_candidates"] == [] and not report["target_reached"]


async def test_env_raising_in_reset_or_make(state_dir):
    with pytest.raises(TaskError, match="'Broken' raised when made: ConnectionError: no simulator"):
        Task(env_id="Broken", env_factory=task_envs.broken_make, target=0.0).resolve()
    task = Task(env_id="BrokenReset", env_factory=task_envs.broken_reset, target=0.0, n_train=2, n_heldout=2)
    # the learners need no start states of their own: the env is first reset by a real episode
    agent = SEDarwinAgent(
        EvolveConfig(budget=4, popsize=2, refined=0, workers=1, wm_steps=20, ensemble=2),
        task=task,
        settings=load_settings(),
    )
    report = await agent.evolve()  # every candidate charged and skipped, the report says why
    # both candidates of generation 0 failed alike (a broken env): the run stops there, the budget's rest unspent
    assert report["real_episodes"] == 2 and report["heldout_return"] is None and report["stop_reason"] == "failed"
    failed = report["failed_candidates"]
    assert (
        len(failed) == 2
        and sum(f["episodes"] for f in failed) == 2
        and all("raised in reset" in f["error"] for f in failed)
    )
    assert report["stop_detail"].startswith(
        "every candidate of generation 0 failed with the same error: env 'BrokenReset' raised in reset: OSError"
    )
    assert all(
        g["wm_val_loss"] is None and g["critic_val_loss"] is None for g in report["generations"]
    )  # nothing to learn from


def test_an_env_error_loses_only_its_own_job():
    """The others' episodes ran: they are returned, so the loop charges what it ran."""
    task = Task(
        env_id="ExplodingDrift", env_factory=task_envs.exploding_drift, target=0.0, n_train=2, n_heldout=2
    ).resolve()
    calm, wild = np.full(task.policy.n_params, -1.0), np.full(task.policy.n_params, 1.0)  # actions stay low / go high
    state = [[0.5, 0.0]]
    with Evaluator(task, workers=1, timeout_s=60) as ev:
        calm_out, wild_out, calm_again = ev.evaluate_many(
            [(calm, state), (wild, state), (calm, state)], per_job_env_errors=True
        )
        with pytest.raises(EvaluationEnvError, match="actuator limit"):
            ev.evaluate_many([(calm, state), (wild, state)])
    assert isinstance(calm_out, Evaluation) and calm_out.returns == calm_again.returns
    assert isinstance(wild_out, EvaluationEnvError) and "actuator limit" in str(wild_out)


def test_a_dying_worker_process_is_charged_and_the_pool_recovers():
    from agents.evaluation import EvaluationWorkerLost

    task = Task(env_id="Vanishing", env_factory=task_envs.vanishing, target=0.0, n_train=2, n_heldout=2).resolve()
    calm, wild = np.full(task.policy.n_params, -1.0), np.full(task.policy.n_params, 1.0)
    state = [[0.5, 0.0]]
    with Evaluator(task, workers=1, timeout_s=60) as ev:
        before = ev.evaluate(calm, state)
        with pytest.raises(EvaluationWorkerLost, match="lost a worker process"):
            ev.evaluate(wild, state)
        assert ev.evaluate(calm, state).returns == before.returns  # a fresh pool, the same episode


def test_clamp_projection_bounds_unbounded_dimensions_by_the_data_region():
    from agents.tasks.torch_policy import clamp_projection

    inf = float("inf")
    obs = torch.tensor([[3.0, 10.0], [-3.0, -10.0], [0.5, 0.5]])
    data = (torch.tensor([-5.0, -2.0]), torch.tensor([5.0, 2.0]))
    # the box where it is finite (the env never leaves it), the data region where it is not
    assert clamp_projection((-1.0, -inf), (1.0, inf), data=data)(obs).tolist() == [[1.0, 2.0], [-1.0, -2.0], [0.5, 0.5]]
    assert clamp_projection((-1.0, -inf), (1.0, inf))(obs).tolist() == [[1.0, 10.0], [-1.0, -10.0], [0.5, 0.5]]
    assert clamp_projection((-inf, -inf), (inf, inf)) is None
    assert clamp_projection((-inf, -inf), (inf, inf), data=data)(obs).tolist() == [[3.0, 2.0], [-3.0, -2.0], [0.5, 0.5]]


def test_a_non_finite_reward_fails_its_own_job_only():
    task = Task(
        env_id="NaNAbove", env_factory=task_envs.nan_reward_above_zero, target=0.0, n_train=2, n_heldout=2
    ).resolve()
    calm, wild = np.full(task.policy.n_params, -1.0), np.full(task.policy.n_params, 1.0)  # actions stay low / go high
    state = [[0.5, 0.0]]
    with Evaluator(task, workers=1, timeout_s=60) as ev:
        calm_out, wild_out = ev.evaluate_many([(calm, state), (wild, state)], per_job_env_errors=True)
        with pytest.raises(EvaluationEnvError, match=r"non-finite reward \(nan\) at step 0 of episode 0"):
            ev.evaluate(wild, state)
    assert isinstance(calm_out, Evaluation) and np.isfinite(calm_out.returns).all()
    assert isinstance(wild_out, EvaluationEnvError) and "non-finite reward" in str(wild_out)


@pytest.mark.parametrize(
    "factory, expected",
    [
        (
            task_envs.nan_last_obs,
            r"env 'Bad' returned a non-finite next_obs \(next_obs\[1\] = nan\) at step 4 of episode 0",
        ),
        (
            task_envs.huge_reward,
            r"env 'Bad' returned a non-finite reward \(1e\+39, inf as float32\) at step 4 of episode 0",
        ),
        (
            task_envs.large_reward,
            r"env 'Bad' returned a non-finite reward \(1e\+38, beyond the \+-1e\+15 the learners' float32 statistics "
            r"allow\) at step 4 of episode 0",
        ),
        (
            task_envs.nan_reset_obs,
            r"env 'Bad' returned a non-finite obs \(obs\[1\] = nan\) from reset at step 0 of episode 0",
        ),
    ],
)
def test_non_finite_env_data_is_a_failure_naming_the_field_and_step(factory, expected):
    """What the replay buffer would store as NaN or inf (float32: a reward of
    1e39 is inf there) fails the candidate instead of reaching the buffer."""
    from agents.tasks.episodes import EnvFailure, run_episodes

    task = Task(env_id="Bad", env_factory=factory, target=0.0).resolve()
    with pytest.raises(EnvFailure, match=expected):
        run_episodes(task.episode_spec, np.zeros(task.n_params), [[1.0]])


def test_an_env_raising_on_the_nan_it_was_given_names_where_the_nan_began():
    from agents.tasks.episodes import EnvFailure, run_episodes

    task = Task(env_id="Fragile", env_factory=task_envs.fragile_nan, target=0.0).resolve()
    with pytest.raises(
        EnvFailure, match=r"env 'Fragile' returned a non-finite next_obs \(next_obs\[0\] = nan\) at step 1 of episode 0"
    ):
        run_episodes(task.episode_spec, np.zeros(task.n_params), [[1.0]])


def test_a_non_finite_action_is_named_as_the_cause():
    from agents.tasks.episodes import EnvFailure, run_episodes

    task = Task(env_id="Drift", env_factory=task_envs.drift, target=0.0, policy="linear").resolve()
    params = np.full(task.n_params, np.nan)  # parameters gone bad: a NaN action, then a NaN reward; the action is named
    with pytest.raises(
        EnvFailure,
        match=r"the policy on env 'Drift' returned a non-finite action \(action\[0\] = nan\) at step 0 of episode 0",
    ):
        run_episodes(task.episode_spec, params, [[1.0]])


NAN_TASK = Task(env_id="NaNDrift", env_factory=task_envs.nan_reward, target=0.0, n_train=2, n_heldout=2)
# generations of 6 candidates, one real episode each, and tiny learners (a few short model rollouts)
TINY = dict(
    popsize=6,
    wm_steps=20,
    ensemble=2,
    refine_steps=4,
    critic_updates=0.2,
    model_rollouts=16,
    rollout_horizon=2,
    workers=1,
    eval_timeout_s=60,
)


@pytest.mark.parametrize("mode", ["full", "no_world_model", "cma"])
async def test_a_run_whose_every_candidate_gives_nan_says_it_failed(mode, state_dir):
    """Every return is NaN: each candidate is charged and listed, nothing is
    trained on, and the run stops as failed after the first generation, whose
    candidates all failed alike (issue 54: it spent the whole budget before)."""
    config = EvolveConfig(budget=8, use_world_model=mode == "full", **TINY)
    if mode == "cma":
        report = await run_cma_baseline(config, task=NAN_TASK)
    else:
        report = await SEDarwinAgent(config, task=NAN_TASK, settings=load_settings()).evolve()
    failed = report["failed_candidates"]
    assert report["stop_reason"] == "failed" and report["real_episodes"] == 6 and report["env_steps"] == 0
    assert failed and all("non-finite reward (nan)" in f["error"] for f in failed)
    assert sum(f["episodes"] for f in failed) == 6  # every charged episode is a listed failure's
    assert report["train_return"] is None and report["heldout_return"] is None and not report["target_reached"]
    assert report["stop_detail"].startswith(
        "every candidate of generation 0 failed with the same error: env 'NaNDrift'"
    )
    assert report["stop_detail"].endswith("(6 of 8 real episodes charged, the rest not spent)")
    assert all(
        g["best_return"] is None and g["wm_val_loss"] is None and g["critic_val_loss"] is None
        for g in report["generations"]
    )
    assert [len(g["candidates"]) for g in report["generations"]] == [6]


async def test_nan_candidates_are_charged_and_the_others_train_the_model(state_dir):
    task = Task(env_id="NaNAbove", env_factory=task_envs.nan_reward_above_zero, target=10.0, n_train=2, n_heldout=2)
    agent = SEDarwinAgent(EvolveConfig(budget=18, seed=1, **TINY), task=task, settings=load_settings())
    report = await agent.evolve()
    failed = report["failed_candidates"]
    assert report["stop_reason"] == "budget" and report["real_episodes"] == 18
    assert failed and all("non-finite reward" in f["error"] for f in failed) and len(failed) < 18
    assert sum(f["episodes"] for f in failed) == sum(
        1 for g in report["generations"] for c in g["candidates"] if c["real_return"] == -np.inf
    )
    assert np.isfinite(report["train_return"])
    # the world model and the critic train from the first generation with a usable return on (and after it, for the
    # generations that run refined candidates)
    trained, succeeded = [], False
    for g in report["generations"]:
        first = not succeeded and any(np.isfinite(c["real_return"]) for c in g["candidates"])
        succeeded = succeeded or first
        trained.append(g["wm_val_loss"] is not None)
        assert (
            trained[-1] == (g["critic_val_loss"] is not None)
            and (succeeded or not trained[-1])
            and (trained[-1] or not first)
        )
    assert trained[0]
    counts = agent.buffer.count(agent.data_agent)  # only the finite episodes reached the replay buffer
    assert counts["trajectories"] == 18 - len(failed) and counts["transitions"] == 5 * (18 - len(failed))


@pytest.mark.parametrize("target", [float("nan"), float("inf"), float("-inf")])
async def test_a_non_finite_target_is_refused(target, state_dir):
    with pytest.raises(ValueError, match=f"target={target}: expected a finite number"):
        EvolveConfig(target=target).validate()
    with pytest.raises(ValueError, match="expected a finite number"):
        SEDarwinAgent(EvolveConfig(target=target, use_world_model=False), task=NAN_TASK, settings=load_settings())
    with pytest.raises(ValueError, match="expected a finite number"):
        await run_cma_baseline(EvolveConfig(target=target), task=NAN_TASK)
    drift = Task(env_id="Drift", env_factory=task_envs.drift, target=target)
    with pytest.raises(TaskError, match=f"'Drift': target {target}: expected a finite number"):
        drift.resolve()
    with pytest.raises(TaskError, match="expected a finite number"):
        Task(env_id="Drift", env_factory=task_envs.drift, target=0.0).resolve(target=target)


@pytest.mark.parametrize(
    "env_id, done",
    [("Hopper-v5", "hopper_done"), ("InvertedDoublePendulum-v5", "inverted_double_pendulum_done")],
)
def test_a_builtin_termination_ends_where_the_env_ends(env_id, done):
    # random actions from several resets: the task's rule on the next observation says what the env's terminated says
    import gymnasium as gym
    import torch

    from agents.tasks import builtin

    rule, env, rng = getattr(builtin, done), gym.make(env_id), np.random.default_rng(0)
    said, ended = [], []
    for episode in range(8):
        env.reset(seed=episode)
        for _ in range(200):
            obs, _, terminated, truncated, _ = env.step(rng.uniform(-1, 1, env.action_space.shape))
            said.append(bool(rule(torch.as_tensor(obs))))
            ended.append(bool(terminated))
            if terminated or truncated:
                break
    env.close()
    assert said == ended and sum(ended) == 8  # every episode ended by the env's rule, and the task's saw each end

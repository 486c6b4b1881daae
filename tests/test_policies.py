"""The evolved policy as a file (`agents.policies`, `genesis-fp16 eval`): a run
writes it and names it in its report; `load_policy` gives the actions of the
run's own episodes (numpy and torch); `eval` reproduces the report's held-out
mean; an edited file, another task's file and an env that cannot render are
each refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from agents.evaluation import Evaluation, Evaluator
from agents.policies import EvolvedPolicy, PolicyError, digest, load_policy, policy_from_run
from agents.se_darwin_agent import EvolveConfig, SEDarwinAgent
from agents.tasks import PolicySpec, Task, get_task, run_episodes
from genesis_fp16.cli import app

pytestmark = pytest.mark.usefixtures("one_thread")

runner = CliRunner()
TINY = dict(popsize=6, wm_steps=40, ensemble=2, refine_steps=4, critic_updates=0.02, model_rollouts=0, workers=1)
TINY_FLAGS = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]


class RecordingEvaluator(Evaluator):
    """Real episodes in this process (the run's own runner and spec), each call's results kept."""

    def __init__(self, task) -> None:
        super().__init__(task, workers=1)
        self.results: list[tuple[list[list[float]], Evaluation]] = []

    def evaluate_many(self, jobs, **kw):
        out = []
        for params, states in jobs:
            res = run_episodes(self.spec, [float(v) for v in params], [[float(v) for v in s] for s in states])
            out.append(Evaluation(returns=res["returns"], episodes=res["episodes"]))
            self.results.append(([list(map(float, s)) for s in states], out[-1]))
        return out


def _one_line_error(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def _pendulum_policy(tmp_path: Path, seed: int = 0) -> Path:
    """A Pendulum policy file written as a run writes it, without a run."""
    resolved = get_task("Pendulum-v1").resolve()
    params = np.random.default_rng(seed).normal(0, 0.5, resolved.n_params)
    policy = policy_from_run(
        resolved,
        params,
        run={"run_id": "seed0-test", "seed": seed, "candidate": "g0-0-cma", "operator": "cma"},
        returns={"heldout": None},
        heldout_seed=seed,
        heldout_states=resolved.start_states(seed).heldout,
    )
    return policy.save(tmp_path / "policy.json")


# -- a run writes it; Python gives the run's own actions and held-out mean ------------------------


async def test_a_run_writes_its_policy_and_load_policy_gives_the_runs_own_actions(state_dir):
    task = get_task("Pendulum-v1").resolve()
    evaluator = RecordingEvaluator(task)
    agent = SEDarwinAgent(EvolveConfig(budget=16, seed=2, **TINY), task=task, evaluator=evaluator)
    report = await agent.evolve()

    path = Path(report["policy_file"])
    assert path == state_dir / "runs" / report["run_id"] / "policy.json" and path.is_file()
    policy = load_policy(path)
    assert list(policy.params) == report["best_candidate"]["params"]
    assert policy.run["run_id"] == report["run_id"] and policy.run["operator"] == report["best_candidate"]["operator"]
    assert policy.env_id == "Pendulum-v1" and policy.spec == task.policy and policy.heldout_seed == 2
    assert policy.returns["heldout"] == report["heldout_return"]

    # the run's held-out evaluation: the last call, on its 20 held-out start states
    states, heldout = evaluator.results[-1]
    assert np.array_equal(np.asarray(states), policy.heldout_states) and len(states) == 20
    obs = np.concatenate([ep["obs"] for ep in heldout.episodes])
    actions = np.concatenate([ep["action"] for ep in heldout.episodes])
    assert obs.shape == (20 * 200, 3)
    assert np.array_equal(policy.predict(obs), actions)  # bit for bit: the same float32 actions
    assert np.array_equal(policy.predict(obs[7]), actions[7])  # one observation -> one action
    module = policy.module()
    assert isinstance(module, torch.nn.Module)
    with torch.no_grad():
        assert np.allclose(module(torch.from_numpy(obs)).numpy(), actions, atol=1e-5)
        exact = policy.module(torch.float64)(torch.from_numpy(obs).double()).numpy().astype(np.float32)
    assert np.abs(exact - actions).max() <= 1e-6

    # evaluate(): the run's episode runner on its held-out start states, the report's mean
    result = policy.evaluate()
    assert result.returns == heldout.returns
    assert abs(result.mean_return - report["heldout_return"]) <= 1e-6
    assert "the run's held-out start states" in result.start_states


# -- the command: evolve prints the path, eval reproduces the held-out mean -----------------------


def test_evolve_prints_the_policy_and_eval_reproduces_the_heldout_mean(tmp_path, state_dir):
    report_path, out = tmp_path / "report.json", tmp_path / "eval.json"
    result = runner.invoke(app, ["evolve", *TINY_FLAGS, "--budget", "16", "--json", str(report_path)])
    assert result.exit_code == 0, result.output
    report = json.loads(report_path.read_text())
    path = report["policy_file"]
    assert path == str(state_dir / "runs" / report["run_id"] / "policy.json")
    assert f"policy: {path}; run it: genesis-fp16 eval --policy {path}" in result.stdout

    ran = runner.invoke(app, ["eval", "--policy", path, "--episodes", "20", "--json", str(out)])
    assert ran.exit_code == 0, ran.output
    evaluation = json.loads(out.read_text())
    assert abs(evaluation["mean_return"] - report["heldout_return"]) <= 1e-6
    assert len(evaluation["returns"]) == 20 and evaluation["episodes"] == 20
    assert evaluation["returns"] == load_policy(path).returns["heldout_returns"]
    assert evaluation["std_return"] >= 0 and evaluation["min_return"] <= evaluation["max_return"]
    assert "mean return" in ran.stdout and "std" in ran.stdout and "held-out" in ran.stdout

    # the default is the same run's states; more episodes go on past them, another seed has its own
    default = runner.invoke(app, ["eval", "--policy", path, "--json", str(out)])
    assert default.exit_code == 0 and json.loads(out.read_text())["mean_return"] == evaluation["mean_return"]
    more = runner.invoke(app, ["eval", "--policy", path, "--episodes", "23", "--json", str(out)])
    assert more.exit_code == 0, more.output
    assert json.loads(out.read_text())["returns"][:20] == evaluation["returns"]


# -- refusals: each one line ----------------------------------------------------------------------


def test_an_edited_policy_file_is_refused_in_one_line(tmp_path):
    path = _pendulum_policy(tmp_path)
    assert load_policy(path).spec.name == "mlp:8"
    doc = json.loads(path.read_text())
    doc["params"][3] += 0.25  # a weight edited by hand
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(doc, indent=1))
    line = _one_line_error(runner.invoke(app, ["eval", "--policy", str(edited)]))
    assert str(edited) in line and "does not match its digest" in line
    with pytest.raises(PolicyError, match="edited by hand"):
        load_policy(edited)

    # damaged, not a policy file, missing, a newer version, a field this code never writes
    (tmp_path / "cut.json").write_text(path.read_text()[:200])
    (tmp_path / "report.json").write_text(json.dumps({"mode": "loop", "best_candidate": {"params": [0.0]}}))
    newer = {k: v for k, v in json.loads(path.read_text()).items() if k != "digest"} | {"version": 99}
    (tmp_path / "newer.json").write_text(json.dumps({**newer, "digest": digest(newer)}))
    odd = {k: v for k, v in json.loads(path.read_text()).items() if k != "digest"}
    odd["params"] = odd["params"][:-1]
    (tmp_path / "odd.json").write_text(json.dumps({**odd, "digest": digest(odd)}))
    for name, expected in (
        ("cut.json", "is not valid JSON"),
        ("report.json", "is not a genesis-fp16 policy file"),
        ("absent.json", "no such file"),
        ("newer.json", "format version 99"),
        ("odd.json", "params has 40 values, expected 41"),
    ):
        line = _one_line_error(runner.invoke(app, ["eval", "--policy", str(tmp_path / name)]))
        assert str(tmp_path / name) in line and expected in line, line


def test_a_policy_of_another_task_is_refused_in_one_line(tmp_path):
    path = _pendulum_policy(tmp_path)
    line = _one_line_error(runner.invoke(app, ["eval", "--policy", str(path), "--env", "MountainCarContinuous-v0"]))
    assert str(path) in line and "evolved for Pendulum-v1" in line and "MountainCarContinuous-v0" in line
    with pytest.raises(PolicyError, match="cannot run there"):
        load_policy(path).evaluate("MountainCarContinuous-v0", episodes=2)

    # a file that says it is MountainCar's (digest and all) but holds a Pendulum policy: refused on its own task
    pendulum = load_policy(path)
    claimed = EvolvedPolicy(
        spec=pendulum.spec,
        params=pendulum.params,
        env_id="MountainCarContinuous-v0",
        episode_steps=999,
        heldout_states=[[1.0]],
    ).save(tmp_path / "claimed.json")
    line = _one_line_error(runner.invoke(app, ["eval", "--policy", str(claimed)]))
    assert "3 observations" in line and "2 observations" in line


def test_eval_imports_no_torch(tmp_path):
    """Running a policy file needs numpy and the env only: a host without torch work pays no torch start-up."""
    path = _pendulum_policy(tmp_path)
    probe = (
        "import sys, genesis_fp16.cli as cli\n"
        "try:\n    cli.main(sys.argv[1:])\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    proc = subprocess.run(
        [sys.executable, "-c", probe, "eval", "--policy", str(path), "--episodes", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "mean return" in proc.stdout


def test_bad_options_are_one_line(tmp_path):
    path = str(_pendulum_policy(tmp_path))
    assert "--episodes 0: expected 1..100000" in _one_line_error(
        runner.invoke(app, ["eval", "--policy", path, "--episodes", "0"])
    )
    assert "--seed -1" in _one_line_error(runner.invoke(app, ["eval", "--policy", path, "--seed", "-1"]))


# -- the Python view ------------------------------------------------------------------------------


def test_predict_batches_and_refuses_a_wrong_shape(tmp_path):
    policy = load_policy(_pendulum_policy(tmp_path))
    obs = np.random.default_rng(1).normal(size=(5, 3)).astype(np.float32)
    batch = policy.predict(obs)
    assert batch.shape == (5, 1) and batch.dtype == np.float32 and np.all(np.abs(batch) <= 2.0)
    assert np.array_equal(batch, np.stack([policy.predict(o) for o in obs]))
    assert np.array_equal(policy.predict(obs), batch)  # deterministic
    with pytest.raises(ValueError, match=r"expected \(3,\) or \(N, 3\)"):
        policy.predict(np.zeros(4))
    with pytest.raises(ValueError):
        policy.params[0] = 1.0  # read-only: the file's parameters
    module = policy.module()
    assert {n for n, _ in module.named_parameters()} == {"layers.0.weight", "layers.0.bias", "layers.1.weight",
                                                        "layers.1.bias"}  # fmt: skip
    assert module(torch.from_numpy(obs)).shape == (5, 1)


def test_save_load_round_trip_is_byte_for_byte(tmp_path):
    path = _pendulum_policy(tmp_path)
    again = load_policy(path).save(tmp_path / "again.json")
    assert again.read_bytes() == path.read_bytes()


def test_a_linear_policy_module_matches_predict():
    spec = PolicySpec(obs_dim=4, act_dim=2, hidden=0, obs_scale=(1.0, 0.5, 0.25, 1.0), action_low=(-1.0, 0.0),
                      action_high=(1.0, 3.0))  # fmt: skip
    policy = EvolvedPolicy(spec, np.linspace(-1, 1, spec.n_params), env_id="x", episode_steps=5, heldout_states=[[0]])
    obs = np.random.default_rng(0).normal(size=(9, 4))
    with torch.no_grad():
        out = policy.module(torch.float64)(torch.from_numpy(obs)).numpy()
    assert np.allclose(out, policy.predict(obs), atol=1e-6)


def test_heldout_states_extend_the_runs_own():
    pendulum = get_task("Pendulum-v1").resolve()
    own = pendulum.start_states(4).heldout
    assert np.array_equal(pendulum.heldout_states(4, 5), own[:5])
    more = pendulum.heldout_states(4, 26)
    assert more.shape == (26, 2) and np.array_equal(more[:20], own)
    assert np.array_equal(more, pendulum.heldout_states(4, 26))  # the same every time
    seeded = get_task("MountainCarContinuous-v0").resolve()
    states = seeded.heldout_states(4, 22)
    assert np.array_equal(states[:20], seeded.start_states(4).heldout)
    assert list(states[:, 0]) == [states[0, 0] + k for k in range(22)]


# -- video ----------------------------------------------------------------------------------------


class Canvas(gym.Env):
    """x moves by the action; renders an 8x8 image in ``rgb_array`` mode (``broken``: rendering fails, as MuJoCo
    without an OpenGL context does)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}
    observation_space = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, render_mode=None, broken=False) -> None:
        self.render_mode, self.broken = render_mode, broken
        self.x, self.t = 0.0, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.t = float(self.np_random.uniform(-1, 1)), 0
        return np.array([self.x, 0.0], np.float32), {}

    def step(self, action):
        self.x += float(action[0])
        self.t += 1
        return np.array([self.x, self.t / 5], np.float32), -abs(self.x), False, self.t >= 5, {}

    def render(self):
        if self.broken:
            raise RuntimeError("an OpenGL platform library has not been loaded into this process")
        return np.full((8, 8, 3), min(255, int(abs(self.x) * 50)), np.uint8)


for _name, _broken in (("PolicyCanvas-v0", False), ("PolicyBrokenCanvas-v0", True)):
    if _name not in gym.registry:
        gym.register(_name, entry_point=lambda render_mode=None, b=_broken: Canvas(render_mode, b),
                     max_episode_steps=5)  # fmt: skip


def _canvas_policy(tmp_path: Path, env_id: str) -> Path:
    resolved = Task(env_id=env_id, target=0.0, n_heldout=3).resolve()
    params = np.linspace(-0.5, 0.5, resolved.n_params)
    return policy_from_run(
        resolved,
        params,
        run={"run_id": "r"},
        returns={},
        heldout_seed=0,
        heldout_states=resolved.start_states(0).heldout,
    ).save(tmp_path / f"{env_id}.json")


def test_video_where_the_env_renders(tmp_path):
    path, video = _canvas_policy(tmp_path, "PolicyCanvas-v0"), tmp_path / "episode.gif"
    result = runner.invoke(app, ["eval", "--policy", str(path), "--video", str(video)])
    assert result.exit_code == 0, result.output
    assert "video written to" in result.output and "6 frames" in result.output  # the start state and 5 steps
    assert video.stat().st_size > 0 and video.read_bytes()[:3] == b"GIF"


def test_video_where_the_env_cannot_render_is_one_line(tmp_path):
    path = _canvas_policy(tmp_path, "PolicyBrokenCanvas-v0")
    result = runner.invoke(app, ["eval", "--policy", str(path), "--video", str(tmp_path / "x.gif")])
    assert result.exit_code == 1
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "cannot render frames here" in errors[0] and "MUJOCO_GL" in errors[0]
    assert "mean return" in result.stdout  # the returns were printed first
    assert not (tmp_path / "x.gif").exists()

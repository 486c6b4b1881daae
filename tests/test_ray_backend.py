"""The Ray evaluation backend (``evolve --backend ray``) against the process
pool: the same returns, a timeout charged, a killed worker retried then
charged, an env error per job, and a clear error for an address with no
cluster. One local Ray (2 CPUs) serves the whole module."""

from __future__ import annotations

import dataclasses
import functools
import os
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install -e '.[ray]' (dev includes it)")

from agents.evaluation import EvaluationEnvError, EvaluationError, EvaluationTimeout, Evaluator, make_evaluator  # noqa: E402
from agents.ray_evaluation import EvaluationWorkerLost, RayConnectError, RayEvaluator, connect_ray  # noqa: E402
from agents.tasks.builtin import pendulum  # noqa: E402 (after the importorskip)

STATES = [[0.5, 0.0], [-1.0, 0.5], [2.0, -1.0]]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def task():
    return pendulum().resolve()


@pytest.fixture(scope="module")
def params(task):
    return task.policy.random_params(np.random.default_rng(3), 2, 1.0)


def _ray(task, **kw) -> RayEvaluator:
    kw.setdefault("timeout_s", 60.0)
    ev = (
        make_evaluator(task, backend="ray", workers=2, **kw)
        if not kw.get("max_retries")
        else RayEvaluator(task, workers=2, **kw)
    )
    assert isinstance(ev, RayEvaluator)
    return ev


def test_ray_gives_the_process_pools_returns_and_episodes(local_ray, task, params):
    jobs = [(params[0], STATES), (params[1], STATES[:2])]
    told_pool, told_ray = [], []  # each chunk's episodes as it finishes (the run's progress)
    with Evaluator(task, workers=2, timeout_s=60) as pool:
        expected = pool.evaluate_many(jobs, on_episodes=told_pool.append)
    with _ray(task) as ev:
        got = ev.evaluate_many(jobs, on_episodes=told_ray.append)
    assert sorted(told_pool) == sorted(told_ray) and sum(told_ray) == len(STATES) + 2
    for e, g in zip(expected, got):
        assert g.returns == e.returns
        for ee, ge in zip(e.episodes, g.episodes):
            assert ee.keys() == ge.keys()
            for key in ee:
                np.testing.assert_array_equal(ge[key], ee[key])


def test_a_late_task_is_cancelled_and_charged_as_a_timeout(local_ray, task, params):
    with _ray(task, timeout_s=1.0) as ev:
        started = time.monotonic()
        good = ev.spec
        ev.spec = dataclasses.replace(good, env_factory=functools.partial(time.sleep, 120))  # 120 s to make the env
        told: list[int] = []
        with pytest.raises(EvaluationTimeout, match="did not finish within 1 s"):
            ev.evaluate(params[0], STATES, on_episodes=told.append)  # one wait per task: the deadline holds as well
        assert time.monotonic() - started < 60 and told == []  # the hang was cut, not waited out
        ev.spec = good
        ev.timeout_s = 60.0  # a fresh worker's start-up under load is not what is checked here
        assert len(ev.evaluate(params[0], STATES[:1]).returns) == 1  # the backend still works


def test_a_worker_killed_once_is_retried(local_ray, task, params, tmp_path):
    marker = tmp_path / "crashed"
    make_env = task.episode_spec.make_env

    def crash_once():
        if not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(3)  # the worker process dies mid-task, as under a kill or an OOM kill
        return make_env()

    with Evaluator(task, workers=1, timeout_s=60) as pool:
        expected = pool.evaluate(params[0], STATES[:1]).returns
    with RayEvaluator(task, workers=1, timeout_s=60, max_retries=1) as ev:
        ev.spec = dataclasses.replace(ev.spec, env_factory=crash_once)
        assert ev.evaluate(params[0], STATES[:1]).returns == expected
    assert marker.exists()


def test_a_worker_killed_on_every_try_is_charged(local_ray, task, params):
    with RayEvaluator(task, workers=1, timeout_s=60, max_retries=1) as ev:
        good = ev.spec
        ev.spec = dataclasses.replace(good, env_factory=functools.partial(os._exit, 3))
        with pytest.raises(EvaluationWorkerLost, match="lost its Ray worker on every try \\(2\\)") as info:
            ev.evaluate(params[0], STATES[:1])
        assert isinstance(info.value, EvaluationError)  # the loop charges and skips it
        ev.spec = good
        assert len(ev.evaluate(params[0], STATES[:1]).returns) == 1


def test_an_env_error_is_an_evaluation_env_error_per_job(local_ray, task, params):
    def _raise_in_make():  # local: Ray's workers cannot import this test module, a local function travels by value
        raise RuntimeError("no such simulator")

    with _ray(task) as ev:
        good = ev.spec
        ev.spec = dataclasses.replace(good, env_factory=_raise_in_make)
        with pytest.raises(EvaluationEnvError, match="raised in make: RuntimeError: no such simulator"):
            ev.evaluate(params[0], STATES)
        results = ev.evaluate_many([(params[0], STATES[:1])], per_job_env_errors=True)
        assert isinstance(results[0], EvaluationEnvError)


def test_an_address_with_no_cluster_fails_fast_and_clearly():
    started = time.monotonic()
    with pytest.raises(
        RayConnectError, match=r"--ray-address 127.0.0.1:1: no Ray cluster answers there .*ray start --head"
    ):
        connect_ray("127.0.0.1:1", None)
    assert time.monotonic() - started < 10
    with pytest.raises(RayConnectError, match="expected 'auto' or HOST:PORT"):
        connect_ray("nowhere", None)


def test_evolve_with_an_address_that_answers_nothing_is_one_clear_line(monkeypatch):
    from typer.testing import CliRunner

    from genesis_fp16.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["evolve", "--backend", "ray", "--ray-address", "127.0.0.1:1", "--budget", "40"])
    assert result.exit_code == 2, result.output
    assert "--ray-address 127.0.0.1:1: no Ray cluster answers there" in result.output
    assert "Traceback" not in result.output
    monkeypatch.setenv("GENESIS_FP16_RAY_ADDRESS", "127.0.0.1:1")  # the setting is the default address
    result = runner.invoke(app, ["evolve", "--backend", "ray", "--budget", "40"])
    assert result.exit_code == 2 and "no Ray cluster answers there" in result.output, result.output
    result = runner.invoke(
        app, ["evolve", "--ray-address", "127.0.0.1:1", "--budget", "40"]
    )  # explicit, without --backend ray
    assert result.exit_code == 2 and "applies to --backend ray only" in result.output, result.output


def test_evolve_config_checks_the_backend():
    from agents.evolve_config import EvolveConfig

    with pytest.raises(ValueError, match="backend='dask': expected one of process, ray"):
        EvolveConfig(backend="dask").validate()


def test_the_memory_limit_holds_inside_a_ray_task(local_ray, task, params):
    from agents.evaluation import EvaluationMemoryError

    with RayEvaluator(task, workers=1, timeout_s=60, memory_limit_mb=64) as ev:
        good = ev.spec
        ev.spec = dataclasses.replace(
            good, env_factory=functools.partial(bytearray, 1024 * 1024 * 1024)
        )  # 1 GiB to make the env
        with pytest.raises(EvaluationMemoryError, match="over the worker memory limit \\(64 MiB\\)"):
            ev.evaluate(params[0], STATES[:1])
        ev.spec = good
        assert len(ev.evaluate(params[0], STATES[:1]).returns) == 1  # the limit was lifted after the task


def test_a_resumed_run_may_change_its_backend():
    from dataclasses import asdict

    from agents.evolve_config import EvolveConfig, resumed_config
    from agents.runs import MANIFEST_VERSION

    saved = asdict(EvolveConfig())
    manifest = {
        "run_id": "r",
        "version": MANIFEST_VERSION,
        "config": saved,
        "real_episodes": 0,
        **{name: {} for name in ("state", "search", "obs_stats", "time")},
        "pool": [],
        "generations": [],
    }
    assert resumed_config(manifest, budget=None, workers=None, options={}, backend="ray").backend == "ray"
    del saved["backend"]  # a run started before backends existed: the process pool
    assert resumed_config(manifest, budget=None, workers=None, options={}).backend == "process"


STRESS = """
import dataclasses, functools
import numpy as np, ray
from agents.evaluation import EvaluationMemoryError  # noqa: E402 (after the importorskip)
from agents.ray_evaluation import RayEvaluator  # noqa: E402 (after the importorskip)
from agents.tasks.builtin import pendulum  # noqa: E402 (after the importorskip)
task = pendulum().resolve()
params = task.policy.random_params(np.random.default_rng(3), 2, 1.0)
ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
n = 0
with RayEvaluator(task, workers=1, timeout_s=60, memory_limit_mb=64) as ev:
    # 1 GiB to make the env
    ev.spec = dataclasses.replace(ev.spec, env_factory=functools.partial(bytearray, 1024 * 1024 * 1024))
    for _ in range(300):
        try:
            ev.evaluate(params[0], [[0.5, 0.0]])
        except EvaluationMemoryError:
            n += 1
print("memory errors", n)
"""


def test_failed_tasks_are_not_force_cancelled_so_the_driver_survives(tmp_path):
    """A task whose error was read must not be force-cancelled: Ray 2.60's
    driver then aborts ("Tried to complete task that was not pending"),
    within about 100 such calls on a 2-core machine. Its own process, so an
    abort fails this test instead of killing pytest."""
    import subprocess
    import sys

    env = {**os.environ, "RAY_ADDRESS": "", "GENESIS_FP16_STATE_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", STRESS], capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path
    )
    assert out.returncode == 0 and "memory errors 300" in out.stdout, (
        out.returncode,
        out.stdout[-500:],
        out.stderr[-2000:],
    )


def test_the_ray_address_setting_applies_to_the_ray_backend_only(monkeypatch, tmp_path):
    """GENESIS_FP16_RAY_ADDRESS is the default address of --backend ray; a run
    on the process pool ignores it. An explicit --ray-address without
    --backend ray is still an error."""
    from typer.testing import CliRunner

    from genesis_fp16.cli import app

    runner = CliRunner()
    monkeypatch.setenv("GENESIS_FP16_RAY_ADDRESS", "127.0.0.1:1")  # nothing answers there: using it would fail the run
    # the floor (nothing learned, so quick): two generations of 8 one-episode candidates, on the process pool
    result = runner.invoke(app, ["evolve", "--baseline", "cma", "--popsize", "8", "--budget", "16", "--workers", "1"])
    assert result.exit_code == 0 and "budget spent: 16 of 16 real episodes used" in result.output, result.output
    result = runner.invoke(app, ["evolve", "--ray-address", "127.0.0.1:1", "--budget", "16"])
    assert result.exit_code == 2 and "applies to --backend ray only" in result.output, result.output


# `genesis-fp16 evolve --backend ray` whose Ray tasks hang, so the run is
# still going (a local Ray started, a worker busy) when it is killed.
HANGING_RAY_EVOLVE = """
import dataclasses, functools, time
from agents import ray_evaluation


class HangingRayEvaluator(ray_evaluation.RayEvaluator):
    def evaluate_many(self, jobs, **kw):
        print("evaluating", flush=True)
        # an hour to make the env
        self.spec = dataclasses.replace(self.spec, env_factory=functools.partial(time.sleep, 3600))
        return super().evaluate_many(jobs, **kw)


if __name__ == "__main__":
    ray_evaluation.RayEvaluator = HangingRayEvaluator
    from genesis_fp16.cli import app

    app(["evolve", "--backend", "ray", "--no-world-model", "--budget", "16", "--workers", "1"],
        prog_name="genesis-fp16")
"""


@pytest.mark.slow
def test_a_local_rays_processes_die_with_a_killed_evolve(tmp_path):
    """After a `kill -9` of `evolve --backend ray`, every process of the
    local Ray it started is gone within seconds (its agents outlived the
    driver by more than 60 s before the reaper)."""
    import re
    import subprocess
    import sys

    import psutil
    from process_helpers import kill_all, read_line, still_alive, wait_until

    from agents.ray_reaper import reap, session_pattern

    startup_s, gone_s = 240, 20  # Ray's own agents lingered 30-60 s: 20 s still tells them apart from a reaped session
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["GENESIS_FP16_STATE_DIR"] = str(tmp_path / "state")
    driver = subprocess.Popen(
        [sys.executable, "-c", HANGING_RAY_EVOLVE],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    family: list[psutil.Process] = []
    session_dir = None
    try:
        read_line(driver.stdout, startup_s, lambda text: text.startswith("evaluating"))

        def session() -> list[psutil.Process]:
            return psutil.Process(driver.pid).children(recursive=True)

        # the task's worker is running (a raylet child besides the two agents)
        assert wait_until(lambda: sum(p.name().startswith("ray::") for p in session()) >= 3, startup_s), [
            p.name() for p in session()
        ]
        family = session()
        gcs = next(p for p in family if p.name() == "gcs_server")
        session_dir = re.search(r"--log_dir=(.*)/logs", " ".join(gcs.cmdline())).group(1)
        driver.kill()
        driver.wait(timeout=startup_s)
        left = still_alive(family, gone_s)
        assert not left, f"alive {gone_s} s after evolve was killed: {[(p.pid, p.name()) for p in left]}"
    finally:
        driver.kill()
        driver.wait(timeout=startup_s)
        kill_all(family)
        if session_dir is not None:
            reap(session_pattern(session_dir), for_s=10)  # whatever of the session the snapshot missed


def test_a_resumed_ray_run_uses_the_ray_address_setting(state_dir):
    """A run started with --backend ray resumes on Ray without --backend
    again, so the setting's address applies to it (and only then)."""
    import json
    from types import SimpleNamespace

    from agents import cli, runs

    path = runs.manifest_path(state_dir, "r1")
    path.parent.mkdir(parents=True)
    path.write_text(
        json.dumps(
            {
                "format": runs.MANIFEST_FORMAT,
                "version": runs.MANIFEST_VERSION,
                "run_id": "r1",
                "config": {"backend": "ray"},
            }
        )
    )
    ctx = SimpleNamespace(get_parameter_source=lambda name: SimpleNamespace(name="DEFAULT"))  # --backend not given
    assert cli._backend_of_run(ctx, cli.Backend.process, "r1", state_dir) == cli.Backend.ray
    assert cli._backend_of_run(ctx, cli.Backend.process, None, state_dir) == cli.Backend.process
    assert cli._backend_of_run(ctx, cli.Backend.process, "unknown-run", state_dir) == cli.Backend.process

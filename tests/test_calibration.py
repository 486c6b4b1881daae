"""``precision=auto`` by measurement (genesis_fp16/calibration.py): the
decision follows the timings of the workload itself, the run's trajectory is
the chosen precision's, decisions are kept in the ledger and reused, and a
workload that cannot be measured is decided by the rule, said so.

The timings are injected (`calibration.time_step` patched; the steps still
run, so the loss check is real), so both paths run on any machine, alike
on every run.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from structlog.testing import capture_logs
from typer.testing import CliRunner

from genesis_fp16 import FP16Trainer, FP16TrainingConfig
from genesis_fp16 import calibration as cal
from genesis_fp16.cli import app
from genesis_fp16.guarded import UNGUARDED, GuardedTraining
from genesis_fp16.precision import capability
from genesis_fp16.rollout import LEDGER_FILE, RolloutLedger
from genesis_fp16.settings import PrecisionMode
from infrastructure.replay_buffer import Trajectory
from infrastructure.world_model import WorldModel

from conftest import CPU_KINDS

pytestmark = pytest.mark.usefixtures("one_thread")

# seconds per optimizer step, per precision: what the issue measured on a 2-core AMX host
# (one thread, thread CPU time): BF16 0.70x FP32 for the world model's size, 2.96x for a large MLP
AMX_SMALL = {"fp32": 1.0e-3, "bf16": 1.0e-3 / 0.70, "fp16": 1.0e-3 / 0.5}
AMX_LARGE = {"fp32": 30e-3, "bf16": 30e-3 / 2.96, "fp16": 30e-3 / 0.05}
# an AVX512-BF16 CPU without AMX: BF16 1.99x FP32 at bench size L
AVX512_LARGE = {"fp32": 30e-3, "bf16": 30e-3 / 1.99, "fp16": 30e-3 / 0.07}


@pytest.fixture
def measure(monkeypatch):
    """precision=auto measures (the suite's default is the rule); returns the timing injector."""
    monkeypatch.setenv("GENESIS_FP16_AUTO_PRECISION", "measure")
    calls: list[str] = []
    timings: dict[str, dict[str, float]] = {"now": {}}

    def fake_time_step(mode, run, steps, device):
        run()  # the copies train for real: the loss check and the RNG isolation are what runs
        calls.append(mode.value)
        return timings["now"][mode.value]

    monkeypatch.setattr(cal, "time_step", fake_time_step)

    class Injector:
        def set(self, table: dict[str, float]) -> None:
            timings["now"] = table

        @property
        def calls(self) -> list[str]:
            return calls

    return Injector()


def _flags(monkeypatch, kind: str) -> None:
    monkeypatch.setattr(capability, "cpu_flags", lambda: CPU_KINDS[kind])


def _mlp(hidden: int, seed: int = 0, dropout: float = 0.0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(8, hidden), torch.nn.ReLU(), torch.nn.Dropout(dropout), torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, 2),
    )


def _batch(n: int = 16, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=g), torch.randn(n, 2, generator=g)


def _mse(model: torch.nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return torch.nn.functional.mse_loss(model(x).float(), y)


def _auto_trainer(model: torch.nn.Module, **config) -> FP16Trainer:
    return FP16Trainer(model, torch.optim.Adam(model.parameters(), 1e-3), FP16TrainingConfig(precision="auto", **config))


def _train(trainer: FP16Trainer, steps: int = 4) -> None:
    for k in range(steps):
        trainer.backward_and_step(trainer.training_step(_batch(seed=k), _mse))


# -- the decision follows the workload's timings ------------------------------------------------
async def test_on_an_amx_cpu_a_large_mlp_trains_in_bf16_and_the_world_model_size_in_fp32(monkeypatch, measure):
    _flags(monkeypatch, "amx")
    measure.set(AMX_LARGE)
    large = _auto_trainer(_mlp(1536))
    assert large.calibration_pending and large.precision.name == "fp32"  # nothing has run yet
    _train(large, 1)
    assert large.precision.name == "bf16" and not large.calibration_pending
    assert large.calibration.speed["bf16"] == pytest.approx(2.96) and "fastest that passes" in large.auto_reason
    measure.set(AMX_SMALL)
    world_model = WorldModel(3, 1, seed=0)  # the size `genesis-fp16 evolve` trains by default
    report = await world_model.train(5, trajectories=_walk(), save=False)
    assert report.precision == "fp32" and world_model.training.trainer.calibration.speed["bf16"] == pytest.approx(0.70)
    assert capability.auto_precision("cpu")[0] == PrecisionMode.BF16  # the flag rule would have said bf16 for both


def test_on_an_avx512_bf16_cpu_without_amx_a_large_mlp_trains_in_bf16(monkeypatch, measure):
    _flags(monkeypatch, "avx512-bf16")
    measure.set(AVX512_LARGE)
    trainer = _auto_trainer(_mlp(1536))
    _train(trainer, 1)
    assert trainer.precision.name == "bf16"  # the flag rule keeps fp32 here
    assert capability.auto_precision("cpu")[0] == PrecisionMode.FP32


def test_within_the_margin_fp32_stays(monkeypatch, measure):
    measure.set({"fp32": 1.0e-3, "bf16": 1.0e-3 / 1.03, "fp16": 1.0e-3 / 1.04})
    trainer = _auto_trainer(_mlp(32))
    _train(trainer, 1)
    assert trainer.precision.name == "fp32" and "none at least 1.05x" in trainer.auto_reason


def test_a_precision_far_slower_at_the_probe_is_not_timed_further_nor_checked(measure):
    measure.set({"fp32": 1.0e-3, "bf16": 0.8e-3, "fp16": 10e-3})
    trainer = _auto_trainer(_mlp(32))
    _train(trainer, 1)
    assert measure.calls.count("fp16") == 1 and measure.calls.count("fp32") == 1 + cal.ROUNDS
    assert trainer.calibration.loss_ratio["fp16"] is None and not trainer.calibration.passed["fp16"]
    assert trainer.precision.name == "bf16"


def test_a_faster_precision_that_fails_the_fp32_loss_check_is_not_picked(monkeypatch, measure):
    measure.set({"fp32": 1.0e-3, "bf16": 0.5e-3, "fp16": 0.6e-3})
    real_loss = cal.final_loss
    factors = iter([1.0, 2.0, 1.0])  # checked in candidate order (fp32, bf16, fp16): bf16's copy twice FP32's loss

    def final_loss(model, batch, loss_fn):
        return real_loss(model, batch, loss_fn) * next(factors)

    monkeypatch.setattr(cal, "final_loss", final_loss)
    trainer = _auto_trainer(_mlp(32))
    _train(trainer, 1)
    assert trainer.calibration.passed == {"fp32": True, "bf16": False, "fp16": True}
    assert trainer.precision.name == "fp16" and "failed the FP32 check: bf16" in trainer.auto_reason


def test_decide_is_the_fastest_passing_precision_beyond_the_margin():
    seconds = {"fp32": 1.0, "bf16": 0.5, "fp16": 0.4}
    assert cal.decide(seconds, {"fp32": 1.0, "bf16": 1.0, "fp16": 1.0})[0] == "fp16"
    assert cal.decide(seconds, {"fp32": 1.0, "bf16": 1.0, "fp16": math.inf})[0] == "bf16"
    assert cal.decide(seconds, {"fp32": 1.0, "bf16": 1.31, "fp16": 1.5})[0] == "fp32"
    assert cal.decide({"fp32": 1.0}, {"fp32": 1.0})[0] == "fp32"


def test_loss_ratio_is_the_canary_rule_and_handles_negative_losses():
    assert cal.loss_ratio(1.2, 1.0) == pytest.approx(1.2)
    assert cal.loss_ratio(1e-5, 1e-6) == pytest.approx(1.009)  # over the floor (1e-3), not over a tiny loss
    assert cal.loss_ratio(-1.0, -2.0) == pytest.approx(1.5)  # an NLL that got worse by half its size
    assert cal.loss_ratio(-3.0, -2.0) < 1 and cal.loss_ratio(math.nan, 1.0) == math.inf


# -- the run is the chosen precision's ----------------------------------------------------------
def test_the_calibration_leaves_the_trajectory_and_the_rng_as_they_were(monkeypatch, measure):
    measure.set({"fp32": 1.0e-3, "bf16": 0.5e-3, "fp16": 5e-3})
    runs = {}
    for precision in ("auto", "bf16"):
        model = _mlp(32, dropout=0.2)  # dropout: the forward draws from torch's RNG
        trainer = FP16Trainer(model, torch.optim.Adam(model.parameters(), 1e-3), FP16TrainingConfig(precision=precision))
        torch.manual_seed(123)
        _train(trainer, 5)
        runs[precision] = ([p.detach().clone() for p in model.parameters()], torch.get_rng_state(), trainer.precision.name)
    assert runs["auto"][2] == runs["bf16"][2] == "bf16"
    assert all(torch.equal(a, b) for a, b in zip(runs["auto"][0], runs["bf16"][0]))
    assert torch.equal(runs["auto"][1], runs["bf16"][1])


def test_a_loss_that_trains_another_model_is_decided_by_the_rule_and_its_gradients_kept(monkeypatch, measure):
    measure.set({"fp32": 1.0e-3, "bf16": 0.5e-3, "fp16": 0.5e-3})
    _flags(monkeypatch, "avx2")
    model = _mlp(16)
    trainer = _auto_trainer(model)
    with capture_logs() as logs:
        assert trainer.calibrate(_batch(), lambda _copy, batch: _mse(model, batch)) is None  # PPO-like: its own network
    assert trainer.precision.name == "fp32" and all(p.grad is None for p in model.parameters())
    chosen = [e for e in logs if e["event"] == "precision.auto_selected"]
    assert chosen[-1]["source"] == "rule" and "trains another model" in chosen[-1]["reason"]
    assert chosen[-1]["log_level"] == "warning"


def test_autocast_before_any_training_step_is_decided_by_the_rule_and_said_so(monkeypatch, measure):
    _flags(monkeypatch, "amx")
    trainer = _auto_trainer(_mlp(16))
    with capture_logs() as logs:
        with trainer.autocast():
            loss = _mse(trainer.model, _batch())
    trainer.backward_and_step(loss)
    assert trainer.precision.name == "bf16" and "no batch to measure on" in trainer.auto_reason
    assert [e["source"] for e in logs if e["event"] == "precision.auto_selected"] == ["rule"]


def test_the_rule_setting_decides_at_construction(monkeypatch):
    monkeypatch.setenv("GENESIS_FP16_AUTO_PRECISION", "rule")
    _flags(monkeypatch, "amx")
    trainer = _auto_trainer(_mlp(16))
    assert not trainer.calibration_pending and trainer.precision.name == "bf16"


# -- kept in the ledger, reused, cleared -------------------------------------------------------------
def test_a_decision_is_reused_until_the_workload_changes(measure, state_dir):
    measure.set({"fp32": 1.0e-3, "bf16": 0.5e-3, "fp16": 5e-3})
    _train(_auto_trainer(_mlp(32)), 1)
    timed = len(measure.calls)
    again = _auto_trainer(_mlp(32, seed=7))  # other weights, same shapes: the same workload
    with capture_logs() as logs:
        _train(again, 1)
    assert len(measure.calls) == timed and again.precision.name == "bf16"
    assert [e["source"] for e in logs if e["event"] == "precision.auto_selected"] == ["cached"]
    bigger = _auto_trainer(_mlp(32))
    bigger.backward_and_step(bigger.training_step(_batch(n=64), _mse))  # another batch shape: measured again
    assert len(measure.calls) > timed
    assert len(RolloutLedger(state_dir / LEDGER_FILE).calibrations()) == 2


def test_a_corrupt_or_foreign_ledger_row_is_measured_again(measure, state_dir):
    measure.set({"fp32": 1.0e-3, "bf16": 0.5e-3, "fp16": 5e-3})
    first = _auto_trainer(_mlp(32))
    _train(first, 1)
    key = first.calibration.key
    ledger = RolloutLedger(state_dir / LEDGER_FILE)
    record = ledger.calibration(key)
    ledger.record_calibration({**record, "version": 0, "precision": "fp16"})  # another version's
    timed = len(measure.calls)
    second = _auto_trainer(_mlp(32))
    _train(second, 1)
    assert len(measure.calls) > timed and second.precision.name == "bf16"
    assert ledger.calibration(key)["version"] == cal.RECORD_VERSION


def test_the_record_round_trips_through_json(measure):
    measure.set({"fp32": 1.0e-3, "bf16": 0.5e-3, "fp16": 5e-3})
    trainer = _auto_trainer(_mlp(32))
    _train(trainer, 1)
    record = json.loads(json.dumps(trainer.calibration.as_record()))
    assert cal.Calibration.from_record(record) == trainer.calibration
    assert cal.Calibration.from_record({**record, "extra": 1}) is None
    assert cal.Calibration.from_record({**record, "speed": {"fp32": "fast"}}) is None


def test_the_workload_key_changes_with_what_the_timings_depend_on(monkeypatch):
    model, batch = _mlp(32), _batch()
    opt = torch.optim.Adam(model.parameters())
    base = cal.workload_key(cal.workload(model, opt, batch, "cpu"))
    assert base == cal.workload_key(cal.workload(_mlp(32, seed=3), opt, _batch(seed=9), "cpu"))
    assert base != cal.workload_key(cal.workload(model, opt, _batch(n=32), "cpu"))
    assert base != cal.workload_key(cal.workload(_mlp(48), opt, batch, "cpu"))
    assert base != cal.workload_key(cal.workload(model, torch.optim.SGD(model.parameters(), 0.1), batch, "cpu"))
    keys = set()
    for kind in ("amx", "avx2"):  # whatever this machine's flags are
        _flags(monkeypatch, kind)
        keys.add(cal.workload_key(cal.workload(model, opt, batch, "cpu")))
    assert len(keys) == 2


def test_doctor_lists_the_decisions_and_recalibrate_forgets_them(measure):
    measure.set({"fp32": 1.0e-3, "bf16": 0.5e-3, "fp16": 5e-3})
    _train(_auto_trainer(_mlp(32)), 1)
    runner = CliRunner()
    data = json.loads(runner.invoke(app, ["doctor", "--json"]).stdout)
    assert data["auto_decides_by"] == "measure" and len(data["calibrations"]) == 1
    assert data["calibrations"][0]["precision"] == "bf16" and data["calibrations"][0]["speed"]["bf16"] == pytest.approx(2.0)
    human = runner.invoke(app, ["doctor"]).stdout
    assert "auto's measured decisions (1" in human and "bf16 2.00x" in human
    data = json.loads(runner.invoke(app, ["doctor", "--json", "--recalibrate"]).stdout)
    assert data["calibrations_cleared"] == 1 and data["calibrations"] == []


# -- guarded training and the world model --------------------------------------------------------
def test_guarded_training_sets_up_the_shadow_once_auto_has_measured(measure, state_dir):
    measure.set({"fp32": 1.0e-3, "bf16": 0.5e-3, "fp16": 5e-3})
    ledger = RolloutLedger(state_dir / LEDGER_FILE)
    ledger.enable("wm", shadow=True)
    model = _mlp(32)
    training = GuardedTraining("wm", model, torch.optim.Adam(model.parameters(), 1e-3))
    assert training.trainer.calibration_pending and training.policy.precision == "auto"
    report = training.run([_batch(seed=k) for k in range(3)], _mse, val_fn=lambda m, t: float(_mse(m, _batch(seed=99)).detach()))
    assert report.precision == "bf16" and report.reference == "shadow" and report.fp32_val_loss is not None
    assert training.policy.running == "bf16" and training.good_path.is_file()


def test_unguarded_training_measures_too(measure):
    measure.set({"fp32": 1.0e-3, "bf16": 1.5e-3, "fp16": 5e-3})
    model = _mlp(32)
    training = GuardedTraining("wm", model, torch.optim.Adam(model.parameters(), 1e-3), guard=UNGUARDED)
    report = training.run([_batch(seed=k) for k in range(2)], _mse)
    assert report.precision == "fp32" and training.trainer.calibration is not None


def _walk(n: int = 8, length: int = 60) -> list[Trajectory]:
    rng = np.random.default_rng(0)
    out = []
    for k in range(n):
        obs = rng.normal(size=(length, 3)).astype(np.float32)
        act = rng.uniform(-1, 1, size=(length, 1)).astype(np.float32)
        nxt = obs + 0.1 * act
        out.append(Trajectory(obs=obs, action=act, reward=-(obs**2).sum(1), next_obs=nxt, done=np.zeros(length, bool), candidate=f"c{k}", id=k + 1))
    return out


async def test_the_world_model_trains_in_what_auto_measured_as_a_named_precision_would(measure):
    measure.set({"fp32": 1.0e-3, "bf16": 0.6e-3, "fp16": 5e-3})
    measured = WorldModel(3, 1, seed=0, hidden=32)
    report = await measured.train(30, trajectories=_walk(), save=False)
    named = WorldModel(3, 1, seed=0, hidden=32, precision="bf16")
    expected = await named.train(30, trajectories=_walk(), save=False)
    assert report.precision == expected.precision == "bf16"
    assert report.val_loss == expected.val_loss  # same seed, same result: the calibration changed nothing
    measure.set({"fp32": 1.0e-3, "bf16": 1.4e-3, "fp16": 5e-3})
    slower = WorldModel(3, 1, seed=0, hidden=48)
    assert (await slower.train(10, trajectories=_walk(), save=False)).precision == "fp32"


def test_ppo_auto_measures_its_update_on_copies_of_its_own_network(measure):
    from agents.ppo.config import load_config
    from agents.ppo.ppo import PPO

    measure.set({"fp32": 1.0e-3, "bf16": 0.5e-3, "fp16": 5e-3})
    cfg = load_config(None, env_id="CartPole-v1", num_envs=2, num_steps=16, minibatch_size=16, update_epochs=1,
                      total_steps=32, eval_episodes=1, vec_env="sync", device="cpu", precision="auto")
    ppo = PPO(cfg)
    try:
        with capture_logs() as logs:
            ppo.train()
    finally:
        ppo.close()
    assert ppo.trainer.precision.name == "bf16"
    assert [e["source"] for e in logs if e["event"] == "precision.auto_selected"] == ["measured"]


def test_a_precision_that_cannot_run_the_workload_is_out_and_the_others_still_decide(measure):
    measure.set({"fp32": 1.0e-3, "bf16": 0.5e-3, "fp16": 0.4e-3})

    class NoHalf(torch.nn.Module):  # as oneDNN's LSTM on a CPU: no FP16 kernel
        def __init__(self):
            super().__init__()
            self.body = _mlp(16)

        def forward(self, x):
            if torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.float16:
                raise RuntimeError("could not create a primitive descriptor for the forward propagation primitive")
            return self.body(x)

    trainer = _auto_trainer(NoHalf())
    _train(trainer, 1)
    assert trainer.precision.name == "bf16" and set(trainer.calibration.seconds) == {"fp32", "bf16"}
    assert "primitive descriptor" in trainer.calibration.failed["fp16"] and "fp16 could not run" in trainer.auto_reason

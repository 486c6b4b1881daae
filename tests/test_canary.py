"""The FP32 canary in rollout stage on: its schedule, the FP32 copy it
trains, the guard's confirmation window, the threshold defaults, and a
world model whose reduced-precision path is quietly worse being rolled back."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from genesis_fp16.rollout.canary import canary_due, fp32_reference, policy_gap
from genesis_fp16.rollout.guard import RollbackGuard
from genesis_fp16.rollout.profiles import THRESHOLD_DEFAULTS, GuardThresholds, ProfileError, parse_profiles
from genesis_fp16.training.registry import create_trainer, trainer_for
from genesis_fp16.rollout.ledger import RolloutLedger
from genesis_fp16.base.settings import load_settings
from infrastructure.replay_buffer import Trajectory
from infrastructure.world_model import WorldModel

pytestmark = pytest.mark.usefixtures("one_thread")


def _trajs(n: int = 3, length: int = 50, seed: int = 0) -> list[Trajectory]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        obs = rng.normal(size=(length, 3))
        act = rng.uniform(-1, 1, size=(length, 1))
        nxt = obs + 0.1 * np.tanh(obs) + 0.2 * act
        rew = -(obs**2).sum(axis=1)
        out.append(
            Trajectory(
                obs=obs, action=act, reward=rew, next_obs=nxt, done=np.zeros(length, bool), candidate=f"c{k}", id=k + 1
            )
        )
    return out


def test_canary_schedule_every_nth_call_and_zero_turns_it_off():
    assert [c for c in range(1, 16) if canary_due(c, 5)] == [5, 10, 15]
    assert [c for c in range(1, 5) if canary_due(c, 1)] == [1, 2, 3, 4]
    assert not any(canary_due(c, 0) for c in range(0, 20))
    assert not canary_due(0, 5)


def test_threshold_defaults():
    assert THRESHOLD_DEFAULTS["canary_every"] == 5
    assert THRESHOLD_DEFAULTS["canary_confirm"] == 2 and THRESHOLD_DEFAULTS["canary_window"] == 3
    assert THRESHOLD_DEFAULTS["canary_kl"] == 0.1  # VeRL's rollout-correction alarm
    # over the 95th percentile of FP32's seed-to-seed gap on every workload measured (docs/ROLLBACK_PLAN.md)
    assert THRESHOLD_DEFAULTS["canary_val_loss_ratio"] == 1.30
    assert THRESHOLD_DEFAULTS["val_loss_ratio"] == 1.20  # stage shadow: an FP32 copy trained beside it all along
    with pytest.raises(ValueError):
        GuardThresholds(canary_every=-1)


def test_confirm_over_window_is_refused_in_a_profile():
    with pytest.raises(ProfileError, match="canary_confirm .* must not exceed"):
        parse_profiles({"agents": {"wm": {"thresholds": {"canary_confirm": 3, "canary_window": 2}}}})


def test_fp32_reference_copies_weights_and_optimizer_state_without_sharing():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    trainer = create_trainer("fp32", model, opt)
    batch = (torch.randn(8, 4), torch.randn(8, 1))

    def loss(m, b):
        return ((m(b[0]) - b[1]) ** 2).mean()

    trainer.backward_and_step(trainer.training_step(batch, loss))
    ref_model, ref_trainer = fp32_reference(model, opt, trainer, "x.fp32_canary")
    assert ref_trainer.precision.name == "fp32" and ref_trainer.name == "x.fp32_canary"
    before = {k: v.clone() for k, v in opt.state[model.weight].items()}
    ref_trainer.backward_and_step(ref_trainer.training_step(batch, loss))
    # the copy's step moved its own moments, not the original's
    assert all(torch.equal(before[k], v) for k, v in opt.state[model.weight].items())
    # same batches from the same state: the original's next step lands where the copy's did
    trainer.backward_and_step(trainer.training_step(batch, loss))
    assert torch.equal(model.weight, ref_model.weight)


def _guard(agent: str = "wm", **thresholds) -> RollbackGuard:
    settings = load_settings()
    ledger = RolloutLedger.from_settings(settings)
    ledger.enable(agent, actor="test")
    return RollbackGuard(agent, settings=settings, ledger=ledger, thresholds=thresholds or None)


def _bf16_trainer():
    model = torch.nn.Linear(2, 1)
    return trainer_for("wm", model, torch.optim.SGD(model.parameters(), lr=0.1), precision="bf16")


def test_one_noisy_canary_does_not_roll_back_two_of_three_do():
    guard = _guard()
    trainer = _bf16_trainer()
    guard.attach(trainer)
    bad, good = dict(val_loss=2.0, fp32_val_loss=1.0), dict(val_loss=1.0, fp32_val_loss=1.0)
    assert guard.check(trainer, **bad, reference="canary").action == "none"  # 1 alarm of 1
    assert guard.check(trainer, **good, reference="canary").action == "none"
    decision = guard.check(trainer, **bad, reference="canary")  # 2 alarms of the last 3
    assert decision.severity == "P1" and decision.action == "rollback" and "canary, confirmed" in decision.reason
    assert guard.ledger.stage("wm") == "rolled_back"
    checks = guard.ledger.quality_checks("wm", kind="canary")
    assert [c["alarm"] for c in checks] == [True, False, True]
    assert checks[-1]["metrics"]["confirmed"] is True and checks[-1]["metrics"]["val_loss_ratio"] == 2.0


def test_alarms_outside_the_window_are_forgotten():
    guard = _guard(canary_confirm=2, canary_window=2)
    trainer = _bf16_trainer()
    guard.attach(trainer)
    for val in (2.0, 1.0, 2.0, 1.0, 2.0):  # never two alarms in the last two
        assert guard.check(trainer, val_loss=val, fp32_val_loss=1.0, reference="canary").action == "none"
    # a shadow gap needs no confirmation
    assert guard.check(trainer, val_loss=2.0, fp32_val_loss=1.0).action == "rollback"


def test_policy_gap_and_policy_canary():
    logp = torch.tensor([-1.0, -2.0, -0.5])
    same = policy_gap(logp, logp, torch.ones(3), torch.ones(3))
    assert same == {"kl": 0.0, "max_logp_delta": 0.0, "max_value_delta": 0.0}
    gap = policy_gap(logp + torch.tensor([0.0, 1.5, 0.0]), logp, torch.tensor([1.0, 1.0, 3.0]), torch.ones(3))
    assert (
        gap["max_logp_delta"] == pytest.approx(1.5) and gap["kl"] > 0 and gap["max_value_delta"] == pytest.approx(2.0)
    )
    guard = _guard("ppo_x")
    trainer = _bf16_trainer()
    guard.attach(trainer)
    assert guard.check_policy_canary(trainer, **same).action == "none"
    assert guard.check_policy_canary(trainer, **gap).action == "none"  # one alarm
    decision = guard.check_policy_canary(trainer, **gap)
    assert decision.action == "rollback" and "policy canary" in decision.reason
    assert [c["alarm"] for c in guard.ledger.quality_checks("ppo_x", kind="policy_canary")] == [False, True, True]


def _quantise_under_autocast(module, inputs, output):
    """The injected fault: outputs coarsely rounded when autocast is on (the
    reduced-precision path only), no NaN, no overflow."""
    if torch.is_autocast_enabled("cpu"):
        return torch.round(output)  # steps of one standard deviation of the normalised targets
    return output


async def test_world_model_canary_runs_on_schedule_and_catches_a_quietly_worse_model(tmp_path):
    guard = _guard("world_model", canary_every=2)
    wm = WorldModel(3, 1, guard=guard, settings=guard.settings, precision="bf16", checkpoint_dir=tmp_path, hidden=16)
    trajs = _trajs()
    reports = [await wm.train(20, trajectories=trajs) for _ in range(4)]
    assert [r.reference for r in reports] == [None, "canary", None, "canary"]
    assert all(not r.rolled_back and r.precision == "bf16" for r in reports)
    assert reports[1].fp32_val_loss is not None and abs(reports[1].shadow_gap) < 0.2
    assert len(guard.ledger.quality_checks("world_model", kind="canary")) == 2
    good = reports[-1].checkpoint
    wm.model.register_forward_hook(_quantise_under_autocast)
    caught = None
    for call in range(1, 5):  # 2 x canary_every calls
        report = await wm.train(20, trajectories=trajs)
        if report.rolled_back:
            caught = call
            break
    assert caught == 4, "two confirmed canary alarms within 2 x canary_every calls"
    assert report.precision == "fp32" and guard.ledger.stage("world_model") == "rolled_back"
    assert f"restored {good}" in report.events and "canary" in report.rollback_reason
    assert wm.trainer.precision.name == "fp32"


async def test_canary_every_zero_never_trains_a_copy(tmp_path):
    guard = _guard("world_model", canary_every=0)
    wm = WorldModel(3, 1, guard=guard, settings=guard.settings, precision="bf16", checkpoint_dir=tmp_path, hidden=16)
    reports = [await wm.train(10, trajectories=_trajs(), save=False) for _ in range(3)]
    assert all(r.reference is None and r.fp32_val_loss is None for r in reports)


async def test_every_call_reports_the_inference_side_gap(tmp_path):
    guard = _guard("world_model", canary_every=0)
    wm = WorldModel(3, 1, guard=guard, settings=guard.settings, precision="bf16", checkpoint_dir=tmp_path, hidden=16)
    healthy = await wm.train(100, trajectories=_trajs(), save=False)
    assert healthy.inference_val_loss_fp32 is not None and abs(healthy.inference_gap) < 0.05
    assert healthy.inference_gap == pytest.approx(
        (healthy.val_loss - healthy.inference_val_loss_fp32) / healthy.inference_val_loss_fp32
    )
    wm.model.register_forward_hook(_quantise_under_autocast)
    degraded = await wm.train(100, trajectories=_trajs(), save=False)
    assert degraded.inference_gap > 0.1  # the fault is in the forward only: the weights are as good as before
    recorded = guard.ledger.quality_checks("world_model", kind="inference_gap")
    assert len(recorded) == 2 and recorded[-1]["precision"] == "bf16"
    assert recorded[-1]["metrics"]["gap"] == pytest.approx(degraded.inference_gap)


async def test_fp32_has_no_inference_gap(tmp_path):
    wm = WorldModel(3, 1, precision="fp32", checkpoint_dir=tmp_path, hidden=16)
    report = await wm.train(10, trajectories=_trajs(), save=False)
    assert report.inference_gap == 0.0 and report.inference_val_loss_fp32 == report.val_loss

"""RollbackGuard on a bare trainer (P0/P1/P2, thresholds from the profile,
events), and the acceptance path through WorldModel and ReplayBuffer: a NaN
storm rolls one agent back, its next train() runs in FP32, the last good
checkpoint is restored, the replay buffer is intact, another agent is unaffected."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from genesis_fp16.base import telemetry
from genesis_fp16.rollout.guard import GuardDecision, RollbackGuard
from genesis_fp16.training.registry import trainer_for
from genesis_fp16.rollout.ledger import RolloutLedger
from genesis_fp16.base.settings import load_settings
from loss_faults import loss_fault


def _mse(model, batch):
    x, y = batch
    return ((model(x).float() - y) ** 2).mean()


def _setup(agent="wm", precision="bf16", stage="on", **guard_kwargs):
    settings = load_settings()
    ledger = RolloutLedger.from_settings(settings)
    if stage:
        ledger.enable(agent)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    trainer = trainer_for(agent, model, opt, settings=settings, precision=precision)
    guard = RollbackGuard(agent, settings=settings, ledger=ledger, **guard_kwargs)
    guard.attach(trainer)
    g = torch.Generator().manual_seed(0)
    batch = (torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g))
    return trainer, guard, ledger, batch


def _step(trainer, batch, nan=False):
    loss = trainer.training_step(batch, _mse)
    return trainer.backward_and_step(loss * float("nan") if nan else loss)


def _overflow_hook(trainer, every):
    count = {"n": 0}

    def hook(grad):
        count["n"] += 1
        return grad * float("inf") if count["n"] % every == 0 else grad

    return trainer.model[0].weight.register_hook(hook)


def test_p0_nonfinite_streak_trips_at_once(state_dir):
    trainer, guard, ledger, batch = _setup()
    for _ in range(5):
        _step(trainer, batch)
    assert guard.tripped is None
    for k in range(3):
        _step(trainer, batch, nan=True)
        assert (guard.tripped is not None) == (k == 2)  # at the streak threshold (3), not before
    trip = guard.tripped
    assert trip.severity == "P0" and trip.action == "rollback" and trip.restore_checkpoint
    assert ledger.stage("wm") == "rolled_back"
    last = ledger.history("wm")[-1]
    assert last["actor"] == "guard" and last["severity"] == "P0" and "non-finite loss streak" in last["reason"]
    events = telemetry.read_events(state_dir / "events.jsonl")
    rb = [e for e in events if e["event"] == "guard.rollback"]
    assert len(rb) == 1 and rb[0]["agent"] == "wm" and rb[0]["severity"] == "P0" and rb[0]["precision"] == "bf16"
    # more NaNs do not roll back twice; check() on the tripped trainer returns the same decision
    _step(trainer, batch, nan=True)
    assert guard.check(trainer) is trip
    assert len(ledger.history("wm")) == 2


def test_p0_more_than_half_failing(state_dir):
    trainer, guard, ledger, batch = _setup(thresholds={"min_steps": 10})
    trainer.config.nonfinite_streak_threshold = 100  # only the fraction can trip
    for k in range(20):
        _step(trainer, batch, nan=(k % 3 != 0))  # 2 of 3 fail, never more than 2 in a row
        if guard.tripped:
            break
    assert guard.tripped is not None and guard.tripped.severity == "P0"
    # judged on each failed step from min_steps on: step 10 succeeds, step 11 fails (7 of 11)
    assert trainer.training_steps == 11
    assert "steps failed" in guard.tripped.reason and ledger.stage("wm") == "rolled_back"


def test_p1_overflow_storm_rolls_back(state_dir):
    trainer, guard, ledger, batch = _setup(precision="fp16")
    handle = _overflow_hook(trainer, every=2)
    for _ in range(20):
        _step(trainer, batch)
    handle.remove()
    decision = guard.check()
    assert trainer.get_stats()["overflow_rate"] == pytest.approx(0.5)
    assert decision.severity == "P1" and decision.action == "rollback" and not decision.restore_checkpoint
    assert "overflow rate 50%" in decision.reason
    assert ledger.stage("wm") == "rolled_back" and guard.tripped is None
    # judging the same trainer again returns the same decision and does not roll back twice
    assert guard.check() is decision
    assert [h["to_stage"] for h in ledger.history("wm")].count("rolled_back") == 1


def test_p2_overflow_warns_and_recommends(state_dir):
    trainer, guard, ledger, batch = _setup(precision="fp16")
    handle = _overflow_hook(trainer, every=5)
    for _ in range(20):
        _step(trainer, batch)
    handle.remove()
    decision = guard.check()
    assert decision.severity == "P2" and decision.action == "warn"
    assert decision.recommendation["changes"]["growth_interval"] == 4000
    assert decision.recommendation["changes"]["init_scale"] <= trainer.current_scale
    assert ledger.stage("wm") == "on"
    recs = ledger.recommendations("wm")
    assert len(recs) == 1 and recs[0]["severity"] == "P2"
    names = [e["event"] for e in telemetry.read_events(state_dir / "events.jsonl")]
    assert "guard.recommendation" in names


def test_rates_not_judged_before_min_steps(state_dir):
    trainer, guard, ledger, batch = _setup(precision="fp16")
    handle = _overflow_hook(trainer, every=1)
    for _ in range(5):
        _step(trainer, batch)
    handle.remove()
    assert trainer.overflow_rate == 1.0
    assert guard.check().action == "none" and ledger.stage("wm") == "on"


@pytest.mark.parametrize(
    "val, ref, severity, action",
    [(1.10, 1.0, None, "none"), (1.35, 1.0, "P1", "rollback"), (float("nan"), 1.0, "P1", "rollback")],
)
def test_val_loss_against_fp32_reference(state_dir, val, ref, severity, action):
    trainer, guard, ledger, batch = _setup()
    decision = guard.check(trainer, val_loss=val, fp32_val_loss=ref)
    assert (decision.severity, decision.action) == (severity, action)
    assert ledger.stage("wm") == ("rolled_back" if action == "rollback" else "on")


def test_throughput_warns_with_fp32_recommendation(state_dir):
    trainer, guard, ledger, batch = _setup()
    assert guard.check(trainer, throughput_ratio=0.9).action == "none"
    decision = guard.check(trainer, throughput_ratio=0.7)
    assert decision.severity == "P2" and decision.recommendation["changes"] == {"precision": "fp32"}
    assert ledger.stage("wm") == "on"


def test_fp32_trainer_has_nothing_to_roll_back(state_dir):
    trainer, guard, ledger, batch = _setup(precision="fp32")
    for _ in range(3):
        _step(trainer, batch, nan=True)
    assert guard.tripped is None and guard.decisions[-1].action == "warn"
    assert "already FP32" in guard.decisions[-1].reason and ledger.stage("wm") == "on"


def test_thresholds_from_profile(state_dir):
    (state_dir / "profiles.toml").write_text("[agents.wm.thresholds]\noverflow_rollback = 0.15\noverflow_warn = 0.05\n")
    trainer, guard, ledger, batch = _setup(precision="fp16")
    assert guard.thresholds["overflow_rollback"] == 0.15
    handle = _overflow_hook(trainer, every=5)
    for _ in range(20):
        _step(trainer, batch)
    handle.remove()
    assert guard.check().severity == "P1"  # 20% is P2 by default, P1 under this profile
    with pytest.raises(ValueError, match="unknown threshold"):
        RollbackGuard("wm", thresholds={"speed": 1})


def test_last_good_checkpoint_kept_in_ledger_and_reset(state_dir, tmp_path):
    trainer, guard, ledger, batch = _setup()
    _step(trainer, batch)
    path = trainer.save_checkpoint(tmp_path / "good.pt")
    guard.record_good_checkpoint(path)
    fresh = RollbackGuard("wm", settings=load_settings())
    assert fresh.last_good_checkpoint == path.resolve()
    for _ in range(3):
        _step(trainer, batch, nan=True)
    assert guard.tripped is not None
    guard.reset()
    assert guard.tripped is None and guard.last_good_checkpoint == path


def test_events_of_a_replaced_trainer_are_ignored(state_dir):
    trainer, guard, ledger, batch = _setup()
    newer = trainer_for("wm", trainer.model, trainer.optimizer, precision="bf16")
    guard.attach(newer)
    for _ in range(3):
        _step(trainer, batch, nan=True)
    assert guard.tripped is None and ledger.stage("wm") == "on"


def test_decision_as_dict():
    d = GuardDecision("P2", "warn", "x", False, {"changes": {}}, {"a": 1}).as_dict()
    assert d["severity"] == "P2" and d["metrics"] == {"a": 1}


# -- acceptance through the world model -------------------------------------------------

infra = pytest.importorskip("infrastructure.world_model")
from infrastructure.replay_buffer import ReplayBuffer, Trajectory  # noqa: E402


def _trajs(n=4, length=60, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        obs = rng.normal(size=(length, 3)).astype(np.float32)
        act = rng.uniform(-1, 1, size=(length, 1)).astype(np.float32)
        nxt = obs * 0.9 + 0.1 * act
        rew = -(obs**2).sum(axis=1)
        out.append(
            Trajectory(obs=obs, action=act, reward=rew, next_obs=nxt, done=np.zeros(length, bool), candidate=f"c{k}")
        )
    return out


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


async def test_nan_storm_rolls_back_one_agent_only(state_dir, one_thread):
    settings = load_settings()
    ledger = RolloutLedger.from_settings(settings)
    buffer = ReplayBuffer(settings=settings)
    buffer.append_generation("se_darwin", 0, _trajs())
    count_before = buffer.count()
    sample_before = [t.obs.copy() for t in buffer.sample("se_darwin")]
    models = {}
    for agent in ("wm_a", "wm_b"):
        ledger.enable(agent, actor="test")
        guard = RollbackGuard(agent, settings=settings, ledger=ledger)
        models[agent] = infra.WorldModel(
            3, 1, buffer=buffer, agent=agent, guard=guard, settings=settings, precision="bf16", batch_size=64
        )
    a, b = models["wm_a"], models["wm_b"]

    first = await a.train(30)
    await b.train(30)
    assert not first.rolled_back and first.precision == "bf16"
    good = a.guard.last_good_checkpoint
    assert good is not None and str(good) == str(first.checkpoint)

    def storm(step, loss):
        return loss * float("nan") if 5 <= step < 12 else loss

    with loss_fault(a, storm):
        hit = await a.train(30)
    assert hit.rolled_back and hit.rollback_reason.startswith("P0")
    assert ledger.stage("wm_a") == "rolled_back"
    assert "non-finite loss streak" in ledger.history("wm_a")[-1]["reason"]
    loaded = [
        e
        for e in telemetry.read_events(state_dir / "events.jsonl")
        if e["event"] == "checkpoint.loaded" and e.get("trainer") == "wm_a"
    ]
    assert loaded and loaded[-1]["path"] == str(good)  # the last good checkpoint was restored

    after = await a.train(30)  # the next train() runs in FP32 and finishes
    assert after.precision == "fp32" and not after.rolled_back
    assert math.isfinite(after.val_loss) and math.isfinite(after.train_loss)

    assert buffer.count() == count_before
    assert all(np.array_equal(x, t.obs) for x, t in zip(sample_before, buffer.sample("se_darwin")))

    other = await b.train(30)
    assert ledger.stage("wm_b") == "on" and other.precision == "bf16" and not other.rolled_back
    assert b.guard.tripped is None


async def test_shadow_stage_records_gap_in_ledger(state_dir, one_thread):
    settings = load_settings()
    ledger = RolloutLedger.from_settings(settings)
    ledger.enable("wm_s", shadow=True)
    guard = RollbackGuard("wm_s", settings=settings, ledger=ledger)
    wm = infra.WorldModel(3, 1, agent="wm_s", guard=guard, settings=settings, precision="bf16", batch_size=64)
    report = await wm.train(40, trajectories=_trajs(), save=False)
    gaps = ledger.shadow_gaps("wm_s")
    assert len(gaps) == 1 and gaps[0]["precision"] == "bf16"
    assert gaps[0]["gap"] == pytest.approx(report.shadow_gap)
    assert ledger.status()[0]["last_shadow_gap"]["fp32_val_loss"] == pytest.approx(report.fp32_val_loss)


def test_recover_builds_restores_once_and_watches_the_new_trainer(state_dir):
    trainer, guard, ledger, batch = _setup()
    for _ in range(3):
        _step(trainer, batch)
    guard.record_good_checkpoint(trainer.save_checkpoint(state_dir / "good.pt"))
    weights = trainer.model[0].weight.detach().clone()
    for _ in range(3):
        _step(trainer, batch, nan=True)
    assert guard.tripped is not None and ledger.stage("wm") == "rolled_back"
    settings = load_settings()
    rebuilt, restored = guard.recover(lambda: trainer_for("wm", trainer.model, trainer.optimizer, settings=settings))
    assert restored == state_dir / "good.pt" and guard.tripped is None and guard.trainer is rebuilt
    assert (
        rebuilt.precision.name == "fp32" and rebuilt.training_steps == 3
    )  # the ledger's FP32, the checkpoint's counters
    torch.testing.assert_close(rebuilt.model[0].weight, weights)


# -- one noise-aware rule for the shadow; the windows and the canary's schedule in the ledger ----------


def test_shadow_within_fp32_spread_is_not_rolled_back_a_confirmed_gap_is(state_dir):
    settings = load_settings()
    RolloutLedger.from_settings(settings).enable("wm", shadow=True)
    trainer, guard, ledger, batch = _setup(stage=None)
    for _ in range(4):  # the PointMass case: 1.21x on losses of about 2e-4, one call after another
        assert guard.check(trainer, val_loss=2.18e-4, fp32_val_loss=1.8e-4, reference="shadow").action == "none"
    assert guard.check(trainer, val_loss=1.25, fp32_val_loss=1.0, reference="shadow").action == "none"  # one alarm
    assert ledger.stage("wm") == "shadow"
    decision = guard.check(trainer, val_loss=1.25, fp32_val_loss=1.0, reference="shadow")  # the second of the last 3
    assert (decision.severity, decision.action) == (
        "P1",
        "rollback",
    ) and "confirmed by 2 of the last 3" in decision.reason
    assert ledger.stage("wm") == "rolled_back" and ledger.guard_window("wm", "shadow") == []  # a rollback clears it


def _bf16_guard(agent="wm", **thresholds):
    """A new ledger object, guard and trainer on the state dir: what a new process opens."""
    settings = load_settings()
    ledger = RolloutLedger.from_settings(settings)
    model = torch.nn.Linear(2, 1)
    trainer = trainer_for(
        agent, model, torch.optim.SGD(model.parameters(), lr=0.1), settings=settings, precision="bf16"
    )
    guard = RollbackGuard(agent, settings=settings, ledger=ledger, thresholds=thresholds or None)
    guard.attach(trainer)
    return guard, trainer


def test_a_confirmation_begun_in_one_process_is_completed_in_the_next(state_dir):
    RolloutLedger.from_settings(load_settings()).enable("wm")
    first, trainer = _bf16_guard()
    assert first.check(trainer, val_loss=2.0, fp32_val_loss=1.0, reference="canary").action == "none"  # 1 alarm of 1
    second, trainer = _bf16_guard()  # another process: nothing in memory
    decision = second.check(trainer, val_loss=2.0, fp32_val_loss=1.0, reference="canary")
    assert decision.action == "rollback" and "canary, confirmed" in decision.reason
    assert [c["metrics"]["alarms"] for c in second.ledger.quality_checks("wm", kind="canary")] == [1, 2]


def test_canary_schedule_goes_on_across_processes_and_restarts_with_the_stage(state_dir):
    ledger = RolloutLedger.from_settings(load_settings())
    ledger.enable("wm")
    first, _ = _bf16_guard(canary_every=3)
    assert [first.canary_due() for _ in range(2)] == [False, False]
    second, _ = _bf16_guard(canary_every=3)
    assert [second.canary_due() for _ in range(4)] == [True, False, False, True]  # calls 3..6
    assert ledger.canary_calls("wm") == 6
    ledger.enable("wm", shadow=True)
    ledger.enable("wm")  # a new stage on: the first canary comes at call canary_every again
    assert ledger.canary_calls("wm") == 0 and [second.canary_due() for _ in range(3)] == [False, False, True]
    assert not any(_bf16_guard("other", canary_every=0)[0].canary_due() for _ in range(3))


def test_thresholds_are_typed_and_overrides_validated(state_dir):
    _, guard, _, _ = _setup()
    assert guard.thresholds.canary_window == 3 and guard.thresholds["canary_window"] == 3
    with pytest.raises(ValueError, match="unknown threshold"):
        _setup(thresholds={"canary_windw": 2})
    with pytest.raises(ValueError, match="canary_every = -1 is invalid"):
        _setup(thresholds={"canary_every": -1})


def test_a_confirmation_begun_by_another_process_is_completed_here(state_dir):
    import subprocess
    import sys

    RolloutLedger.from_settings(load_settings()).enable("wm")
    code = (
        "from genesis_fp16.rollout.guard import RollbackGuard\n"
        "g = RollbackGuard('wm')\n"
        "assert g.canary_due() is False\n"
        "print(g.check(val_loss=2.0, fp32_val_loss=1.0, reference='canary').action)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "none", out.stderr  # one alarm of one
    guard, trainer = _bf16_guard()
    assert guard.ledger.canary_calls("wm") == 1
    assert guard.check(trainer, val_loss=2.0, fp32_val_loss=1.0, reference="canary").action == "rollback"


def test_the_failure_window_restarts_at_a_rollback(state_dir, tmp_path):
    """A storm rolled back is not judged again: the restored FP32 trainer carries
    the checkpoint's counters (most of them failed steps), and its next healthy
    steps, and one NaN among them, raise no P0 and no warning."""
    from structlog.testing import capture_logs

    trainer, guard, ledger, batch = _setup(thresholds={"min_steps": 4})
    _step(trainer, batch)
    for _ in range(3):
        _step(trainer, batch, nan=True)
    assert guard.tripped is not None and guard.tripped.severity == "P0"
    stormy = tmp_path / "stormy.pt"
    trainer.save_checkpoint(stormy)  # 3 of 4 steps failed: the counters a restored trainer starts from
    guard.record_good_checkpoint(stormy)
    settings = load_settings()
    fresh, restored = guard.recover(
        lambda: trainer_for("wm", trainer.model, trainer.optimizer, settings=settings),
        lambda t, path: t.load_checkpoint(path),
    )
    assert restored == stormy
    assert fresh.precision.name == "fp32" and fresh.skipped_steps == 3  # the counters came back with the checkpoint
    with capture_logs() as logs:
        _step(fresh, batch, nan=True)
        for _ in range(4):
            _step(fresh, batch)
        verdict = guard.check(fresh)
    assert guard.tripped is None and verdict.severity is None, verdict
    assert verdict.metrics["training_steps"] == 5 and verdict.metrics["failed_step_rate"] == pytest.approx(0.2)
    assert not [e for e in logs if e["event"].startswith("guard.") and e["log_level"] in ("warning", "error")], logs

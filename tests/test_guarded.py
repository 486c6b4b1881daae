"""GuardedTraining: a bare trainer under the guard, with the rollback done
once (rebuild in FP32 through the registry, restore the last good checkpoint,
clear the trip), and every later step kept. The recipe in
docs/ROLLBACK_PLAN.md is run here as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from genesis_fp16.training import registry
from genesis_fp16.rollout.guard import RollbackGuard
from genesis_fp16.training.guarded import UNGUARDED, GuardedTraining
from genesis_fp16.rollout.ledger import RolloutLedger
from genesis_fp16.base.settings import load_settings

pytestmark = pytest.mark.usefixtures("one_thread")

DOC = Path(__file__).resolve().parents[1] / "docs" / "ROLLBACK_PLAN.md"


def _loss_fn(model, batch):
    x, y = batch
    return ((model(x).float() - y) ** 2).mean()


def _model_and_opt():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def _batches(good_before=8, storm=5, good_after=10):
    """``storm`` NaN batches (NaN targets, so a NaN loss) between good ones."""
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(good_before + storm + good_after):
        x, y = torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g)
        if good_before <= i < good_before + storm:
            y = torch.full_like(y, float("nan"))
        out.append((x, y))
    return out


@pytest.fixture
def builds(monkeypatch):
    """Count the trainers GuardedTraining builds through the registry."""
    made = []
    real = registry.resolve_trainer

    def counting(*args, **kwargs):
        built = real(*args, **kwargs)
        made.append(built.trainer)
        return built

    monkeypatch.setattr(registry, "resolve_trainer", counting)
    return made


def _rolled_out(agent):
    RolloutLedger.from_settings(load_settings()).enable(agent)


def _doc_recipe() -> str:
    text = DOC.read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    recipe = [b for b in blocks if "GuardedTraining(" in b]
    assert len(recipe) == 1, f"expected one python block using GuardedTraining in {DOC.name}, found {len(recipe)}"
    return recipe[0]


def test_rollback_plan_recipe_runs_as_written(state_dir, builds, monkeypatch):
    monkeypatch.setenv("GENESIS_FP16_PRECISION", "bf16")
    _rolled_out("my_agent")
    model, optimizer = _model_and_opt()
    namespace = {
        "model": model,
        "optimizer": optimizer,
        "batches": _batches(),
        "loss_fn": _loss_fn,
        "v": 1.0,
        "v32": 1.0,
    }
    exec(compile(_doc_recipe(), str(DOC), "exec"), namespace)
    run = namespace["run"]
    assert [t.precision.name for t in builds] == ["bf16", "fp32"]  # rebuilt exactly once
    assert len(run.rollbacks) == 1 and "non-finite" in run.rollbacks[0].reason
    assert run.guard.tripped is None
    # restored to the checkpoint taken before the first step (step 0); then the
    # 2 NaN batches left of the storm and the 10 good ones all count
    assert run.trainer.training_steps == 12
    assert run.trainer.skipped_steps == 2
    assert RolloutLedger.from_settings(load_settings()).stage("my_agent") == "rolled_back"
    assert namespace["decision"].action == "warn" or namespace["decision"].action == "none"


def test_nan_storm_restores_last_good_checkpoint_once_and_keeps_later_steps(state_dir, builds):
    _rolled_out("wm")
    model, optimizer = _model_and_opt()
    run = GuardedTraining("wm", model, optimizer, precision="bf16", checkpoint_every=4)
    batches = _batches(good_before=8, storm=6, good_after=10)
    for batch in batches[:8]:
        assert run.step(batch, _loss_fn)
    good = {k: v.clone() for k, v in model.state_dict().items()}
    assert run.guard.last_good_checkpoint == state_dir / "checkpoints" / "wm" / "good.pt"
    for batch in batches[8:11]:  # the third NaN trips P0; the rollback happens inside step()
        assert not run.step(batch, _loss_fn)
    assert len(builds) == 2 and run.trainer.precision.name == "fp32"
    assert run.trainer.training_steps == 8  # the step-8 checkpoint
    assert all(torch.equal(good[k], v) for k, v in run.trainer.model.state_dict().items())
    counts = []
    for batch in batches[11:]:  # 3 more NaN batches (FP32 skips them), then 10 good ones
        run.step(batch, _loss_fn)
        counts.append(run.trainer.training_steps)
    assert counts == list(range(9, 9 + len(batches[11:])))
    assert len(builds) == 2 and len(run.rollbacks) == 1  # a NaN streak in FP32 is a warning, not a second rollback
    assert run.trainer.skipped_steps == 3
    assert not all(torch.equal(good[k], v) for k, v in model.state_dict().items())  # it trained on


def test_p1_from_check_rolls_back_the_same_way(state_dir, builds):
    _rolled_out("wm")
    model, optimizer = _model_and_opt()
    run = GuardedTraining("wm", model, optimizer, precision="bf16", checkpoint_every=0)
    for batch in _batches(good_before=4, storm=0, good_after=0):
        run.step(batch, _loss_fn)
    decision = run.check(val_loss=2.0, fp32_val_loss=1.0)
    assert decision.severity == "P1" and decision.action == "rollback"
    assert [t.precision.name for t in builds] == ["bf16", "fp32"]
    assert run.trainer.training_steps == 0 and run.guard.tripped is None
    assert run.check(val_loss=2.0, fp32_val_loss=1.0).action == "warn"  # FP32 now: nothing more to roll back
    assert len(builds) == 2


def test_good_checkpoint_refused_while_tripped(state_dir):
    _rolled_out("wm")
    model, optimizer = _model_and_opt()
    run = GuardedTraining("wm", model, optimizer, precision="bf16")
    for batch in _batches(good_before=0, storm=3, good_after=0):
        run.trainer.backward_and_step(run.trainer.training_step(batch, _loss_fn))  # bypasses step(): trip unhandled
    with pytest.raises(RuntimeError, match="tripped"):
        run.save_good_checkpoint()


def test_guarded_by_default_and_unguarded_only_when_said(state_dir):
    model, optimizer = _model_and_opt()
    assert isinstance(GuardedTraining("wm", model, optimizer, precision="bf16").guard, RollbackGuard)
    plain = GuardedTraining("wm", model, optimizer, precision="bf16", guard=UNGUARDED)
    assert plain.guard is None and plain.train(_batches(good_before=3, storm=0, good_after=0), _loss_fn) == 3
    assert not (state_dir / "checkpoints").exists()  # no guard, no good checkpoints
    with pytest.raises(TypeError, match="guard=UNGUARDED"):
        GuardedTraining("wm", model, optimizer, guard=None)


def test_shadow_and_canary_references_and_one_typed_report(state_dir):
    """Stage shadow: one FP32 copy kept for the stage, the gap in the ledger;
    stage on: a fresh canary every canary_every-th reduced-precision call."""
    ledger = RolloutLedger.from_settings(load_settings())
    ledger.enable("wm", shadow=True, actor="test")
    model, optimizer = _model_and_opt()
    batches = _batches(good_before=6, storm=0, good_after=0)
    x_val, y_val = torch.randn(64, 4, generator=torch.Generator().manual_seed(3)), torch.zeros(64, 1)

    def val_fn(m, trainer):
        with torch.no_grad(), trainer.autocast():
            return float(_loss_fn(m, (x_val, y_val)))

    guard = RollbackGuard("wm", settings=load_settings(), thresholds={"canary_every": 2})
    run = GuardedTraining("wm", model, optimizer, precision="bf16", guard=guard)
    shadowed = [run.run(batches, _loss_fn, val_fn) for _ in range(2)]
    assert [r.reference for r in shadowed] == ["shadow", "shadow"] and run.shadow is not None
    assert all(r.fp32_val_loss is not None and abs(r.gap) < 0.2 and r.precision == "bf16" for r in shadowed)
    assert len(ledger.shadow_gaps("wm")) == 2
    ledger.enable("wm", actor="test")  # stage on: the trainer is rebuilt, the shadow dropped
    on = [run.run(batches, _loss_fn, val_fn) for _ in range(2)]
    assert run.shadow is None
    # the canary counts reduced-precision calls: the shadow stage's two, then these
    assert [r.reference for r in on] == [None, "canary"] and [r.canary_due for r in on] == [False, True]
    assert on[1].decision is not None and on[1].decision.action == "none" and not on[1].rolled_back


@pytest.mark.parametrize("name", ["/elsewhere/x", "../x", "..", "a/../../x"])
def test_an_agent_name_that_would_leave_the_state_dir_is_refused(state_dir, tmp_path, name):
    model, optimizer = _model_and_opt()
    with pytest.raises(ValueError, match="invalid agent name"):
        GuardedTraining(name, model, optimizer, precision="bf16")
    assert not (tmp_path.parent / "x").exists() and not Path("/elsewhere").exists()


def test_the_ledger_is_read_again_only_when_it_changed(state_dir, monkeypatch):
    """PPO begins a training call every iteration: with the ledger unchanged
    on disk its stage is not read again; a stage set from elsewhere (another
    process writing the ledger) still takes effect at the next call, and so
    does a new profile file."""
    from genesis_fp16.rollout import ledger as rollout

    reads = []
    real = rollout.RolloutLedger.stage
    monkeypatch.setattr(rollout.RolloutLedger, "stage", lambda self, agent: reads.append(agent) or real(self, agent))
    model, optimizer = _model_and_opt()
    ledger = RolloutLedger.from_settings(load_settings())
    ledger.disable("wm", actor="test")  # the ledger exists and manages the agent
    run = GuardedTraining("wm", model, optimizer, guard=UNGUARDED)
    assert run.trainer.precision.name == "fp32" and run.policy.stage == "off"
    before = len(reads)
    for _ in range(3):
        run.begin_call()
    assert len(reads) == before  # nothing changed on disk: no ledger read
    first = run.trainer
    ledger.enable("wm", actor="test")  # as `genesis-fp16 rollout enable wm` from another process would
    run.begin_call()
    assert (
        len(reads) == before + 1 and run.policy.stage == "on" and run.trainer is not first
    )  # rebuilt for the new stage
    run.begin_call()
    assert len(reads) == before + 1
    (state_dir / "profiles.toml").write_text('[agents.wm]\nprecision = "fp16"\n')
    run.begin_call()
    assert run.trainer.precision.name == "fp16"

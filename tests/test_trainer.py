"""The trainer against PyTorch's own recipes, bit for bit on the CPU."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from structlog.testing import capture_logs

from genesis_fp16 import FP16Trainer, FP16TrainingConfig
from genesis_fp16.precision import capability as capability_mod
from genesis_fp16.precision.capability import Support
from genesis_fp16.base.errors import UnsupportedPrecisionError
from genesis_fp16.base.settings import PrecisionMode

STEPS = 20
INJECT_AT = 7  # optimizer step (0-based) whose gradients are made infinite


class InjectInf(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by inf when armed."""

    @staticmethod
    def forward(ctx, x, armed):
        ctx.armed = bool(armed)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return (grad * float("inf") if ctx.armed else grad), None


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
        self.armed = False

    def forward(self, x):
        return InjectInf.apply(self.body(x), self.armed)


def make(seed=0, lr=1e-2, adam=True):
    torch.manual_seed(seed)
    model = Net()
    opt = (torch.optim.Adam if adam else torch.optim.SGD)(model.parameters(), lr=lr)
    return model, opt


def batches(n, micro=1, seed=123):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n * micro):
        x = torch.randn(16, 6, generator=g)
        y = torch.randn(16, 2, generator=g)
        out.append((x, y))
    return out


def loss_fn(model, batch):
    x, y = batch
    return torch.nn.functional.mse_loss(model(x).float(), y)


def params(model):
    return [p.detach().clone() for p in model.parameters()]


def assert_bit_equal(a, b):
    assert len(a) == len(b)
    for pa, pb in zip(a, b):
        assert pa.dtype == pb.dtype
        assert torch.equal(pa, pb), (pa - pb).abs().max()


# -- reference recipes --------------------------------------------------------


def plain_loop(model, opt, data, max_norm=1.0):
    for x, y in data:
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        loss.backward()
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
        opt.zero_grad()


def amp_recipe(model, opt, data, dtype, micro=1, inject_at=None, max_norm=1.0):
    """torch's AMP recipe: autocast, GradScaler("cpu"), scale(loss).backward(),
    unscale_, clip_grad_norm_, step, update (accumulation: loss / N)."""
    scaler = torch.amp.GradScaler("cpu", enabled=dtype == torch.float16)
    results = []
    steps = len(data) // micro
    for step in range(steps):
        model.armed = step == inject_at
        for m in range(micro):
            x, y = data[step * micro + m]
            with torch.autocast("cpu", dtype=dtype):
                loss = torch.nn.functional.mse_loss(model(x).float(), y)
            scaler.scale(loss / micro if micro > 1 else loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        results.append(scaler.get_scale() >= before)
    model.armed = False
    return results, scaler


def run_trainer(trainer, data, micro=1, inject_at=None):
    results = []
    steps = len(data) // micro
    for step in range(steps):
        trainer.model.armed = step == inject_at
        ok = True
        for m in range(micro):
            loss = trainer.training_step(data[step * micro + m], loss_fn)
            ok = trainer.backward_and_step(loss)
        results.append(ok)
    trainer.model.armed = False
    return results


# -- FP32 ---------------------------------------------------------------------


@pytest.mark.parametrize("max_norm", [1.0, None])
def test_fp32_equals_plain_loop_bit_for_bit(max_norm):
    data = batches(STEPS)
    ref_model, ref_opt = make()
    plain_loop(ref_model, ref_opt, data, max_norm=max_norm)

    model, opt = make()
    trainer = FP16Trainer(model, opt, FP16TrainingConfig(precision="fp32", max_grad_norm=max_norm))
    assert all(run_trainer(trainer, data))
    assert_bit_equal(params(model), params(ref_model))
    stats = trainer.get_stats()
    assert stats["precision"] == "fp32" and stats["training_steps"] == STEPS
    assert stats["overflow_steps"] == 0 and stats["current_scale"] == 1.0


def test_disabled_config_is_fp32():
    model, opt = make()
    trainer = FP16Trainer(model, opt, FP16TrainingConfig(enabled=False, precision="fp16"))
    assert trainer.precision.name == "fp32"
    assert not trainer.scaler.is_enabled()


# -- FP16 with the CPU scaler ---------------------------------------------------


@pytest.mark.parametrize("micro", [1, 4])
def test_fp16_matches_amp_recipe_with_injected_overflow(micro):
    data = batches(STEPS, micro)
    ref_model, ref_opt = make()
    ref_results, ref_scaler = amp_recipe(ref_model, ref_opt, data, torch.float16, micro=micro, inject_at=INJECT_AT)
    assert ref_results[INJECT_AT] is False  # the recipe itself skipped that step

    model, opt = make()
    cfg = FP16TrainingConfig(precision="fp16", grad_accumulation_steps=micro)
    trainer = FP16Trainer(model, opt, cfg)
    assert isinstance(trainer.scaler, torch.amp.GradScaler) and trainer.scaler.is_enabled()
    results = run_trainer(trainer, data, micro=micro, inject_at=INJECT_AT)

    assert results[INJECT_AT] is False
    assert results[INJECT_AT + 1] is True
    assert results.count(False) == 1
    assert_bit_equal(params(model), params(ref_model))
    stats = trainer.get_stats()
    assert stats["overflow_steps"] == 1
    assert stats["training_steps"] == STEPS
    assert stats["current_scale"] == ref_scaler.get_scale() == 65536.0 / 2
    assert math.isclose(stats["overflow_rate"], 1 / STEPS)


def test_overflow_zeroes_gradients_and_training_recovers():
    data = batches(6)
    model, opt = make(adam=False)
    trainer = FP16Trainer(model, opt, FP16TrainingConfig(precision="fp16"))
    trainer.model.armed = True
    assert trainer.backward_and_step(trainer.training_step(data[0], loss_fn)) is False
    assert all(p.grad is None for p in model.parameters())
    trainer.model.armed = False
    assert all(trainer.backward_and_step(trainer.training_step(b, loss_fn)) for b in data[1:])
    assert trainer.get_stats()["overflow_steps"] == 1


def test_skipped_step_does_not_advance_scheduler():
    data = batches(4)
    model, opt = make(adam=False)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    trainer = FP16Trainer(model, opt, FP16TrainingConfig(precision="fp16"), scheduler=sched)
    trainer.model.armed = True
    trainer.backward_and_step(trainer.training_step(data[0], loss_fn))
    assert sched.last_epoch == 0
    trainer.model.armed = False
    trainer.backward_and_step(trainer.training_step(data[1], loss_fn))
    assert sched.last_epoch == 1


def test_scale_change_and_skip_events():
    data = batches(2)
    model, opt = make()
    seen = []
    trainer = FP16Trainer(
        model, opt, FP16TrainingConfig(precision="fp16"), listeners=[lambda e, f: seen.append((e, f))]
    )
    trainer.model.armed = True
    with capture_logs() as logs:
        trainer.backward_and_step(trainer.training_step(data[0], loss_fn))
    names = [e for e, _ in seen]
    assert "trainer.step_skipped" in names and "trainer.scale_changed" in names
    skipped = dict(seen)["trainer.step_skipped"]
    assert skipped["reason"] == "overflow" and skipped["precision"] == "fp16"
    assert any(log["event"] == "trainer.scale_changed" and log["new_scale"] == 32768.0 for log in logs)


# -- BF16 -------------------------------------------------------------------------


@pytest.mark.parametrize("micro", [1, 2])
def test_bf16_matches_autocast_recipe(micro):
    data = batches(STEPS, micro)
    ref_model, ref_opt = make()
    amp_recipe(ref_model, ref_opt, data, torch.bfloat16, micro=micro)
    model, opt = make()
    trainer = FP16Trainer(model, opt, FP16TrainingConfig(precision="bf16", grad_accumulation_steps=micro))
    assert trainer.precision.name == "bf16" and not trainer.scaler.is_enabled()
    assert all(run_trainer(trainer, data, micro=micro))
    assert_bit_equal(params(model), params(ref_model))


# -- non-finite losses ----------------------------------------------------------------


def test_nonfinite_loss_is_counted_skipped_and_streak_reported():
    data = batches(5)
    model, opt = make()
    seen = []
    cfg = FP16TrainingConfig(precision="fp32", nonfinite_streak_threshold=3)
    trainer = FP16Trainer(model, opt, cfg, listeners=[lambda e, f: seen.append(e)])
    before = params(model)
    for _ in range(3):
        loss = trainer.training_step(data[0], loss_fn) * float("nan")
        assert trainer.backward_and_step(loss) is False
    assert_bit_equal(params(model), before)
    stats = trainer.get_stats()
    assert stats["nonfinite_losses"] == 3 and stats["skipped_steps"] == 3 and stats["nonfinite_streak"] == 3
    assert seen.count("trainer.nonfinite_streak") == 1
    assert trainer.backward_and_step(trainer.training_step(data[1], loss_fn)) is True
    assert trainer.get_stats()["nonfinite_streak"] == 0


def test_nonfinite_loss_drops_whole_accumulation_window():
    data = batches(4)
    model, opt = make()
    trainer = FP16Trainer(model, opt, FP16TrainingConfig(precision="fp32", grad_accumulation_steps=2))
    trainer.backward_and_step(trainer.training_step(data[0], loss_fn))  # first micro-step
    bad = trainer.training_step(data[1], loss_fn) * float("inf")
    assert trainer.backward_and_step(bad) is False
    assert all(p.grad is None for p in model.parameters())
    # a fresh window starts cleanly
    trainer.backward_and_step(trainer.training_step(data[2], loss_fn))
    assert trainer.backward_and_step(trainer.training_step(data[3], loss_fn)) is True


# -- resume -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["fp32", "fp16", "bf16"])
def test_resume_is_bit_identical(tmp_path, mode):
    data = batches(STEPS)

    def fresh(seed):
        model, opt = make(seed)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.9)
        cfg = FP16TrainingConfig(precision=mode, growth_interval=4)  # the scale grows mid-run
        return FP16Trainer(model, opt, cfg, scheduler=sched)

    straight = fresh(0)
    run_trainer(straight, data, inject_at=3 if mode == "fp16" else None)

    first = fresh(0)
    run_trainer(first, data[:10], inject_at=3 if mode == "fp16" else None)
    path = first.save_checkpoint(tmp_path / "ckpt.pt", extra={"note": "half"})
    second = fresh(99)  # different init: everything must come from the checkpoint
    assert second.load_checkpoint(path) == {"note": "half"}
    run_trainer(second, data[10:])

    assert_bit_equal(params(second.model), params(straight.model))
    s1, s2 = straight.get_stats(), second.get_stats()
    for key in ("training_steps", "overflow_steps", "current_scale", "nonfinite_losses"):
        assert s1[key] == s2[key], key
    assert second.scheduler.last_epoch == straight.scheduler.last_epoch


def test_checkpoint_mid_accumulation_is_refused(tmp_path):
    model, opt = make()
    trainer = FP16Trainer(model, opt, FP16TrainingConfig(precision="fp32", grad_accumulation_steps=2))
    trainer.backward_and_step(trainer.training_step(batches(1)[0], loss_fn))
    with pytest.raises(RuntimeError, match="accumulation window"):
        trainer.save_checkpoint(tmp_path / "c.pt")


# -- config and precision policy -----------------------------------------------------------


def test_caller_config_is_never_mutated(monkeypatch):
    monkeypatch.setattr(
        capability_mod, "device_support", lambda d, m: Support.NONE if m == PrecisionMode.BF16 else Support.NATIVE
    )
    cfg = FP16TrainingConfig(precision="bf16")
    snapshot = dataclasses.asdict(cfg)
    model, opt = make()
    trainer = FP16Trainer(model, opt, cfg)
    assert trainer.precision.name != "bf16"
    assert dataclasses.asdict(cfg) == snapshot
    assert trainer.config is not cfg


def test_unsupported_precision_fallback_logs_reason(monkeypatch):
    monkeypatch.setattr(
        capability_mod, "device_support", lambda d, m: Support.NONE if m == PrecisionMode.BF16 else Support.NATIVE
    )
    model, opt = make()
    with capture_logs() as logs:
        trainer = FP16Trainer(model, opt, FP16TrainingConfig(precision="bf16", on_unsupported="fallback"))
    fallback = [log for log in logs if log["event"] == "precision.fallback"]
    assert len(fallback) == 1
    assert fallback[0]["requested"] == "bf16" and fallback[0]["precision"] == trainer.precision.name
    assert "not supported" in fallback[0]["reason"]
    # never silently FP16 in place of BF16: the fallback is the best supported mode
    assert trainer.precision.name == "fp32"


def test_unsupported_precision_error_policy(monkeypatch):
    monkeypatch.setattr(
        capability_mod, "device_support", lambda d, m: Support.NONE if m == PrecisionMode.BF16 else Support.NATIVE
    )
    model, opt = make()
    with pytest.raises(UnsupportedPrecisionError, match="bf16.*not supported"):
        FP16Trainer(model, opt, FP16TrainingConfig(precision="bf16", on_unsupported="error"))


def test_fp16_on_cpu_runs_with_cpu_scaler_and_says_the_rule_counts_it_slow_without_warning():
    # issue 37: slow_on_device is a measurement's verdict; unmeasured, the decision's reason says what the rule thinks
    with capture_logs() as logs:
        for _ in range(2):
            model, opt = make()
            trainer = FP16Trainer(model, opt, FP16TrainingConfig(precision="fp16"))
    assert trainer.precision.name == "fp16" and trainer.scaler.is_enabled()
    assert trainer.scaler._device == "cpu"
    assert [log["event"] for log in logs].count("precision.slow_on_device") == 0
    assert trainer.decision.source.value == "explicit" and "not measured" in trainer.decision.reason


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        ({"precision": "fp8"}, "allowed values are auto, fp16, bf16, fp32"),
        ({"on_unsupported": "maybe"}, "fallback, error"),
        ({"backoff_factor": 1.0}, "backoff_factor"),
        ({"growth_factor": 1.0}, "growth_factor"),
        ({"init_scale": 0.0}, "init_scale"),
        ({"grad_accumulation_steps": 0}, "grad_accumulation_steps"),
        ({"max_grad_norm": -1.0}, "max_grad_norm"),
    ],
)
def test_invalid_config_fails_in_constructor(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        FP16TrainingConfig(**kwargs)


def test_cast_model_to_fp16():
    model, opt = make()
    trainer = FP16Trainer(model, opt, FP16TrainingConfig(precision="fp32"))
    trainer.cast_model_to_fp16()
    assert all(p.dtype == torch.float16 for p in model.parameters())
    assert trainer.get_stats()["precision"] == "fp16-true"
    assert not trainer.scaler.is_enabled()


def test_seed_import_paths_give_same_objects():
    import genesis_fp16
    import infrastructure.training as seed

    assert seed.FP16Trainer is genesis_fp16.FP16Trainer
    assert seed.FP16TrainingConfig is genesis_fp16.FP16TrainingConfig


# -- precision plugins ------------------------------------------------------------------


def test_fp16_true_from_the_config_casts_the_model_at_construction():
    data = batches(4)
    model, _ = make(adam=False)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    trainer = FP16Trainer(model, opt, FP16TrainingConfig(precision="fp16-true"))
    assert trainer.precision.name == "fp16-true" and trainer.model is model
    assert all(p.dtype == torch.float16 for p in model.parameters())
    assert all(run_trainer(trainer, data))  # FP32 batches meet FP16 weights under autocast
    stats = trainer.get_stats()
    assert stats["precision"] == "fp16-true" and stats["training_steps"] == 4
    assert stats["scaler_enabled"] is False and stats["current_scale"] == 1.0


def test_scaler_is_the_plugins_and_read_only():
    model, opt = make()
    trainer = FP16Trainer(model, opt, FP16TrainingConfig(precision="fp16"))
    assert trainer.scaler is trainer.precision.scaler
    with pytest.raises(AttributeError):
        trainer.scaler = torch.amp.GradScaler("cpu")


def test_subclass_chooses_plugin_variants():
    from genesis_fp16.precision.modes import MODES
    from genesis_fp16.precision.plugins import FP16Mixed, HalfTrue

    made = []

    class CountingFP16(FP16Mixed):
        def make_scaler(self):
            made.append(self)
            return super().make_scaler()

    class TaggedHalf(HalfTrue):
        pass

    class Variant(FP16Trainer):
        precision_plugins = dict(MODES, **{PrecisionMode.FP16: CountingFP16, PrecisionMode.FP16_TRUE: TaggedHalf})

    model, opt = make()
    trainer = Variant(model, opt, FP16TrainingConfig(precision="fp16"))
    assert type(trainer.precision) is CountingFP16 and made == [trainer.precision]
    trainer.cast_model_to_fp16()  # goes through the FP16_TRUE plugin
    assert type(trainer.precision) is TaggedHalf


def test_checkpoint_scaler_key_is_the_plugins_state_and_old_fp32_checkpoints_load_into_fp16(tmp_path):
    model, opt = make()
    fp16 = FP16Trainer(model, opt, FP16TrainingConfig(precision="fp16", init_scale=256.0))
    run_trainer(fp16, batches(3), inject_at=1)
    payload = fp16.state_payload()
    assert payload["scaler"] == fp16.precision.state_dict() and payload["scaler"]["scale"] == 128.0
    model32, opt32 = make()
    fp32 = FP16Trainer(model32, opt32, FP16TrainingConfig(precision="fp32"))
    assert fp32.state_payload()["scaler"] == {}
    path = fp32.save_checkpoint(tmp_path / "fp32.pt")
    model2, opt2 = make()
    seen = []
    resumed = FP16Trainer(
        model2, opt2, FP16TrainingConfig(precision="fp16", init_scale=512.0), listeners=[lambda e, f: seen.append(e)]
    )
    resumed.load_checkpoint(path)
    assert "checkpoint.fresh_scaler" in seen and resumed.current_scale == 512.0

"""Training windows (genesis_fp16/training/trainer.py, `FP16Trainer.train_window`): steps with nothing read back to
the host inside a window, against the per-step path (`backward_and_step`) on
clean data, a NaN storm and an injected FP16 overflow: the same skipped steps,
the same counters and events, the same weights bit for bit (both paths on the
same fused Adam kernel), and the same rollback on the same storm."""

from __future__ import annotations

import pytest
import torch
from structlog.testing import capture_logs

from genesis_fp16 import FP16Trainer, FP16TrainingConfig
from genesis_fp16.training.trainer import fused_adam


def _trainer(precision: str, fused: bool = True, **config) -> FP16Trainer:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, fused=fused or None)
    return FP16Trainer(model, opt, FP16TrainingConfig(precision=precision, **config))


def _batches(n: int = 24):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g)) for _ in range(n)]


def _mse(model, batch):
    return ((model(batch[0]).float() - batch[1]) ** 2).mean()


def _storm(bad: set[int]):
    """A loss function that is NaN at the steps in ``bad`` (counted per call)."""
    calls = [0]

    def loss_fn(model, batch):
        n, calls[0] = calls[0], calls[0] + 1
        loss = _mse(model, batch)
        return loss * float("nan") if n in bad else loss

    return loss_fn


def _per_step(trainer, batches, loss_fn):
    return [trainer.backward_and_step(trainer.training_step(b, loss_fn)) for b in batches]


def _windowed(trainer, batches, loss_fn, size=8):
    stepped = []
    for start in range(0, len(batches), size):
        stepped += trainer.train_window(batches[start : start + size], loss_fn).stepped
    return stepped


def _same_weights(a, b) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))


def _events(logs):
    return [
        (e["event"], e.get("reason"), e.get("step"), e.get("streak")) for e in logs if e["event"].startswith("trainer.")
    ]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("bad", [set(), {5, 6, 7, 12, 20}], ids=["clean", "nan_storm"])
def test_a_window_trains_as_the_per_step_path(precision, bad):
    batches = _batches()
    a, b = _trainer(precision, max_grad_norm=1.0), _trainer(precision, max_grad_norm=1.0)
    with capture_logs() as per_step_logs:
        taken = _per_step(a, batches, _storm(bad))
    with capture_logs() as window_logs:
        windowed = _windowed(b, batches, _storm(bad))
    assert windowed == taken and taken.count(False) == len(bad)
    assert _same_weights(a, b)  # bit for bit
    for name in (
        "training_steps",
        "skipped_steps",
        "nonfinite_losses",
        "overflow_steps",
        "nonfinite_streak",
        "micro_steps",
    ):
        assert getattr(a, name) == getattr(b, name), name
    assert _events(window_logs) == _events(per_step_logs)  # the streak event at the same step: the guard trips alike
    if bad:
        assert ("trainer.nonfinite_streak", None, 8, 3) in _events(window_logs)
    assert a.optimizer.state_dict()["state"][0]["step"] == b.optimizer.state_dict()["state"][0]["step"]


def test_an_fp16_overflow_is_skipped_on_the_device_and_the_scale_follows_as_per_step():
    """Every third backward overflows (an inf in a gradient); the scale grows every 2 good steps."""

    def overflowing(trainer):
        count = [0]

        def hook(grad):
            count[0] += 1
            return grad * float("inf") if count[0] % 3 == 0 else grad

        trainer.model[0].weight.register_hook(hook)
        return trainer

    batches = _batches(20)
    a, b = overflowing(_trainer("fp16", growth_interval=2)), overflowing(_trainer("fp16", growth_interval=2))
    with capture_logs() as per_step_logs:
        taken = _per_step(a, batches, _mse)
    with capture_logs() as window_logs:
        windowed = _windowed(b, batches, _mse, size=7)
    assert windowed == taken and a.overflow_steps == b.overflow_steps == 6
    assert _same_weights(a, b)
    assert a.scaler.state_dict() == b.scaler.state_dict() and a.precision.scale == b.precision.scale
    assert _events(window_logs) == _events(per_step_logs)
    assert [e for e in window_logs if e["event"] == "trainer.scale_changed"]  # grew and backed off


def test_a_nan_loss_leaves_the_fp16_scale_as_the_per_step_path_does():
    batches = _batches(10)
    a, b = _trainer("fp16", growth_interval=1), _trainer("fp16", growth_interval=1)
    _per_step(a, batches, _storm({2, 3}))
    b.train_window(batches, _storm({2, 3}))
    assert a.scaler.state_dict() == b.scaler.state_dict() and _same_weights(a, b)


def test_without_a_fused_optimizer_the_window_runs_the_per_step_path_and_says_why():
    batches = _batches(6)
    a, b = _trainer("bf16", fused=False), _trainer("bf16", fused=False)
    assert "not a fused optimizer" in b.window_blocker()
    _per_step(a, batches, _storm({2}))
    with capture_logs() as logs:
        result = b.train_window(batches, _storm({2}))
    assert result.eager is not None and "fused=True" in result.eager
    assert [e["event"] for e in logs].count("trainer.window_eager") == 1
    assert result.stepped == [True, True, False, True, True, True] and _same_weights(a, b)


def test_a_scheduler_or_accumulation_keeps_the_per_step_path():
    t = _trainer("fp32", grad_accumulation_steps=2)
    assert "accumulation" in t.window_blocker()
    t = _trainer("fp32")
    t.scheduler = torch.optim.lr_scheduler.StepLR(t.optimizer, 1)
    assert "scheduler" in t.window_blocker()
    assert _trainer("fp32").window_blocker() is None


def test_a_checkpoint_of_a_plain_adam_loads_into_a_fused_one_and_it_stays_fused(tmp_path):
    plain = _trainer("fp32", fused=False)
    _per_step(plain, _batches(3), _mse)
    plain.save_checkpoint(tmp_path / "plain.pt")
    fused = _trainer("fp32")
    fused.load_checkpoint(tmp_path / "plain.pt")
    assert all(g["fused"] for g in fused.optimizer.param_groups) and fused.window_blocker() is None
    assert fused.train_window(_batches(4), _mse).eager is None


def test_fused_adam_on_the_cpu():
    opt = fused_adam(torch.nn.Linear(2, 1).parameters(), 1e-3, torch.device("cpu"))
    assert opt.defaults["fused"] is True


def test_the_same_rollback_on_the_same_storm(state_dir, tmp_path):
    """Stage on in BF16, a NaN storm at steps 5-11: the per-step path and the
    windows roll back alike (P0, the streak at step 8 as its reason, the good
    checkpoint restored) and train on in FP32."""
    from genesis_fp16.training.guarded import GuardedTraining
    from genesis_fp16.rollout.ledger import RolloutLedger
    from genesis_fp16.base.settings import load_settings

    settings = load_settings()
    outcomes = []
    for k, windowed in enumerate((False, True)):
        agent = f"storm{k}"
        RolloutLedger.from_settings(settings).enable(agent, actor="test")
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        training = GuardedTraining(
            agent,
            model,
            torch.optim.Adam(model.parameters(), lr=1e-2, fused=True),
            settings=settings,
            precision="bf16",
            checkpoint_dir=tmp_path / agent,
            checkpoint_every=0,
        )
        training.begin_call()
        loss_fn = _storm(set(range(5, 12)))
        if windowed:
            result = training.train_windows(_batches(24), loss_fn, window=8)
            skipped = result.skipped
        else:
            skipped = [training.step(b, loss_fn) for b in _batches(24)].count(False)
        report = training.finish_call()
        rollback = training.rollbacks[0]
        outcomes.append(
            (
                rollback.severity,
                rollback.reason,
                report.precision,
                len(training.rollbacks),
                report.events[0].split()[0],
                skipped,
            )
        )
    per_step, window = outcomes
    assert per_step[:5] == window[:5] == ("P0", "non-finite loss streak of 3 steps at step 8", "fp32", 1, "restored")
    assert per_step[5] == window[5] == 7  # steps 5-11, in BF16 and then in the restored FP32 trainer


def test_a_world_model_call_reads_back_once_per_window(state_dir, tmp_path):
    """Issue 45's acceptance, small: 64 steps of a world model make a handful of host reads outside the optimizer (the
    per-step path made 1.5 to 3.5 a step: the finite-loss check, the scale)."""
    import scripts_loader

    reads = scripts_loader.load_script("count_host_reads")
    from genesis_fp16.training.guarded import UNGUARDED
    from infrastructure.world_model import WorldModel

    for precision in ("fp32", "fp16"):
        wm = WorldModel(3, 1, precision=precision, guard=UNGUARDED, checkpoint_dir=tmp_path / precision, seed=0)
        trajs = reads._trajectories()
        wm.trainer.host_is_device = (
            False  # what a GPU runs: a CPU's window reads each step's flag (it waits on nothing)
        )
        wm._train_sync(trajs, 8, False)
        count = reads.host_reads(lambda: wm._train_sync(trajs, 64, False))
        assert count <= 64 // 16 + 12, (precision, count)


class _Raised(Exception):
    pass


def _raising(bad: set[int], at: int, exc: type[BaseException] = _Raised):
    """NaN at the calls in ``bad``, and ``exc`` raised at call ``at`` (counted per call)."""
    storm, calls = _storm(bad), [0]

    def loss_fn(model, batch):
        n, calls[0] = calls[0], calls[0] + 1
        if n == at:
            raise exc("the loss failed")
        return storm(model, batch)

    return loss_fn


def _overflowing(trainer, every: int = 3):
    count = [0]

    def hook(grad):
        count[0] += 1
        return grad * float("inf") if count[0] % every == 0 else grad

    trainer.model[0].weight.register_hook(hook)
    return trainer


@pytest.mark.parametrize("precision, fault", [("fp32", "nan"), ("fp16", "nan"), ("fp16", "overflow")])
@pytest.mark.parametrize("exc", [_Raised, KeyboardInterrupt])
def test_a_loss_raising_mid_window_leaves_the_counters_as_the_per_step_path(precision, fault, exc):
    """NaN losses (or FP16 overflows) and then a loss that raises: the steps before the raise are accounted
    for (counters, events, scale) before the error goes on, as the per-step path leaves them."""
    batches = _batches(12)
    bad = {2, 3} if fault == "nan" else set()

    def make():
        t = _trainer(precision, growth_interval=1)
        return _overflowing(t) if fault == "overflow" else t

    a, b = make(), make()
    with capture_logs() as per_step_logs, pytest.raises(exc):
        _per_step(a, batches, _raising(bad, at=9, exc=exc))
    with capture_logs() as window_logs, pytest.raises(exc):
        b.train_window(batches, _raising(bad, at=9, exc=exc))
    assert a.training_steps == b.training_steps == 9
    for name in ("skipped_steps", "nonfinite_losses", "overflow_steps", "nonfinite_streak", "micro_steps"):
        assert getattr(a, name) == getattr(b, name), name
    assert a.nonfinite_losses == len(bad)
    if fault == "overflow":
        assert a.overflow_steps >= 3  # every third backward, and more while the scale backs off
    assert a.get_stats()["current_scale"] == b.get_stats()["current_scale"] == float(b.scaler.get_scale())
    assert a.scaler.state_dict() == b.scaler.state_dict()
    assert _events(window_logs) == _events(per_step_logs)
    assert _same_weights(a, b)
    assert a.optimizer.state_dict()["state"][0]["step"] == b.optimizer.state_dict()["state"][0]["step"]


def test_data_raising_mid_window_leaves_the_steps_taken_accounted_for():
    batches = _batches(6)

    def data():
        yield from batches[:4]
        raise _Raised("the data source failed")

    b = _trainer("fp32")
    with pytest.raises(_Raised):
        b.train_window(data(), _storm({1}))
    assert b.training_steps == 4 and b.nonfinite_losses == 1 and b.optimizer.state_dict()["state"][0]["step"] == 3


def test_the_per_step_window_counts_optimizer_steps_under_accumulation():
    t = _trainer("fp32", fused=False, grad_accumulation_steps=2)
    flags = []
    result = t.train_window(_batches(8), _mse, after_step=flags.append)
    assert result.eager is not None and result.steps == 4 == t.training_steps and len(result.stepped) == 4
    assert len(result.losses) == 4 and len(flags) == 4


def test_a_deep_copy_of_a_fused_adam_still_runs_the_window():
    """``copy.deepcopy`` drops the optimizer's ``_step_supports_amp_scaling`` mark (auto's calibration copies and the
    FP32 references are copies): its fused groups still take ``found_inf``, so the copy runs the window too."""
    import copy

    a = _trainer("bf16")
    model, opt = copy.deepcopy((a.model, a.optimizer))
    assert not getattr(opt, "_step_supports_amp_scaling", False)
    b = FP16Trainer(model, opt, FP16TrainingConfig(precision="bf16"))
    assert b.window_blocker() is None
    batches = _batches(8)
    assert _windowed(a, batches, _storm({3})) == _windowed(b, batches, _storm({3}))
    assert _same_weights(a, b)


def test_a_cpu_window_skips_on_the_host_and_trains_as_a_gpu_window_does():
    """On a CPU (``host_is_device``) the host reads each step's flag and skips the step itself; run as a GPU's window
    (the fused kernel's ``found_inf``, nothing read back) the same storm gives the same weights bit for bit."""
    batches = _batches()
    for precision in ("fp32", "bf16", "fp16"):
        a, b = _trainer(precision), _trainer(precision)
        b.host_is_device = False
        assert a.host_is_device
        assert _windowed(a, batches, _storm({3, 4, 9})) == _windowed(b, batches, _storm({3, 4, 9}))
        assert _same_weights(a, b) and a.scaler.state_dict() == b.scaler.state_dict()
        assert a.optimizer.state_dict()["state"][0]["step"] == b.optimizer.state_dict()["state"][0]["step"]


def test_the_window_overhead_script_runs_both_paths(capsys):
    import scripts_loader

    script = scripts_loader.load_script("window_overhead")
    for extra in ([], ["--device-path"]):
        assert script.main(["--size", "S", "--precision", "bf16", "--pairs", "2", "--steps", "4", *extra]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "the CPU's path" in out[0] and "the GPU's path" in out[1] and all("median ratio" in line for line in out)

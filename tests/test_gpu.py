"""CUDA paths. Skipped without a GPU; run them on a GPU machine with `pytest -m gpu`."""

import math

import pytest
import torch

from genesis_fp16 import FP16Trainer, FP16TrainingConfig
from tests.test_window import _storm

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def make(precision):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 8)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return FP16Trainer(model, opt, FP16TrainingConfig(precision=precision))


def loss_fn(model, batch):
    x, y = batch
    return torch.nn.functional.mse_loss(model(x).float(), y)


def batch():
    return torch.randn(32, 64, device="cuda"), torch.randn(32, 8, device="cuda")


def test_cuda_fp16_with_scaler_trains_and_recovers_from_overflow():
    trainer = make("fp16")
    assert trainer.precision.name == "fp16" and trainer.scaler.is_enabled()
    with trainer.autocast():
        assert trainer.model(batch()[0]).dtype == torch.float16
    losses = []
    for _ in range(30):
        loss = trainer.training_step(batch(), loss_fn)
        assert trainer.backward_and_step(loss)
        losses.append(float(loss))
    # inject an infinite gradient
    handle = trainer.model[0].weight.register_hook(lambda g: g * float("inf"))
    loss = trainer.training_step(batch(), loss_fn)
    before = trainer.current_scale
    assert trainer.backward_and_step(loss) is False
    handle.remove()
    assert trainer.backward_and_step(trainer.training_step(batch(), loss_fn)) is True
    assert trainer.current_scale == before / 2
    assert trainer.get_stats()["overflow_steps"] == 1


def test_cuda_bf16_autocast():
    trainer = make("bf16")
    assert trainer.precision.name == "bf16"
    with trainer.autocast():
        assert trainer.model(batch()[0]).dtype == torch.bfloat16
    assert trainer.backward_and_step(trainer.training_step(batch(), loss_fn))


def test_cuda_auto_picks_fp16():
    assert make("auto").precision.name == "fp16"


def test_cuda_checkpoint_round_trip(tmp_path):
    trainer = make("fp16")
    for _ in range(5):
        trainer.backward_and_step(trainer.training_step(batch(), loss_fn))
    path = trainer.save_checkpoint(tmp_path / "cuda.pt")
    other = make("fp16")
    other.load_checkpoint(path)
    for a, b in zip(trainer.model.parameters(), other.model.parameters()):
        assert a.device.type == "cuda" and torch.equal(a, b)
    assert other.current_scale == trainer.current_scale


def test_forensics_probe_runs_on_cuda():
    from genesis_fp16_tools.forensics.configs import parse_configs
    from genesis_fp16_tools.forensics.pretrain import PretrainSpec, build_assets
    from genesis_fp16_tools.forensics.probe import probe

    assets = build_assets(PretrainSpec(steps=2, finetune_steps=1, reward_samples=32)).to("cuda")
    assert next(assets.policy.parameters()).device.type == "cuda"
    rows = probe(assets, parse_configs("fp32_baseline,bf16_pure,fp16_pure"), num_prompts=2, seq_lengths=(24,))
    assert [r["config"] for r in rows] == ["fp32_baseline", "bf16_pure", "fp16_pure"]
    for r in rows:
        assert math.isfinite(r["kl_fp64"]) and math.isfinite(r["accum_err_final"])


def test_forensics_sweep_step_runs_on_cuda():
    from genesis_fp16_tools.forensics.configs import parse_configs
    from genesis_fp16_tools.forensics.pretrain import PretrainSpec, build_assets
    from genesis_fp16_tools.forensics.sweep import SweepArgs, run_one

    assets = build_assets(PretrainSpec(steps=2, finetune_steps=1, reward_samples=32)).to("cuda")
    for cfg in parse_configs("fp16_pure,bf16_pure,fp32_baseline"):
        result = run_one(assets, cfg, 0, SweepArgs(max_steps=2, batch=4, gen_len=8))
        assert result["summary"]["steps_done"] >= 1, result


def test_cuda_auto_measures_fp16_against_bf16_and_keeps_the_decision(monkeypatch, state_dir):
    from genesis_fp16.precision.measure import PrecisionCache
    from genesis_fp16.precision.decision import Source
    from genesis_fp16.training.guarded import UNGUARDED, GuardedTraining

    monkeypatch.setenv("GENESIS_FP16_AUTO_PRECISION", "measure")
    model = make("fp32").model
    training = GuardedTraining(
        "gpu", model, torch.optim.Adam(model.parameters(), 1e-3), guard=UNGUARDED, sample=(batch(), loss_fn)
    )
    decision = training.decision
    assert decision.source == Source.MEASURED and training.trainer.precision.name == decision.mode.value
    timed = set(decision.calibration.seconds)
    assert {"fp32", "fp16"} <= timed and ("bf16" in timed) == torch.cuda.is_bf16_supported()
    assert [c.key for c in PrecisionCache.from_settings().all()] == [decision.calibration.key]


def _fused_pair(precision, capture=(False, False)):
    """Two trainers with the same weights on one fused Adam kernel (the window needs a fused optimizer); each
    captures its window's steps or not as ``capture`` says."""
    pair = []
    for captured in capture:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 8)).cuda()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
        config = FP16TrainingConfig(precision=precision, max_grad_norm=1.0, capture=captured)
        pair.append(FP16Trainer(model, opt, config))
    return pair


def _synchronizing_calls(fn):
    """(fn's result, how many calls in it waited on the GPU), by torch's sync debug mode."""
    import warnings

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return result, sum("synchroniz" in str(w.message) for w in caught)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_a_cuda_window_trains_as_the_per_step_path_and_waits_on_the_gpu_far_less(precision):
    g = torch.Generator(device="cuda").manual_seed(0)
    batches = [
        (torch.randn(32, 64, device="cuda", generator=g), torch.randn(32, 8, device="cuda", generator=g))
        for _ in range(32)
    ]
    bad = {5, 6, 7, 20}
    a, b = _fused_pair(precision)
    per_step_fn, window_fn = _storm(bad), _storm(bad)  # NaN losses at those steps
    taken, per_step_syncs = _synchronizing_calls(
        lambda: [a.backward_and_step(a.training_step(x, per_step_fn)) for x in batches]
    )
    windowed, window_syncs = _synchronizing_calls(
        lambda: b.train_window(batches[:16], window_fn).stepped + b.train_window(batches[16:], window_fn).stepped
    )
    assert windowed == taken and taken.count(False) == len(bad)
    for name in ("training_steps", "skipped_steps", "nonfinite_losses", "overflow_steps"):
        assert getattr(a, name) == getattr(b, name), name
    diff = max(float((p - q).abs().max()) for p, q in zip(a.model.parameters(), b.model.parameters()))
    assert diff <= 1e-6, f"weights differ by {diff}"
    print(f"{precision}: synchronizing calls, 32 steps: per step {per_step_syncs}, two windows of 16 {window_syncs}")
    assert window_syncs <= 8 and window_syncs * 4 <= per_step_syncs


def _cuda_data(n, bad=(), overflow=()):
    """Batches on the GPU: inputs NaN at the steps in ``bad`` (a storm in the data: a captured step runs no Python),
    targets of 1e4 at ``overflow`` (finite loss, FP16 gradients past 65504 at the initial scale)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    out = []
    for i in range(n):
        x, y = torch.randn(32, 64, device="cuda", generator=g), torch.randn(32, 8, device="cuda", generator=g)
        out.append((x * math.nan if i in bad else x, y * 1e4 if i in overflow else y))
    return out


def _trainer_events(logs):
    return [
        (e["event"], e.get("reason"), e.get("step"), e.get("streak"), e.get("new_scale"))
        for e in logs
        if e["event"].startswith("trainer.") and e["event"] != "trainer.window_uncaptured"
    ]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("case", ["clean", "nan_storm", "fp16_overflow"])
def test_a_captured_cuda_window_equals_the_eager_window(precision, case):
    """The window's step captured as one CUDA graph (genesis_fp16/training/capture.py) against the same window
    eager: the same steps skipped, the same events, the same weights bit for bit."""
    from structlog.testing import capture_logs

    from genesis_fp16.training.capture import WARMUP

    bad = {5, 6, 7, 20, 33} if case == "nan_storm" else set()
    overflow = {9, 26} if case == "fp16_overflow" else set()
    batches = _cuda_data(48, bad, overflow)
    eager, captured = _fused_pair(precision, capture=(False, True))
    results = []
    for trainer in (eager, captured):
        with capture_logs() as logs:
            stepped = [s for k in range(0, 48, 16) for s in trainer.train_window(batches[k : k + 16], loss_fn).stepped]
        results.append((stepped, _trainer_events(logs), logs))
    (taken, eager_events, _), (replayed, captured_events, captured_logs) = results
    graphs = captured.step_graphs
    assert graphs is not None and graphs.captures == 1 and graphs.replays == 48 - WARMUP
    assert not [e for e in captured_logs if e["event"] == "trainer.window_uncaptured"]
    assert replayed == taken and taken.count(False) >= len(bad)
    if case == "fp16_overflow" and precision == "fp16":
        assert captured.overflow_steps >= 1
    assert captured_events == eager_events
    for name in ("training_steps", "skipped_steps", "nonfinite_losses", "overflow_steps", "samples_seen"):
        assert getattr(eager, name) == getattr(captured, name), name
    assert eager.precision.scale == captured.precision.scale
    diffs = [float((p - q).abs().max()) for p, q in zip(eager.model.parameters(), captured.model.parameters())]
    print(f"{precision} {case}: captured vs eager, largest weight difference {max(diffs)}")
    assert max(diffs) == 0.0, f"weights differ by up to {max(diffs)}"


def test_a_captured_cuda_window_reads_back_once_and_a_new_learning_rate_is_captured_again():
    a, b = _fused_pair("bf16", capture=(True, True))
    batches = _cuda_data(32)
    a.train_window(batches[:16], loss_fn)  # warm-up and capture
    _, syncs = _synchronizing_calls(lambda: a.train_window(batches[16:], loss_fn))
    print(f"captured window of 16 steps: {syncs} synchronizing calls")
    assert syncs <= 2 and a.step_graphs.replays == 16 - 3 + 16
    for group in a.optimizer.param_groups:
        group["lr"] = 1e-4
    a.train_window(batches[:16], loss_fn)
    assert a.step_graphs.captures == 2
    b.train_window(batches[:16], loss_fn)
    b.train_window(batches[16:], loss_fn)
    for group in b.optimizer.param_groups:
        group["lr"] = 1e-4
    b.step_graphs.drop()
    b.config.capture = False
    b.train_window(batches[:16], loss_fn)
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))

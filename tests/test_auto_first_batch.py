"""The seed API's ``auto`` is measured at its first batch (issue 45, item 4).

``FP16Trainer(model, optimizer, FP16TrainingConfig(precision="auto"))`` with
no decision and ``GENESIS_FP16_AUTO_PRECISION=measure`` runs the flag rule's
choice, provisionally, until its first batch (`training_step`, or
`train_window` when that comes first), measures there on copies
(`autotune.measured_auto`: the host cache, else a measurement written to it)
and trains in the decided precision from then on. The timings are injected
(`calibration.time_step` patched; the copies' steps still run, so the loss
check is real): no test reads this machine's timings.
"""

from __future__ import annotations

import json

import pytest
import torch

from genesis_fp16 import FP16Trainer, FP16TrainingConfig
from genesis_fp16.precision import calibration as cal
from genesis_fp16.precision.decision import Source
from genesis_fp16.training.guarded import UNGUARDED, GuardedTraining
from genesis_fp16.precision import capability

from conftest import CPU_KINDS

pytestmark = pytest.mark.usefixtures("one_thread")

FAST_BF16 = {"fp32": 1.0e-3, "bf16": 1.0e-3 / 1.3, "fp16": 1.0e-3 / 0.1}  # BF16 1.3x FP32
SLOW_BF16 = {"fp32": 1.0e-3, "bf16": 1.0e-3 / 0.85, "fp16": 1.0e-3 / 0.1}  # BF16 0.85x FP32


@pytest.fixture
def timings(monkeypatch, tmp_path):
    """Measure mode, a cache file of this test's own, and the timing injector: set ``timings["now"]``;
    ``timings["calls"]`` lists each timed precision."""
    monkeypatch.setenv("GENESIS_FP16_AUTO_PRECISION", "measure")
    monkeypatch.setenv("GENESIS_FP16_PRECISION_CACHE", str(tmp_path / "precision.json"))
    state: dict = {"now": FAST_BF16, "calls": []}

    def fake_time_step(mode, run, steps, device):
        run()
        state["calls"].append(mode.value)
        return state["now"][mode.value]

    monkeypatch.setattr(cal, "time_step", fake_time_step)
    return state


def _flags(monkeypatch, kind: str) -> None:
    monkeypatch.setattr(capability, "cpu_flags", lambda: CPU_KINDS[kind])


def _mlp(seed: int = 0, dropout: float = 0.0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(dropout), torch.nn.Linear(16, 2)
    )


def _batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(16, 8, generator=g), torch.randn(16, 2, generator=g)


def _mse(model: torch.nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return torch.nn.functional.mse_loss(model(x).float(), y)


def _seed_api(model: torch.nn.Module, precision: str = "auto", fused: bool = False) -> FP16Trainer:
    return FP16Trainer(
        model, torch.optim.Adam(model.parameters(), 1e-3, fused=fused or None), FP16TrainingConfig(precision=precision)
    )


def _train(trainer: FP16Trainer, steps: int = 3) -> None:
    for k in range(steps):
        trainer.backward_and_step(trainer.training_step(_batch(seed=k), _mse))


def test_bf16_measured_faster_trains_in_bf16_decided_at_the_first_batch(monkeypatch, timings):
    _flags(monkeypatch, "avx2")  # the flag rule would say fp32 here
    trainer = _seed_api(_mlp())
    stats = trainer.get_stats()
    assert trainer.auto_pending and stats["auto_pending"] is True
    assert (
        stats["precision"] == "fp32"
        and stats["decision"]["source"] == "rule"
        and "pending" in stats["decision"]["reason"]
    )
    assert timings["calls"] == []  # nothing is measured before the first batch
    _train(trainer)
    assert trainer.precision.name == "bf16" and trainer.decision.source == Source.MEASURED and not trainer.auto_pending
    assert "first batch" in trainer.decision.reason and "first batch" in trainer.get_stats()["auto_reason"]
    assert trainer.calibration is not None and trainer.calibration.precision == "bf16"
    assert trainer.get_stats()["auto_pending"] is False and trainer.training_steps == 3
    assert set(timings["calls"]) == {"fp32", "bf16", "fp16"}  # measured once, on the first batch
    calls = len(timings["calls"])
    _train(trainer, 2)
    assert len(timings["calls"]) == calls


def test_bf16_measured_slower_trains_in_fp32(monkeypatch, timings):
    _flags(monkeypatch, "amx")  # the flag rule would say bf16 here
    timings["now"] = SLOW_BF16
    trainer = _seed_api(_mlp())
    assert trainer.precision.name == "bf16" and trainer.auto_pending  # the rule's provisional choice
    _train(trainer)
    assert trainer.precision.name == "fp32" and trainer.decision.source == Source.MEASURED
    assert trainer.decision.mode.value == "fp32" and "first batch" in trainer.decision.reason


def test_the_rule_setting_keeps_the_flag_rule(monkeypatch, timings):
    monkeypatch.setenv("GENESIS_FP16_AUTO_PRECISION", "rule")
    _flags(monkeypatch, "amx")
    trainer = _seed_api(_mlp())
    assert (
        not trainer.auto_pending and trainer.decision.source == Source.RULE and "pending" not in trainer.decision.reason
    )
    _train(trainer)
    assert trainer.precision.name == "bf16" and trainer.decision.source == Source.RULE and timings["calls"] == []


def test_the_measurement_leaves_the_callers_model_and_rng_as_they_were(monkeypatch, timings):
    """auto (measured: bf16) and bf16 asked for by name, from the same seed: the same weights, bit for bit, and the
    same torch RNG afterwards (dropout draws from it in every step); the caller's weights and RNG before the first
    step are untouched by the measurement itself."""
    _flags(monkeypatch, "avx2")
    runs = {}
    for precision in ("auto", "bf16"):
        model = _mlp(dropout=0.2)
        trainer = _seed_api(model, precision)
        torch.manual_seed(123)
        before, rng = [p.detach().clone() for p in model.parameters()], torch.get_rng_state()
        if trainer.auto_pending:  # the measurement alone, before any step
            trainer._decide_at_first_batch(_batch(), _mse)
        assert all(torch.equal(a, p) for a, p in zip(before, model.parameters())) and torch.equal(
            rng, torch.get_rng_state()
        )
        assert all(p.grad is None for p in model.parameters()) and not trainer.optimizer.state
        _train(trainer)
        runs[precision] = (
            [p.detach().clone() for p in model.parameters()],
            torch.get_rng_state(),
            trainer.precision.name,
        )
    assert runs["auto"][2] == runs["bf16"][2] == "bf16" and timings["calls"]
    assert all(torch.equal(a, b) for a, b in zip(runs["auto"][0], runs["bf16"][0]))
    assert torch.equal(runs["auto"][1], runs["bf16"][1])


def test_a_second_trainer_on_the_same_workload_reads_the_host_cache(monkeypatch, timings, tmp_path):
    _flags(monkeypatch, "avx2")
    first = _seed_api(_mlp())
    _train(first, 1)
    assert first.decision.source == Source.MEASURED
    entries = json.loads((tmp_path / "precision.json").read_text())
    assert entries  # the tmp cache, not ~/.cache
    timings["calls"].clear()
    timings["now"] = SLOW_BF16  # a measurement now would say fp32: the cache's verdict stands
    second = _seed_api(_mlp(seed=1))
    _train(second, 1)
    assert second.precision.name == "bf16" and second.decision.source == Source.CACHED and timings["calls"] == []
    assert "first batch" in second.decision.reason and "cached" in second.decision.reason


def test_the_seed_api_reads_what_guarded_training_measured(monkeypatch, timings):
    """The same cache and the same workload key as GuardedTraining's ``sample``."""
    _flags(monkeypatch, "avx2")
    model = _mlp()
    guarded = GuardedTraining(
        "wm", model, torch.optim.Adam(model.parameters(), 1e-3), guard=UNGUARDED, sample=(_batch(), _mse)
    )
    assert guarded.decision.source == Source.MEASURED and guarded.trainer.precision.name == "bf16"
    timings["calls"].clear()
    trainer = _seed_api(_mlp(seed=2))
    _train(trainer, 1)
    assert trainer.decision.source == Source.CACHED and trainer.precision.name == "bf16" and timings["calls"] == []


def test_a_first_train_window_decides_before_the_window_runs(monkeypatch, timings):
    _flags(monkeypatch, "avx2")
    trainer = _seed_api(_mlp(), fused=True)
    result = trainer.train_window((_batch(seed=k) for k in range(4)), _mse)
    assert (
        trainer.precision.name == "bf16"
        and trainer.decision.source == Source.MEASURED
        and "first batch" in trainer.decision.reason
    )
    assert result.steps == 4 and result.eager is None and trainer.training_steps == 4
    assert trainer.train_window(iter(()), _mse).steps == 0


def test_an_empty_first_window_leaves_the_decision_pending(monkeypatch, timings):
    _flags(monkeypatch, "avx2")
    trainer = _seed_api(_mlp(), fused=True)
    assert trainer.train_window([], _mse).steps == 0 and trainer.auto_pending and timings["calls"] == []


def test_a_checkpoint_saved_before_the_first_batch_loads(monkeypatch, timings, tmp_path):
    _flags(monkeypatch, "avx2")
    pending = _seed_api(_mlp(seed=3))
    path = pending.save_checkpoint(tmp_path / "pending.pt")
    for into in (_seed_api(_mlp(seed=4)), _seed_api(_mlp(seed=4), "fp32")):
        into.load_checkpoint(path)
        assert all(torch.equal(a, b) for a, b in zip(into.model.parameters(), pending.model.parameters()))
    resumed = _seed_api(_mlp(seed=4))
    resumed.load_checkpoint(path)
    _train(resumed, 2)
    assert resumed.precision.name == "bf16" and resumed.decision.source in (Source.MEASURED, Source.CACHED)


def test_a_decision_passed_in_or_a_named_precision_never_waits(monkeypatch, timings):
    _flags(monkeypatch, "avx2")
    for precision in ("fp32", "bf16", "fp16"):
        trainer = _seed_api(_mlp(), precision)
        assert not trainer.auto_pending
    model = _mlp()
    disabled = FP16Trainer(
        model, torch.optim.SGD(model.parameters(), 0.1), FP16TrainingConfig(precision="auto", enabled=False)
    )
    assert not disabled.auto_pending and disabled.precision.name == "fp32"
    _train(disabled, 1)
    assert timings["calls"] == []


def _noisy_mse(model: torch.nn.Module, batch) -> torch.Tensor:
    """A loss that draws from NumPy's and Python's global RNGs (label noise), as user code does."""
    import random

    import numpy as np

    x, y = batch
    noise = torch.as_tensor(np.random.normal(0.0, 0.1, size=tuple(y.shape)), dtype=y.dtype) * random.random()
    return torch.nn.functional.mse_loss(model(x).float(), y + noise)


def test_auto_with_a_loss_that_draws_from_numpy_and_random_trains_as_the_named_precision(monkeypatch, timings):
    """The measurement's 40-55 extra loss calls draw from NumPy's and Python's RNGs too; they are restored, so
    the weights after 10 steps are those of the same precision asked for by name."""
    import random

    import numpy as np

    _flags(monkeypatch, "avx2")
    runs = {}
    for precision in ("auto", "bf16"):
        model = _mlp()
        trainer = _seed_api(model, precision)
        np.random.seed(7)
        random.seed(7)
        for k in range(10):
            trainer.backward_and_step(trainer.training_step(_batch(seed=k), _noisy_mse))
        runs[precision] = ([p.detach().clone() for p in model.parameters()], trainer.precision.name, np.random.rand())
    assert runs["auto"][1] == runs["bf16"][1] == "bf16" and timings["calls"]
    assert all(torch.equal(a, b) for a, b in zip(runs["auto"][0], runs["bf16"][0]))
    assert runs["auto"][2] == runs["bf16"][2]


def test_a_loss_closing_over_the_callers_batchnorm_model_leaves_it_untouched(monkeypatch, timings):
    """The loss ignores the copy it is given and runs the caller's model (and its BatchNorm): found at the first
    loss call, before any timed step; the running statistics and the counter are as they were; the rule decides."""
    _flags(monkeypatch, "avx2")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 2))
    calls = [0]

    def closing(_copy, batch):
        calls[0] += 1
        return torch.nn.functional.mse_loss(model(batch[0]).float(), batch[1])

    trainer = _seed_api(model)
    buffers = {k: v.clone() for k, v in model.state_dict().items() if "running" in k or "num_batches" in k}
    trainer._decide_at_first_batch(_batch(), closing)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in buffers.items())
    assert int(model[1].num_batches_tracked) == 0 and calls[0] == 1 and timings["calls"] == []
    assert trainer.decision.source == Source.RULE and "another model" in trainer.decision.reason


@pytest.mark.parametrize("kind", ["nan", "empty"])
def test_a_nan_or_empty_first_batch_is_not_measured_and_caches_nothing(monkeypatch, timings, tmp_path, kind):
    _flags(monkeypatch, "avx2")
    x, y = _batch()
    batch = (x, y * float("nan")) if kind == "nan" else (x[:0], y[:0])
    trainer = _seed_api(_mlp())
    trainer._decide_at_first_batch(batch, _mse)
    assert trainer.decision.source == Source.RULE and timings["calls"] == []
    assert ("not finite" if kind == "nan" else "empty") in trainer.decision.reason
    assert not (tmp_path / "precision.json").exists()
    clean = _seed_api(_mlp())  # a clean first batch of the same workload is measured, not read as fp32 from the cache
    clean._decide_at_first_batch(_batch(), _mse)
    assert clean.decision.source == Source.MEASURED and clean.precision.name == "bf16"

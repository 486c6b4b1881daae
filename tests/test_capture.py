"""The captured window's bookkeeping (genesis_fp16/training/capture.py) on the CPU, with a stand-in for the CUDA
graph that records the step and calls it again on every replay: which steps warm up, which are captured and
replayed, what a replay copies in, when the graphs are dropped, and what is said when a step cannot be captured.
The kernels themselves (a real capture against the eager window, bit for bit) are `tests/test_gpu.py`'s."""

from __future__ import annotations

import math

import pytest
import torch
from structlog.testing import capture_logs

from genesis_fp16 import FP16Trainer, FP16TrainingConfig
from genesis_fp16.training import capture, trainer as trainer_module
from tests.test_window import _events, _same_weights


class StandInGraph:
    """`capture.CudaGraph`'s interface on the CPU: `record` keeps the step (running none of it, as a capture runs
    no kernel) and returns a static output; `replay` runs it and writes that output."""

    recorded = 0

    def __init__(self) -> None:
        self.fn = None
        self.out = (torch.full((), math.nan), torch.full((), math.nan))

    def record(self, fn):
        StandInGraph.recorded += 1
        self.fn = fn
        return self.out

    def replay(self) -> None:
        for static, value in zip(self.out, self.fn()):
            static.copy_(value)


@pytest.fixture
def stand_in(monkeypatch):
    """Capture on the CPU: the blocker passes a CPU trainer whose config allows capture, graphs are stand-ins."""
    real = capture.capture_blocker

    def blocker(trainer):
        why = real(trainer)
        return None if why is not None and why.startswith("CUDA graphs need a CUDA device") else why

    monkeypatch.setattr(trainer_module, "capture_blocker", blocker)
    monkeypatch.setattr(capture, "CudaGraph", StandInGraph)
    StandInGraph.recorded = 0


def _trainer(precision: str, capture_on: bool = True, **config) -> FP16Trainer:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, fused=True)
    return FP16Trainer(model, opt, FP16TrainingConfig(precision=precision, capture=capture_on, **config))


def _data(n: int, bad: frozenset = frozenset(), rows: int = 32):
    """Batches whose inputs are NaN at the steps in ``bad``: a storm in the data, which a captured step sees (a loss
    function that counts its calls in Python runs once, at the capture)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        x, y = torch.randn(rows, 4, generator=g), torch.randn(rows, 1, generator=g)
        out.append((x * math.nan if i in bad else x, y))
    return out


def _mse(model, batch):
    return ((model(batch[0]).float() - batch[1]) ** 2).mean()


def _windows(trainer, batches, size=8):
    result = []
    for start in range(0, len(batches), size):
        result += trainer.train_window(batches[start : start + size], _mse).stepped
    return result


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("bad", [frozenset(), frozenset({5, 6, 7, 12, 20})], ids=["clean", "nan_storm"])
def test_a_captured_window_trains_as_the_eager_one(stand_in, precision, bad):
    batches = _data(24, bad)
    eager, captured = _trainer(precision, capture_on=False), _trainer(precision)
    with capture_logs() as eager_logs:
        taken = _windows(eager, batches)
    with capture_logs() as captured_logs:
        replayed = _windows(captured, batches)
    graphs = captured.step_graphs
    assert eager.step_graphs is None and graphs is not None
    assert graphs.captures == 1 and StandInGraph.recorded == 1
    assert graphs.replays == 24 - capture.WARMUP  # every step after the warm-up, the captured one included
    assert replayed == taken and taken.count(False) == len(bad)
    assert _same_weights(eager, captured)
    assert _events(captured_logs) == _events(eager_logs)
    for name in ("training_steps", "skipped_steps", "nonfinite_losses", "samples_seen", "micro_steps"):
        assert getattr(eager, name) == getattr(captured, name), name
    assert eager.scaler.state_dict() == captured.scaler.state_dict()


def test_an_fp16_overflow_in_a_captured_window_backs_the_scale_off_as_the_eager_one(stand_in):
    """Targets of 1e4 make the scaled FP16 gradients overflow (the loss itself is finite): skipped, the scale
    backed off, alike."""
    batches = _data(16)
    batches[9] = (batches[9][0], batches[9][1] * 1e4)
    eager, captured = _trainer("fp16", capture_on=False), _trainer("fp16")
    with capture_logs() as eager_logs:
        taken = _windows(eager, batches)
    with capture_logs() as captured_logs:
        replayed = _windows(captured, batches)
    assert replayed == taken and eager.overflow_steps == captured.overflow_steps >= 1
    assert _same_weights(eager, captured) and eager.precision.scale == captured.precision.scale
    assert _events(captured_logs) == _events(eager_logs)
    assert [e for e in captured_logs if e["event"] == "trainer.scale_changed"]


def test_a_new_learning_rate_or_a_loaded_checkpoint_drops_the_graphs(stand_in, tmp_path):
    batches = _data(24)
    t = _trainer("fp32")
    _windows(t, batches[:8])
    assert t.step_graphs.captures == 1
    _windows(t, batches[8:12])
    assert t.step_graphs.captures == 1  # the same state: replayed
    for group in t.optimizer.param_groups:
        group["lr"] = 1e-3  # baked into a captured step: it is captured again after a warm-up
    _windows(t, batches[12:20])
    assert t.step_graphs.captures == 2
    path = t.save_checkpoint(tmp_path / "t.pt")
    t.load_checkpoint(path)  # the optimizer's state tensors are new ones
    replays = t.step_graphs.replays
    _windows(t, batches[20 : 20 + capture.WARMUP])
    assert t.step_graphs.captures == 2 and t.step_graphs.replays == replays  # warming up again, eagerly
    _windows(t, batches[:4])
    assert t.step_graphs.captures == 3


def test_each_batch_shape_has_its_graph_and_a_fifth_drops_the_oldest(stand_in):
    t = _trainer("fp32")
    shapes = [8, 16, 24, 32, 40]
    for rows in shapes:
        _windows(t, _data(capture.WARMUP + 2, rows=rows))
    graphs = t.step_graphs
    assert graphs.captures == 5 and len(graphs.graphs) == capture.MAX_GRAPHS
    kept_rows = sorted(key[1][1][0] for key in graphs.graphs)
    assert kept_rows == shapes[1:]


def test_a_step_that_cannot_be_captured_runs_eagerly_and_says_why_once(stand_in, monkeypatch):
    class Refusing(StandInGraph):
        def record(self, fn):  # as torch.cuda.graph raises on a .item() inside the captured step
            raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(capture, "CudaGraph", Refusing)
    batches = _data(16)
    eager, t = _trainer("bf16", capture_on=False), _trainer("bf16")
    _windows(eager, batches)
    with capture_logs() as logs:
        stepped = _windows(t, batches)
    said = [e for e in logs if e["event"] == "trainer.window_uncaptured"]
    assert len(said) == 1 and "capture failed: RuntimeError: operation not permitted" in said[0]["reason"]
    assert all(stepped) and len(stepped) == 16 and t.step_graphs.captures == 0 and t.step_graphs.replays == 0
    assert _same_weights(eager, t)  # the refused capture changed nothing: every step ran eagerly


def test_a_batch_with_an_unhashable_leaf_runs_eagerly(stand_in):
    batches = [(x, y, {"note": {1, 2}}) for x, y in _data(8)]
    t = _trainer("fp32")
    with capture_logs() as logs:
        t.train_window(batches, lambda model, batch: _mse(model, batch[:2]))
    assert t.step_graphs.captures == 0 and t.training_steps == 8
    assert [e["reason"] for e in logs if e["event"] == "trainer.window_uncaptured"] == [
        "a batch leaf that is neither a tensor nor hashable"
    ]


def test_capture_is_off_where_it_cannot_run_and_on_cuda_says_why():
    cpu = _trainer("fp32")
    assert capture.capture_blocker(cpu).startswith("CUDA graphs need a CUDA device")
    assert "capture=False" in capture.capture_blocker(_trainer_on_cuda_flag(capture_on=False))
    with pytest.raises(ValueError, match="capture='no': expected True or False"):
        FP16TrainingConfig(capture="no")


def _trainer_on_cuda_flag(capture_on: bool) -> FP16Trainer:
    """A CPU trainer that calls its device CUDA for the blocker's device check alone."""
    t = _trainer("fp32", capture_on=capture_on)
    t.device = torch.device("cuda")
    return t


def test_a_plain_sgd_is_not_captured(stand_in):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    t = FP16Trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1, fused=True), FP16TrainingConfig(precision="fp32")
    )
    t.device = torch.device("cuda")
    assert "neither a fused Adam/AdamW nor built with capturable=True" in capture.capture_blocker(t)


def test_auto_times_the_captured_steps_and_not_their_capture(stand_in, monkeypatch):
    """auto's calibration (genesis_fp16/precision/measure.py) runs each copy's warm-up and capture in its untimed
    first call: every timed call (the probe and the rounds) replays, so a capture's cost never lands in one precision's
    round (on an H200 it put bf16's worst round at L at 0.91x fp32 where its median was 1.83x)."""
    from genesis_fp16.precision import calibration as cal
    from genesis_fp16.precision.measure import measure_auto
    from genesis_fp16.training.trainer import calibration_copies

    timed_captures = []
    real_time_step = cal.time_step

    def time_step(mode, run, steps, device):
        before = StandInGraph.recorded
        seconds = real_time_step(mode, run, steps, device)
        timed_captures.append(StandInGraph.recorded - before)
        return seconds

    monkeypatch.setattr(cal, "time_step", time_step)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, fused=True)
    copies = calibration_copies(FP16TrainingConfig(), "cpu", "auto")
    result = measure_auto(model, optimizer, _data(1)[0], _mse, device="cpu", copy_trainer=copies)
    assert StandInGraph.recorded == len(result.seconds)  # one capture per precision timed
    assert len(timed_captures) > len(result.seconds) and not any(timed_captures)

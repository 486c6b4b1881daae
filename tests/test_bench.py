"""Tests for genesis_fp16.bench: the CLI's output shape, the raw loop's
equivalence with our trainer, fallbacks (compile, oneDNN, CUDA graphs) and
memory measurement. Timings themselves are not asserted (a shared 2-core
machine); shapes, finiteness and semantics are."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tf32_probe import RecordMatmulPrecision
from typer.testing import CliRunner

from genesis_fp16 import FP16Trainer
from genesis_fp16 import precision as P
from genesis_fp16.bench import PRECISIONS, harness, measure, models, options, runner
from genesis_fp16.bench.harness import CellFlags
from genesis_fp16.bench.loops import RawLoop, trainer_config
from genesis_fp16.bench.measure import PeakMemory
from genesis_fp16.bench.models import SIZES, make_task
from genesis_fp16.bench.options import BenchOptions
from genesis_fp16.precision import capability
from genesis_fp16.settings import PrecisionMode
from genesis_fp16.telemetry import get_logger, read_events

REPO = Path(__file__).resolve().parents[1]
REQUIRED = ("size", "precision", "samples_per_s", "peak_mem_mb", "val_loss", "val_loss_delta_vs_fp32", "overhead_vs_raw")
CPU = torch.device("cpu")


def _app():
    from genesis_fp16.cli import app

    return app


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One `bench --quick` through the CLI, shared by the shape tests."""
    out = tmp_path_factory.mktemp("bench")
    args = ["bench", "--quick", "--json", str(out / "r.json"), "--csv", str(out / "r.csv"), "--plot", str(out / "r.png")]
    result = CliRunner().invoke(_app(), args)
    assert result.exit_code == 0, result.output
    return out, result


def test_quick_json_shape_and_finite_positive_numbers(quick_run):
    out, _ = quick_run
    data = json.loads((out / "r.json").read_text())
    header = data["header"]
    for key in ("device", "device_name", "torch_version", "cpu_flags", "date", "command"):
        assert header[key] not in (None, ""), key
    assert header["torch_version"] == torch.__version__
    assert header["command"].startswith("genesis-fp16 bench") and "--quick" in header["command"]
    rows = data["rows"]
    assert {r["precision"] for r in rows} == {"fp32", "bf16", "fp16"}
    for row in rows:
        for key in REQUIRED:
            assert key in row, key
        for key in ("samples_per_s", "raw_samples_per_s", "val_loss", "overhead_vs_raw", "speedup_vs_fp32"):
            assert math.isfinite(row[key]) and row[key] > 0, (key, row)
        assert math.isfinite(row["peak_mem_mb"]) and row["peak_mem_mb"] >= 0
        assert math.isfinite(row["val_loss_delta_vs_fp32"])
        assert 0.0 <= row["overflow_rate"] <= 1.0
        assert row["quality_steps"] == models.QUICK_STEPS["S"]
    fp32 = next(r for r in rows if r["precision"] == "fp32")
    assert fp32["val_loss_delta_vs_fp32"] == 0.0 and fp32["speedup_vs_fp32"] == 1.0
    # the student learned something in the fixed steps, and reduced precision stays close
    initial = models.validation_loss(make_task(SIZES["S"], 0, CPU).make_model(0, CPU), make_task(SIZES["S"], 0, CPU))
    assert fp32["val_loss"] < 0.7 * initial
    assert all(abs(r["val_loss_delta_vs_fp32"]) <= 0.02 for r in rows)
    # TF32 on a CPU is reported as not applicable, never as a fake row
    if header["device"] == "cpu":
        assert [(n["size"], n["precision"]) for n in data["not_applicable"]] == [("S", "tf32")]
    assert {c["check"] for c in data["summary"]["checks"]} >= {"overhead_vs_raw at every size"}


def test_quick_csv_is_device_stamped_and_plot_is_png(quick_run):
    out, result = quick_run
    with open(out / "r.csv", newline="") as fh:
        lines = list(csv.DictReader(fh))
    measured = [r for r in lines if r["samples_per_s"]]
    assert len(measured) == 3
    for row in lines:
        assert row["torch_version"] == torch.__version__ and row["device"] and row["date"] and row["command"]
    assert any("not_applicable" in r["notes"] for r in lines) == (not torch.cuda.is_available())
    assert (out / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| S | MLP h64 b64 | fp32 |" in result.stdout


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_raw_loop_does_the_same_work_as_the_trainer(precision):
    """The overhead ratio is only fair if both loops compute the same thing:
    from the same weights and batches they must end bit-identical."""
    task = make_task(SIZES["S"], 3, CPU, n_train_batches=2)
    config = trainer_config(precision, CPU)
    m1, m2 = task.make_model(3, CPU), task.make_model(3, CPU)
    trainer = FP16Trainer(m1, torch.optim.Adam(m1.parameters(), lr=1e-3), config)
    raw = RawLoop(m2, torch.optim.Adam(m2.parameters(), lr=1e-3), config, trainer.precision)
    for i in range(6):
        batch = task.train[i % 2]
        trainer.backward_and_step(trainer.training_step(batch, task.loss_fn))
        raw.step(batch, task.loss_fn)
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p1, p2)
    assert trainer.scaler.is_enabled() == raw.scaler.is_enabled() == (precision == "fp16")
    if precision == "fp16":
        assert raw.scaler.get_scale() == trainer.scaler.get_scale()


def test_raw_loop_skips_a_nonfinite_loss_like_the_trainer():
    task = make_task(SIZES["S"], 0, CPU, n_train_batches=1)
    model = task.make_model(0, CPU)
    before = [p.detach().clone() for p in model.parameters()]
    raw = RawLoop(model, torch.optim.Adam(model.parameters()), trainer_config("fp32", CPU), P.resolve_precision("fp32", CPU))
    nan_loss = lambda m, b: m(b[0]).float().sum() * float("nan")  # noqa: E731
    assert raw.step(task.train[0], nan_loss) is False
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())


def test_relative_figures_and_checks():
    rows = [
        {"size": "L", "precision": "fp32", "samples_per_s": 100.0, "val_loss": 0.5, "peak_mem_mb": 40.0, "overhead_vs_raw": 1.01},
        {"size": "L", "precision": "bf16", "samples_per_s": 180.0, "val_loss": 0.505, "peak_mem_mb": 30.0, "overhead_vs_raw": 1.02},
        {"size": "L", "precision": "fp16", "samples_per_s": 50.0, "val_loss": 0.52, "peak_mem_mb": 30.0, "overhead_vs_raw": 1.07},
    ]
    runner._relative_to_fp32(rows)
    assert [r["speedup_vs_fp32"] for r in rows] == pytest.approx([1.0, 1.8, 0.5])
    assert [r["val_loss_delta_vs_fp32"] for r in rows] == pytest.approx([0.0, 0.01, 0.04])
    assert rows[1]["peak_mem_vs_fp32"] == pytest.approx(0.75)
    summary = runner.summarize({"header": {"device": "cpu"}, "rows": rows})
    checks = {c["check"]: c["passed"] for c in summary["checks"]}
    assert checks == {
        "overhead_vs_raw at every size": False,  # 1.07 > 1.05
        "val-loss delta bf16/fp16 vs fp32": False,  # fp16 is 4% off
        "bf16 speed-up at L (CPU)": True,  # 1.8 >= 1.6
    }
    gpu = runner.summarize({"header": {"device": "cuda:0"}, "rows": rows})
    assert {c["check"] for c in gpu["checks"]} >= {"fp16 speed-up at L vs strict fp32", "bf16 peak memory at L vs fp32"}


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sizes", "S,XL"], "unknown size(s) XL"),
        (["--precisions", "fp8"], "unknown precision(s) fp8"),
        (["--repeats", "0"], "repeats=0"),
        (["--threads", "0"], "threads=0"),
        (["--clock", "cpu"], "add --threads 1"),
        (["--clock", "sundial", "--threads", "1"], "clock='sundial'"),
        (["--device", "cuda:0"] if not torch.cuda.is_available() else ["--device", "nonsense"], "--device" if not torch.cuda.is_available() else "device"),
    ],
)
def test_bad_input_gives_one_clear_error(args, message):
    result = CliRunner().invoke(_app(), ["bench", "--quick", *args])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_tf32_is_cuda_only_and_bf16_needs_support(monkeypatch):
    assert "not applicable" in options.not_applicable_reason("tf32", CPU)
    assert options.not_applicable_reason("bf16", CPU) is None
    cuda = torch.device("cuda")
    monkeypatch.setattr(capability, "cuda_supports_tf32", lambda d: True)
    monkeypatch.setattr(capability, "cuda_supports_bf16", lambda d: False)
    assert options.not_applicable_reason("tf32", cuda) is None
    assert "BF16" in options.not_applicable_reason("bf16", cuda)
    cells, skipped = runner.plan(BenchOptions(sizes=[SIZES["S"]]), CPU)
    assert [p for _, p in cells] == ["fp32", "bf16", "fp16"] and skipped[0]["precision"] == "tf32"


def test_compile_failure_falls_back_to_eager_with_a_logged_reason(monkeypatch, state_dir):
    class Broken(torch.nn.Module):  # like torch.compile: a module that fails lazily, at the first call
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args, **kwargs):
            raise RuntimeError("simulated inductor failure: no C++ compiler")

    broken_compile = lambda model, *a, **k: Broken(model)  # noqa: E731

    monkeypatch.setattr(torch, "compile", broken_compile)
    options = BenchOptions(sizes=[SIZES["S"]], precisions=["fp32"], quick=True, repeats=1, compile=True, chunk_s=0.01)
    result = runner.run_benchmark(options)
    (row,) = result["rows"]
    assert row["compiled"] is False and "torch.compile failed" in row["notes"]
    assert "simulated inductor failure" in row["notes"]
    events = [e for e in read_events(state_dir / "events.jsonl") if e["event"] == "bench.compile_failed"]
    assert events and "simulated inductor failure" in events[0]["reason"]


def test_onednn_missing_kernel_falls_back_to_aten(state_dir):
    """FP16 LSTM on this CPU has no oneDNN primitive; the bench reruns the cell
    with mkldnn disabled and says so. Simulated here so it runs on any CPU."""
    task = make_task(SIZES["S"], 0, CPU, n_train_batches=2)

    def loss_fn(model, batch):
        if torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled:
            raise RuntimeError("could not create a primitive descriptor for the LSTM forward propagation primitive")
        return models._mse(model, batch)

    task.loss_fn = loss_fn
    flags = harness.prime_cell(SIZES["S"], "fp16", task, BenchOptions(), CPU, get_logger("test"))
    assert flags.mkldnn_off and "oneDNN" in flags.notes[0]
    cell = harness.build_cell(SIZES["S"], "fp16", task, BenchOptions(), CPU, flags, get_logger("test"))
    harness.run_quality(cell, 3)
    assert cell.quality["quality_steps"] == 3 and math.isfinite(cell.quality["val_loss"])
    assert any(e["event"] == "bench.onednn_fallback" for e in read_events(state_dir / "events.jsonl"))


def test_other_errors_are_reported_as_failed_cells(monkeypatch):
    real = models.Task.make_model

    def make_model(self, seed, device):
        if self.spec.name == "S":
            raise RuntimeError("out of memory (simulated)")
        return real(self, seed, device)

    monkeypatch.setattr(models.Task, "make_model", make_model)
    result = runner.run_benchmark(BenchOptions(sizes=[SIZES["S"]], precisions=["fp32"], quick=True, repeats=1, chunk_s=0.01))
    assert result["rows"] == [] and "out of memory (simulated)" in result["failed"][0]["reason"]


def test_cuda_graph_capture_runs_under_autocast_without_weight_cache(monkeypatch):
    seen = {}

    def fake_graphed(module, sample):
        seen["autocast"] = torch.is_autocast_enabled("cpu")
        seen["cache"] = torch.is_autocast_cache_enabled()
        seen["dtype"] = torch.get_autocast_dtype("cpu")
        return module

    monkeypatch.setattr(torch.cuda, "make_graphed_callables", fake_graphed)
    model = torch.nn.Linear(4, 4)
    precision = P.resolve_precision("bf16", CPU)
    assert measure.graph_model(model, torch.randn(2, 4), precision) is model
    assert seen == {"autocast": True, "cache": False, "dtype": torch.bfloat16}
    # only on CUDA, only small sizes, only when asked
    cuda = torch.device("cuda")
    assert measure.should_graph(SIZES["S"], cuda, True) and measure.should_graph(SIZES["M"], cuda, True)
    assert not measure.should_graph(SIZES["L"], cuda, True)
    assert not measure.should_graph(SIZES["S"], cuda, False)
    assert not measure.should_graph(SIZES["S"], CPU, True)


def test_cuda_graph_failure_runs_ungraphed_and_says_why(monkeypatch, state_dir):
    monkeypatch.setattr(measure, "should_graph", lambda spec, device, enabled: True)

    def boom(module, sample):
        raise RuntimeError("capture failed (simulated)")

    monkeypatch.setattr(torch.cuda, "make_graphed_callables", boom)
    task = make_task(SIZES["S"], 0, CPU, n_train_batches=1)
    flags = CellFlags()
    cell = harness.build_cell(SIZES["S"], "fp32", task, BenchOptions(), CPU, flags, get_logger("test"))
    assert cell.graphed is False and cell.train_model is cell.model
    assert "capture failed (simulated)" in flags.notes[0]
    assert any(e["event"] == "bench.cuda_graphs_failed" for e in read_events(state_dir / "events.jsonl"))


def test_peak_memory_sees_a_large_allocation_on_cpu():
    with PeakMemory(CPU) as mem:
        block = torch.ones(16 * 2**20)  # 64 MiB, touched
        block.add_(1)
        import time

        time.sleep(0.02)
        del block
    assert 48 <= mem.peak_mb <= 200
    with PeakMemory(CPU) as idle:
        pass
    assert idle.peak_mb < 16


def test_script_wrapper_writes_the_seed_csv_and_a_plot(tmp_path):
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "benchmark_fp16_training.py"), "--quick", "--precisions", "fp32,bf16", "--repeats", "1", "--chunk-s", "0.01", "--threads", "1", "--out-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = list(csv.DictReader(open(out / "fp16_vs_fp32_results.csv", newline="")))
    assert [r["precision"] for r in rows if r["samples_per_s"]] == ["fp32", "bf16"]
    assert (out / "fp16_vs_fp32_results.png").stat().st_size > 1000
    data = json.loads((out / "fp16_vs_fp32_results.json").read_text())
    assert "--csv" in data["header"]["command"] and "--threads 1" in data["header"]["command"]
    assert data["header"]["torch_threads"] == 1
    bad = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "benchmark_fp16_training.py"), "--sizes", "XL", "--out-dir", str(out)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert bad.returncode == 2 and "unknown size(s) XL" in bad.stderr


def test_trainer_switches_back_to_train_mode_only_when_needed():
    """The bench found model.train() on every step cost 1-2% at size S; the
    trainer now calls it only when the model is in eval mode. (Trainer
    semantics; kept here beside the measurement that motivated it.)"""
    task = make_task(SIZES["S"], 0, CPU, n_train_batches=1)
    model = task.make_model(0, CPU)
    trainer = FP16Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01), trainer_config("fp32", CPU))
    model.eval()  # e.g. a validation pass
    trainer.training_step(task.train[0], task.loss_fn)
    assert all(m.training for m in model.modules())
    model.net[1].eval()  # a submodule the caller froze on purpose stays frozen
    trainer.training_step(task.train[0], task.loss_fn)
    assert model.training and not model.net[1].training


def test_precisions_come_from_the_vocabulary():
    assert PRECISIONS == tuple(m.value for m in P.MODES if P.MODES[m].keeps_fp32_weights)
    assert PRECISIONS == ("fp32", "tf32", "bf16", "fp16") and set(PRECISIONS) <= {m.value for m in PrecisionMode}
    config = trainer_config("tf32", CPU)
    assert config.precision == "tf32" and config.on_unsupported == "error"


def test_raw_loop_runs_tf32_forward_and_backward_through_the_plugin():
    """The tf32 row's raw loop gets TF32 switches from the plugin for both passes,
    as the trainer does (the switches are CUDA's; recorded here on any machine)."""
    model = torch.nn.Linear(3, 1)
    raw = RawLoop(model, torch.optim.SGD(model.parameters(), lr=0.1), trainer_config("fp32", CPU), P.TF32(CPU))
    RecordMatmulPrecision.seen = []
    loss_fn = lambda m, b: RecordMatmulPrecision.apply(m(b)).float().sum()  # noqa: E731
    assert raw.step(torch.ones(2, 3), loss_fn) is True
    assert RecordMatmulPrecision.seen == [("forward", "tf32"), ("backward", "tf32")]
    assert torch.backends.cuda.matmul.fp32_precision != "tf32"


def test_cuda_graph_capture_for_tf32_has_the_switches_and_no_autocast(monkeypatch):
    seen = {}

    def fake_graphed(module, sample):
        seen["autocast"] = torch.is_autocast_enabled("cpu")
        seen["matmul"] = torch.backends.cuda.matmul.fp32_precision
        return module

    monkeypatch.setattr(torch.cuda, "make_graphed_callables", fake_graphed)
    model = torch.nn.Linear(4, 4)
    assert measure.graph_model(model, torch.randn(2, 4), P.TF32(CPU)) is model
    assert seen == {"autocast": False, "matmul": "tf32"}


def test_cpu_clock_counts_this_threads_time_only():
    """Sleeping costs wall time but no CPU time: the cpu clock is blind to waiting
    (and so to other processes' load), the wall clock is not."""
    from genesis_fp16.bench.measure import time_chunk

    def nap(i):
        time.sleep(0.02)

    assert time_chunk(nap, 3, CPU, "wall") >= 0.05
    assert time_chunk(nap, 3, CPU, "cpu") < 0.03
    with pytest.raises(ValueError, match="use --clock wall"):
        options.check_clock("cpu", torch.device("cuda"))


def test_cpu_clock_run_is_stamped(tmp_path):
    result = CliRunner().invoke(_app(), ["bench", "--quick", "--threads", "1", "--clock", "cpu", "--json", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["header"]["clock"] == "cpu" and "--clock cpu" in data["header"]["command"]
    assert all(row["overhead_vs_raw"] > 0 for row in data["rows"])


def _checked(quick: bool) -> dict:
    checks = [
        {"check": "overhead_vs_raw at every size", "value": 1.336, "goal": "<= 1.05", "passed": False},
        {"check": "val-loss delta bf16/fp16 vs fp32", "value": 0.01, "goal": "<= 2%", "passed": True},
    ]
    return {"header": {"quick": quick}, "summary": {"checks": checks}}


def test_quick_checks_are_a_smoke_run_without_verdict():
    from genesis_fp16.bench.cli import SMOKE_NOTE, check_lines

    quick = check_lines(_checked(quick=True))
    assert [mark for mark, _ in quick] == ["smoke", "smoke", "smoke"]
    assert SMOKE_NOTE in quick[0][1] and "no verdict" in SMOKE_NOTE
    assert not any("FAIL" in mark or "pass" == mark for mark, _ in quick)
    full = check_lines(_checked(quick=False))
    assert [mark for mark, _ in full] == ["FAIL", "pass"]
    assert "overhead_vs_raw at every size: 1.336 (goal <= 1.05)" in full[0][1]


def _fake_run(options, update):
    """What run_benchmark returns, without measuring: one row, one check that
    fails and one that passes."""
    row = {
        "size": "S", "model": "mlp", "precision": "fp32", "samples_per_s": 1000.0, "speedup_vs_fp32": None,
        "overhead_vs_raw": 1.336, "overhead_min": 1.3, "overhead_max": 1.4, "peak_mem_mb": 1.0, "val_loss": 0.5,
        "val_loss_delta_vs_fp32": None, "overflow_rate": 0.0, "notes": "",
    }  # fmt: skip
    header = {"quick": options.quick, "load_avg_start": [0.0, 0.0, 0.0], "load_avg_end": [0.0, 0.0, 0.0], "cpu_count": 2}
    return {"header": header, "rows": [row], "failed": [], "summary": _checked(options.quick)["summary"]}


@pytest.mark.parametrize(("args", "code"), [([], 1), (["--quick"], 0)], ids=["full", "quick"])
def test_full_run_with_a_failed_check_exits_1_after_writing_everything(monkeypatch, tmp_path, args, code):
    monkeypatch.setattr(runner, "run_benchmark", _fake_run)
    out = tmp_path / "r.json"
    result = CliRunner().invoke(_app(), ["bench", *args, "--sizes", "S", "--precisions", "fp32", "--json", str(out)])
    assert result.exit_code == code, result.output
    assert json.loads(out.read_text())["summary"]["checks"][0]["passed"] is False  # written either way
    assert "| S | mlp | fp32 |" in result.output  # the table too
    if code:
        assert "FAIL overhead_vs_raw at every size" in result.output
        assert "1 of 2 acceptance checks failed: overhead_vs_raw at every size" in result.output
    else:
        assert "FAIL overhead" not in result.output and "smoke overhead_vs_raw" in result.output
        assert "no verdict" in result.output and "checks failed" not in result.output


def test_full_run_with_every_check_passed_exits_0(monkeypatch, tmp_path):
    def passing(options, update):
        result = _fake_run(options, update)
        for check in result["summary"]["checks"]:
            check["passed"] = True
        return result

    monkeypatch.setattr(runner, "run_benchmark", passing)
    result = CliRunner().invoke(_app(), ["bench", "--sizes", "S", "--precisions", "fp32"])
    assert result.exit_code == 0, result.output
    assert "FAIL" not in result.output and "checks failed" not in result.output

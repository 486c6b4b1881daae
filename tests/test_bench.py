"""Tests for genesis_fp16_tools.bench: the CLI's output shape, the raw loop's
equivalence with our trainer, fallbacks (compile, oneDNN, CUDA graphs) and
memory measurement. Timings themselves are not asserted (a shared 2-core
machine); shapes, finiteness and semantics are."""

from __future__ import annotations

import csv
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tf32_probe import RecordMatmulPrecision
from typer.testing import CliRunner

from genesis_fp16 import FP16Trainer
from genesis_fp16.precision.modes import MODES
from genesis_fp16.precision.plugins import TF32
from genesis_fp16.precision.decision import decide
from genesis_fp16.precision.request import PrecisionRequest
from genesis_fp16_tools.bench import PRECISIONS, harness, limits, models, options, report, runner
from genesis_fp16_tools.bench.harness import CellFlags
from genesis_fp16_tools.bench.loops import RawLoop, trainer_config
from genesis_fp16_tools.bench.measure import PeakMemory
from genesis_fp16_tools.bench.models import SIZES, make_task
from genesis_fp16_tools.bench.options import BenchOptions
from genesis_fp16.base.extras import MissingExtraError
from genesis_fp16.precision import capability
from genesis_fp16.base.settings import PrecisionMode
from genesis_fp16.base.telemetry import get_logger, read_events


def plugin_for(requested, device, on_unsupported="fallback", config=None, *, plugins=MODES):
    """The plugin a trainer asked for ``requested`` on ``device`` runs: the request decided by the one decision
    (``auto``: the flag rule), its mode's class from ``plugins``."""
    request = PrecisionRequest.parse(requested, on_unsupported=on_unsupported)
    return plugins[decide(request, device).mode](device, config)


REPO = Path(__file__).resolve().parents[1]
REQUIRED = (
    "size",
    "precision",
    "samples_per_s",
    "peak_mem_mb",
    "val_loss",
    "val_loss_delta_vs_fp32",
    "overhead_vs_raw",
)
CPU = torch.device("cpu")


def _app():
    from genesis_fp16.cli import app

    return app


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One `bench --quick` through the CLI, shared by the shape tests."""
    out = tmp_path_factory.mktemp("bench")
    args = [
        "bench",
        "--quick",
        "--json",
        str(out / "r.json"),
        "--csv",
        str(out / "r.csv"),
        "--plot",
        str(out / "r.png"),
    ]
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
        # the limit columns: FLOPs per step, the precision's peak, step time / limit time
        assert row["mode"] == "eager" and row["flops_per_step"] == limits.flops_per_step(SIZES["S"])
        for key in ("achieved_tflops", "peak_tflops", "limit_ms_per_step", "x_off_limit"):
            assert math.isfinite(row[key]) and row[key] > 0, (key, row)
        assert row["x_off_limit"] == pytest.approx(row["ms_per_step"] / row["limit_ms_per_step"])
        assert row["peak_source"].startswith(
            "measured: " if header["device"] == "cpu" else ("measured: ", "datasheet: ")
        )
    assert set(header["limits"]) == {"fp32", "bf16", "fp16"} and "3 x forward" in header["flops_formula"]
    assert set(data["summary"]["overhead_vs_raw_by_precision"]) == {"fp32", "bf16", "fp16"}
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
    for row in measured:
        assert row["mode"] == "eager" and int(row["flops_per_step"]) == limits.flops_per_step(SIZES["S"])
        assert float(row["x_off_limit"]) > 0 and float(row["limit_ms_per_step"]) > 0 and row["peak_source"]
    for row in lines:
        assert row["torch_version"] == torch.__version__ and row["device"] and row["date"] and row["command"]
    assert any("not_applicable" in r["notes"] for r in lines) == (not torch.cuda.is_available())
    assert (out / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| S | MLP h64 b64 | fp32 | eager |" in result.stdout
    assert (
        "| x off limit |" in result.stdout
        and "| precision | overhead vs raw, every size's repeats | worst size | each size |" in result.stdout
    )


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
    raw = RawLoop(model, torch.optim.Adam(model.parameters()), trainer_config("fp32", CPU), plugin_for("fp32", CPU))
    nan_loss = lambda m, b: m(b[0]).float().sum() * float("nan")  # noqa: E731
    assert raw.step(task.train[0], nan_loss) is False
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())


def test_relative_figures_and_checks():
    rows = [
        {
            "size": "L",
            "precision": "fp32",
            "samples_per_s": 100.0,
            "val_loss": 0.5,
            "peak_mem_mb": 40.0,
            "overhead_vs_raw": 1.01,
        },
        {
            "size": "L",
            "precision": "bf16",
            "samples_per_s": 180.0,
            "val_loss": 0.505,
            "peak_mem_mb": 30.0,
            "overhead_vs_raw": 1.02,
        },
        {
            "size": "L",
            "precision": "fp16",
            "samples_per_s": 50.0,
            "val_loss": 0.52,
            "peak_mem_mb": 30.0,
            "overhead_vs_raw": 1.07,
        },
    ]
    runner._relative_to_fp32(rows)
    assert [r["speedup_vs_fp32"] for r in rows] == pytest.approx([1.0, 1.8, 0.5])
    assert [r["val_loss_delta_vs_fp32"] for r in rows] == pytest.approx([0.0, 0.01, 0.04])
    assert rows[1]["peak_mem_vs_fp32"] == pytest.approx(0.75)
    summary = runner.summarize({"header": {"device": "cpu"}, "rows": rows})
    checks = {c["check"]: c["passed"] for c in summary["checks"]}
    assert checks == {
        "overhead_vs_raw at every size": False,  # 1.07 > 1.05
        "overhead_vs_raw per precision (every size's repeats)": False,  # fp16's one size: 1.07 > 1.03
        "val-loss delta bf16/fp16 vs fp32": False,  # fp16 is 4% off
        "bf16 speed-up at L (CPU)": True,  # 1.8 >= 1.6
    }
    gpu = runner.summarize({"header": {"device": "cuda:0"}, "rows": rows})
    assert {c["check"]: c["passed"] for c in gpu["checks"]} == {  # the overhead is a CPU check: CUDA runs captured
        "val-loss delta bf16/fp16 vs fp32": False,
        "bf16 speed-up at L vs strict fp32 (eager)": False,  # 1.8 < 3
        "fp16 speed-up at L vs strict fp32 (eager)": False,  # 0.5 < 2.5
    }


def test_the_per_precision_overhead_pools_every_sizes_repeats():
    """One burst of load in one size's repeats moves that size's median, not the precision's figure."""

    def row(size, ratios):
        return {"size": size, "precision": "fp32", "mode": "eager", "overhead_vs_raw": statistics.median(ratios),
                "overhead_ratios": ratios}  # fmt: skip

    rows = [row("S", [1.00, 1.01, 0.99, 1.02, 1.00]), row("M", [1.06, 1.05, 0.98, 1.07, 1.06])]
    by = runner.overhead_by_precision(rows)["fp32"]
    assert by["max"] == pytest.approx(1.06) and by["worst_size"] == "M"
    assert by["pooled"] == pytest.approx(1.015)  # the median of the ten ratios


def test_the_gpu_goals_read_the_captured_rows():
    def row(size, precision, mode, samples, **extra):
        return {"size": size, "precision": precision, "mode": mode, "samples_per_s": samples, "val_loss": 0.5,
                "peak_mem_mb": extra.pop("mem", 10.0), "overhead_vs_raw": 1.0, **extra}  # fmt: skip

    rows = [
        row("S", "fp32", "eager", 100.0), row("S", "fp32", "captured", 350.0),
        row("M", "fp32", "eager", 100.0), row("M", "fp32", "captured", 250.0),
        row("L", "fp32", "eager", 100.0), row("L", "fp32", "captured", 100.0),
        row("L", "bf16", "eager", 400.0), row("L", "bf16", "captured", 320.0), row("L", "fp16", "captured", 260.0),
        row("XL", "fp32", "captured", 10.0, mem=100.0), row("XL", "bf16", "captured", 60.0, mem=60.0, x_off_limit=1.5),
        row("XL", "fp16", "captured", 55.0, mem=70.0),
    ]  # fmt: skip
    for size in ("S", "M", "L", "XL"):  # as the run does: per size
        runner._relative_to_fp32([r for r in rows if r["size"] == size])
    checks = {c["check"]: (c["value"], c["passed"]) for c in runner.summarize(
        {"header": {"device": "cuda:0"}, "rows": rows})["checks"]}  # fmt: skip
    assert checks["bf16 speed-up at L vs strict fp32 (captured)"] == (pytest.approx(3.2), True)  # not eager's 4x
    assert checks["fp16 speed-up at L vs strict fp32 (captured)"] == (pytest.approx(2.6), True)
    assert checks["bf16 speed-up at XL vs strict fp32 (captured)"] == (pytest.approx(6.0), True)
    assert checks["captured fp32 vs eager fp32 at S"] == (pytest.approx(3.5), True)
    assert checks["captured fp32 vs eager fp32 at M"] == (pytest.approx(2.5), False)
    assert checks["bf16 at XL off its arithmetic limit (captured)"] == (1.5, True)
    assert checks["bf16 peak memory at XL vs fp32 (captured)"] == (pytest.approx(0.6), True)
    assert checks["fp16 peak memory at XL vs fp32 (captured)"] == (pytest.approx(0.7), False)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sizes", "S,XXL"], "unknown size(s) XXL"),
        (["--precisions", "fp8"], "unknown precision(s) fp8"),
        (["--repeats", "0"], "repeats=0"),
        (["--threads", "0"], "threads=0"),
        (["--clock", "cpu", "--threads", "2"], "add --threads 1"),
        (["--clock", "sundial", "--threads", "1"], "clock='sundial'"),
        (
            ["--device", "cuda:0"] if not torch.cuda.is_available() else ["--device", "nonsense"],
            "--device" if not torch.cuda.is_available() else "device",
        ),
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
    assert [(p, m) for _, p, m in cells] == [("fp32", "eager"), ("bf16", "eager"), ("fp16", "eager")]
    assert skipped[0]["precision"] == "tf32"


def test_the_modes_are_the_window_eager_and_on_cuda_captured(monkeypatch):
    cuda = torch.device("cuda")
    monkeypatch.setattr(capability, "cuda_supports_tf32", lambda d: True)
    monkeypatch.setattr(capability, "cuda_supports_bf16", lambda d: True)
    cells, _ = runner.plan(BenchOptions(sizes=[SIZES["S"]], precisions=["fp32", "bf16"]), cuda)
    assert [(p, m) for _, p, m in cells] == [
        ("fp32", "eager"),
        ("fp32", "captured"),
        ("bf16", "eager"),
        ("bf16", "captured"),
    ]
    cells, skipped = runner.plan(BenchOptions(sizes=[SIZES["S"]], precisions=["fp32"], modes="captured"), CPU)
    assert cells == [] and "need a CUDA device" in skipped[0]["reason"] and skipped[0]["mode"] == "captured"
    with pytest.raises(ValueError, match="--modes: unknown mode"):
        BenchOptions(modes="graphed")


def test_a_cell_times_the_trainers_training_windows():
    task = make_task(SIZES["S"], 0, CPU, n_train_batches=2)
    cell = harness.build_cell(SIZES["S"], "bf16", task, BenchOptions(), CPU, CellFlags(), get_logger("test"))
    assert cell.trainer.window_blocker() is None and cell.trainer.config.capture is False
    stepped = cell.ours_steps(40)
    assert len(stepped) == 40 and all(stepped) and cell.trainer.training_steps == 40
    assert cell.mode == "eager" and not cell.graphed


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
    result = runner.run_benchmark(
        BenchOptions(sizes=[SIZES["S"]], precisions=["fp32"], quick=True, repeats=1, chunk_s=0.01)
    )
    assert result["rows"] == [] and "out of memory (simulated)" in result["failed"][0]["reason"]


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
        [
            sys.executable,
            str(REPO / "scripts" / "benchmark_fp16_training.py"),
            "--quick",
            "--precisions",
            "fp32,bf16",
            "--repeats",
            "1",
            "--chunk-s",
            "0.01",
            "--threads",
            "1",
            "--out-dir",
            str(out),
        ],
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
        [sys.executable, str(REPO / "scripts" / "benchmark_fp16_training.py"), "--sizes", "XXL", "--out-dir", str(out)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert bad.returncode == 2 and "unknown size(s) XXL" in bad.stderr


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
    assert PRECISIONS == tuple(m.value for m in MODES if MODES[m].keeps_fp32_weights)
    assert PRECISIONS == ("fp32", "tf32", "bf16", "fp16") and set(PRECISIONS) <= {m.value for m in PrecisionMode}
    config = trainer_config("tf32", CPU)
    assert config.precision == "tf32" and config.on_unsupported == "error"


def test_raw_loop_runs_tf32_forward_and_backward_through_the_plugin():
    """The tf32 row's raw loop gets TF32 switches from the plugin for both passes,
    as the trainer does (the switches are CUDA's; recorded here on any machine)."""
    model = torch.nn.Linear(3, 1)
    raw = RawLoop(model, torch.optim.SGD(model.parameters(), lr=0.1), trainer_config("fp32", CPU), TF32(CPU))
    RecordMatmulPrecision.seen = []
    loss_fn = lambda m, b: RecordMatmulPrecision.apply(m(b)).float().sum()  # noqa: E731
    assert raw.step(torch.ones(2, 3), loss_fn) is True
    assert RecordMatmulPrecision.seen == [("forward", "tf32"), ("backward", "tf32")]
    assert torch.backends.cuda.matmul.fp32_precision != "tf32"


def test_cpu_clock_counts_this_threads_time_only():
    """Sleeping costs wall time but no CPU time: the cpu clock is blind to waiting
    (and so to other processes' load), the wall clock is not."""
    from genesis_fp16_tools.bench.measure import time_chunk

    def nap(i):
        time.sleep(0.02)

    assert time_chunk(nap, 3, CPU, "wall") >= 0.05
    assert time_chunk(nap, 3, CPU, "cpu") < 0.03
    with pytest.raises(ValueError, match="use --clock wall"):
        options.check_clock("cpu", torch.device("cuda"))


def test_cpu_clock_run_is_stamped(tmp_path):
    result = CliRunner().invoke(
        _app(), ["bench", "--quick", "--threads", "1", "--clock", "cpu", "--json", str(tmp_path / "r.json")]
    )
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
    from genesis_fp16_tools.bench.cli import SMOKE_NOTE, check_lines

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
    header = {
        "quick": options.quick,
        "load_avg_start": [0.0, 0.0, 0.0],
        "load_avg_end": [0.0, 0.0, 0.0],
        "cpu_count": 2,
    }
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


# -- sizes, FLOPs and the arithmetic limit (issue 45) ----------------------------------


def test_flops_per_step_of_a_tiny_mlp_is_the_hand_count():
    spec = models.SizeSpec("T", "mlp", hidden=4, batch=2, quality_steps=1)
    # layers 32->4, 4->4, 4->4, 4->25: sum(in x out) = 128 + 16 + 16 + 100 = 260
    forward = 2 * 2 * 260
    assert limits.forward_flops(spec) == forward == 1040
    # backward: every weight gradient (= forward) and every input gradient but the data's (2 x 2 x 32 x 4)
    assert limits.flops_per_step(spec) == 3 * forward - 2 * 2 * 32 * 4 == 2608
    # the layers are the model's, and torch's own counter agrees on the step
    from torch.utils.flop_counter import FlopCounterMode

    model = models.WorldModelMLP(spec.hidden)
    assert [(m, k, n) for m, k, n, _ in limits.matmuls(spec)] == [
        (2, lin.in_features, lin.out_features) for lin in model.modules() if isinstance(lin, torch.nn.Linear)
    ]
    with FlopCounterMode(display=False) as counter:
        model(torch.randn(2, 32)).sum().backward()
    assert counter.get_total_flops() == 2608


def test_flops_per_step_of_the_lstm_and_the_sizes():
    spec = models.SizeSpec("T", "lstm", hidden=5, batch=2, quality_steps=1, seq_len=4, features=3)
    # gates per step: (b*T) x 3 @ 3 x 20 and (b*T) x 5 @ 5 x 20; the head 2 x 5 @ 5 x 1
    forward = 2 * 8 * 3 * 20 + 2 * 8 * 5 * 20 + 2 * 2 * 5
    assert limits.forward_flops(spec) == forward == 2580
    assert limits.flops_per_step(spec) == 3 * forward - 2 * 8 * 3 * 20 == 6780
    lstm = models.OutcomeLSTM(spec.features, spec.hidden).lstm
    assert lstm.weight_ih_l0.shape == (4 * 5, 3) and lstm.weight_hh_l0.shape == (4 * 5, 5)
    flops = {name: limits.flops_per_step(spec) for name, spec in SIZES.items()}
    assert flops["S"] < flops["M"] < flops["L"] < flops["XL"]
    assert flops["XL"] == 2 * 4096 * (3 * (32 * 4096 + 2 * 4096**2 + 4096 * 25) - 32 * 4096)  # about 0.83 TFLOP


def test_xl_is_selectable_by_name_and_a_cuda_default_only():
    assert [s.name for s in models.parse_sizes("s,xl")] == ["S", "XL"]
    xl = SIZES["XL"]
    assert (xl.kind, xl.hidden, xl.batch) == ("mlp", 4096, 4096)
    assert "XL" not in [s.name for s in models.default_sizes("cpu")]
    assert [s.name for s in models.default_sizes("cuda")] == ["S", "M", "L", "XL", "LSTM"]
    assert [s.name for s in BenchOptions().sizes] == ["S", "M", "L", "LSTM"]
    assert BenchOptions(quick=True).quality_steps(xl) == models.QUICK_STEPS["XL"]


def _sizes_the_cli_asks_for(monkeypatch, args, device):
    """The sizes ``bench ARGS`` hands to the run on ``device`` (the run is faked: nothing is measured)."""
    seen = {}

    def fake(options, update):
        seen["sizes"] = [s.name for s in options.sizes]
        return _passing_run(options, update)

    monkeypatch.setattr(runner, "run_benchmark", fake)
    monkeypatch.setattr(options, "pick_device", lambda requested: torch.device(device))
    monkeypatch.setattr(options, "check_clock", lambda clock, device: None)
    result = CliRunner().invoke(_app(), ["bench", "--precisions", "fp32", *args])
    assert result.exit_code == 0, result.output
    return seen["sizes"], result.output


def test_the_cli_runs_xl_when_asked_and_by_default_on_cuda_only(monkeypatch):
    sizes, output = _sizes_the_cli_asks_for(monkeypatch, ["--sizes", "xl,S"], "cpu")
    assert sizes == ["XL", "S"] and "size XL is compute-bound" in output
    sizes, output = _sizes_the_cli_asks_for(monkeypatch, [], "cpu")
    assert sizes == ["S", "M", "L", "LSTM"] and "compute-bound" not in output
    sizes, output = _sizes_the_cli_asks_for(monkeypatch, [], "cuda")
    assert sizes == ["S", "M", "L", "XL", "LSTM"] and "compute-bound" not in output
    assert _sizes_the_cli_asks_for(monkeypatch, ["--quick"], "cuda")[0] == ["S"]


def _passing_run(options, update):
    result = _fake_run(options, update)
    for check in result["summary"]["checks"]:
        check["passed"] = True
    return result


@pytest.mark.parametrize(
    "name, precision, tflops, label",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.5, "H100 SXM5"),
        ("NVIDIA H100 80GB HBM3", "fp32", 67.0, "H100 SXM5"),
        ("NVIDIA H100 PCIe", "fp16", 756.5, "H100 PCIe"),
        ("NVIDIA H100 NVL", "tf32", 417.5, "H100 NVL"),
        ("NVIDIA H200", "tf32", 494.5, "H200 SXM"),
        ("NVIDIA H200 NVL", "bf16", 835.5, "H200 NVL"),
        ("NVIDIA A100-SXM4-80GB", "tf32", 156.0, "A100"),
        ("NVIDIA A100 80GB PCIe", "fp32", 19.5, "A100"),
        ("NVIDIA L4", "bf16", 121.0, "L4"),
        ("NVIDIA L40S", "bf16", 362.05, "L40S"),
        ("NVIDIA A10", "fp16", 125.0, "A10"),
    ],
)
def test_the_limit_of_a_known_gpu_comes_from_its_datasheet(monkeypatch, name, precision, tflops, label):
    monkeypatch.setattr(limits, "device_name", lambda device: name)  # never this machine's hardware

    def no_measuring(*args, **kwargs):
        raise AssertionError("a known device is looked up, not measured")

    monkeypatch.setattr(limits, "measure_peak", no_measuring)
    peak = limits.PeakTable(torch.device("cuda")).peak(precision)
    assert peak.flops_per_s == pytest.approx(tflops * 1e12)
    assert peak.source.startswith(f"datasheet: NVIDIA {label},")


def test_an_unknown_gpu_or_a_mig_slice_is_measured_once_per_run(monkeypatch):
    assert limits.datasheet_peak("NVIDIA GeForce RTX 4090", "bf16") is None
    assert limits.datasheet_peak("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "bf16") is None
    assert limits.datasheet_peak("NVIDIA GH200 480GB", "bf16") is None  # not H200
    calls = []

    def stub(precision, device, budget_s):
        calls.append(precision)
        return limits.Peak(1e12, "measured: stub")

    monkeypatch.setattr(limits, "device_name", lambda device: "NVIDIA A100-SXM4-40GB MIG 1g.5gb")
    monkeypatch.setattr(limits, "measure_peak", stub)
    table = limits.PeakTable(torch.device("cuda"))
    assert table.peak("bf16") == table.peak("bf16") == limits.Peak(1e12, "measured: stub")
    assert calls == ["bf16"] and table.as_dict() == {"bf16": {"peak_tflops": 1.0, "source": "measured: stub"}}
    assert table.known("fp16") is None


def _ticking(step):
    """A timer that moves ``step`` seconds per call: the measurement becomes arithmetic."""
    now = [0.0]

    def timer():
        now[0] += step
        return now[0]

    return timer


def test_the_matmul_fallback_is_deterministic_under_a_patched_timer():
    # every timed product "takes" 1 ms: both sizes are tried, the larger is the best rate
    peak = limits.measure_peak("fp32", CPU, budget_s=0.3, sizes=(4, 8), timer=_ticking(0.001))
    assert peak.flops_per_s == pytest.approx(2 * 8**3 / 0.001)
    assert peak.source == "measured: 8x8 float32 matmul, fastest of repeats, 1.02e-06 TFLOP/s"
    # a slow dtype: one product takes over a sixteenth of the budget, so the sizes stop growing
    slow = limits.measure_peak("bf16", CPU, budget_s=0.3, sizes=(4, 8), timer=_ticking(0.05))
    assert slow.flops_per_s == pytest.approx(2 * 4**3 / 0.05) and "4x4 bfloat16" in slow.source
    # real clock, tiny sizes: a positive rate, quickly
    assert limits.measure_peak("fp16", CPU, budget_s=0.02, sizes=(8, 16)).flops_per_s > 0


def test_limit_columns_are_step_time_over_flops_at_peak():
    spec = SIZES["S"]
    flops = limits.flops_per_step(spec)
    cols = limits.limit_columns(spec, 2.0, limits.Peak(1e12, "datasheet: test"))
    assert cols["limit_ms_per_step"] == pytest.approx(1000 * flops / 1e12)
    assert cols["x_off_limit"] == pytest.approx(2.0 / cols["limit_ms_per_step"])
    assert cols["achieved_tflops"] == pytest.approx(flops / 0.002 / 1e12) and cols["peak_tflops"] == 1.0
    unknown = limits.limit_columns(spec, 2.0, None)
    assert unknown["flops_per_step"] == flops and unknown["x_off_limit"] is None and unknown["peak_source"] is None


def _limit_result():
    """A result as run_benchmark returns it: two MLP sizes and the LSTM, fp32 and bf16."""
    rows = []
    for size, ms in (
        ("S", {"fp32": 1.0, "bf16": 1.4}),
        ("L", {"fp32": 60.0, "bf16": 26.0}),
        ("LSTM", {"fp32": 3.0, "bf16": 2.5}),
    ):
        spec = SIZES[size]
        for precision, step_ms in ms.items():
            rows.append({
                "size": size, "model": spec.label, "precision": precision, "mode": "eager", "precision_run": precision,
                "samples_per_s": spec.batch / step_ms * 1000, "raw_samples_per_s": spec.batch / step_ms * 1000,
                "ms_per_step": step_ms,
                **limits.limit_columns(
                    spec, step_ms, limits.Peak(1e11 if precision == "fp32" else 4e11, f"measured: {precision}")),
                "speedup_vs_fp32": ms["fp32"] / step_ms, "overhead_vs_raw": 1.01 if size == "S" else 0.99,
                "overhead_min": 0.95, "overhead_max": 1.05, "peak_mem_mb": 1.0, "peak_mem_vs_fp32": 1.0,
                "val_loss": 0.1, "val_loss_delta_vs_fp32": 0.0,
                "overflow_rate": 0.0, "skipped_steps": 0, "quality_steps": 10, "steps_per_chunk": 3, "repeats": 3,
                "compiled": False, "cuda_graphs": False, "notes": "",
            })  # fmt: skip
    header = {
        "device": "cpu", "device_name": "test cpu", "cpu_flags": ["avx2"], "torch_version": torch.__version__,
        "date": "2026-01-01T00:00:00Z", "command": "genesis-fp16 bench", "load_avg_start": [0.1, 0, 0],
        "load_avg_end": [0.2, 0, 0], "limits": {},
    }  # fmt: skip
    result = {
        "header": header,
        "rows": rows,
        "auto": [],
        "not_applicable": [{"size": "S", "precision": "tf32", "reason": "CUDA only"}],
        "failed": [],
    }
    result["summary"] = runner.summarize(result)
    return result


def test_the_new_columns_are_in_the_csv_json_and_table(tmp_path):
    result = _limit_result()
    new = (
        "mode",
        "flops_per_step",
        "achieved_tflops",
        "peak_tflops",
        "limit_ms_per_step",
        "x_off_limit",
        "peak_source",
    )
    assert set(new) <= set(report.CSV_COLUMNS)
    with open(report.write_csv(tmp_path / "r.csv", result), newline="") as fh:
        lines = list(csv.DictReader(fh))
    assert set(new) <= set(lines[0])
    s_bf16 = next(r for r in lines if r["size"] == "S" and r["precision"] == "bf16")
    assert s_bf16["mode"] == "eager" and int(s_bf16["flops_per_step"]) == limits.flops_per_step(SIZES["S"])
    assert float(s_bf16["x_off_limit"]) == pytest.approx(
        1.4 / (1000 * limits.flops_per_step(SIZES["S"]) / 4e11), rel=1e-5
    )
    data = json.loads(report.write_json(tmp_path / "r.json", result).read_text())
    assert all(set(new) <= set(row) for row in data["rows"])
    by = data["summary"]["overhead_vs_raw_by_precision"]
    assert by["fp32"] == {
        "pooled": 0.99,  # the median of every size's repeats (these rows carry their medians alone)
        "max": 1.01,
        "worst_size": "S",
        "by_size": {"S": 1.01, "L": 0.99, "LSTM": 0.99},
    }
    table = report.markdown_table(result)
    assert "| mode | samples/s |" in table and "| ms/step | limit ms | x off limit |" in table
    assert (
        "| S | MLP h64 b64 | bf16 | eager | " in table
        and "| fp32 | 0.990 | 1.010 (S) | S 1.010, L 0.990, LSTM 0.990 |" in table
    )
    assert "| S | | tf32 | | not applicable |" in table


def test_speedups_compare_rows_of_one_mode():
    """A captured row (the trainer's CUDA-graph capture, to come) is compared
    with captured fp32, never with eager fp32."""
    rows = [
        {
            "size": "L",
            "precision": p,
            "mode": m,
            "samples_per_s": v,
            "val_loss": 0.5,
            "peak_mem_mb": 1.0,
            "overhead_vs_raw": 1.0,
        }
        for p, m, v in (
            ("fp32", "eager", 100.0),
            ("bf16", "eager", 150.0),
            ("fp32", "captured", 200.0),
            ("bf16", "captured", 500.0),
        )
    ]
    runner._relative_to_fp32(rows)
    assert [r["speedup_vs_fp32"] for r in rows] == pytest.approx([1.0, 1.5, 1.0, 2.5])
    summary = runner.summarize({"header": {"device": "cpu"}, "rows": rows})
    assert summary["speedup_vs_fp32"] == pytest.approx(
        {"L/fp32": 1.0, "L/bf16": 1.5, "L/fp32/captured": 1.0, "L/bf16/captured": 2.5}
    )
    assert set(summary["overhead_vs_raw_by_precision"]) == {"fp32", "bf16", "fp32/captured", "bf16/captured"}


def test_the_plot_has_the_crossover(tmp_path):
    pytest.importorskip("matplotlib", reason="the plots extra (pip install -e '.[plots]') is not installed")
    path = report.write_plot(tmp_path / "p.png", _limit_result())
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_a_plot_without_matplotlib_is_one_line_naming_the_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    with pytest.raises(MissingExtraError) as info:
        report.write_plot(tmp_path / "p.png", _limit_result())
    message = str(info.value)
    assert "pip install -e '.[plots]'" in message and "\n" not in message
    assert not (tmp_path / "p.png").exists()

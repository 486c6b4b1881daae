"""The PPO sweep (tiny budgets), its resumption and failure handling, and analyze."""

from __future__ import annotations

import json
import os

import pytest

from genesis_fp16_tools.forensics.analyze import analyze
from genesis_fp16_tools.forensics.configs import CONFIGS, parse_configs
from genesis_fp16_tools.forensics.pretrain import PretrainSpec, build_assets
from genesis_fp16_tools.forensics.sweep import SweepArgs, run_one, sweep

TINY = PretrainSpec(steps=20, finetune_steps=4, reward_samples=64)
ARGS = SweepArgs(max_steps=2, batch=4, gen_len=8)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def assets():
    return build_assets(TINY)


def test_run_one_records_steps_and_uses_the_scaler_for_fp16(assets):
    result = run_one(assets, CONFIGS["fp16_pure"], seed=0, args=ARGS)
    assert result["status"] == "completed" and result["failure"] is None
    assert len(result["steps"]) == 2
    step = result["steps"][0]
    assert step["kl_fp64"] > 0 and step["kl_abs_err"] < 1e-2
    assert step["policy_scale"] == 65536.0  # FP16 runs through the gradient scaler
    # FP16 spacing at values of magnitude 128-1024 (rewards ~0.5 x return_scale 1000)
    assert step["value_quant_step_median"] in (0.125, 0.25, 0.5)
    fp32 = run_one(assets, CONFIGS["fp32_baseline"], seed=0, args=ARGS)
    assert fp32["steps"][0]["policy_scale"] == 1.0
    assert fp32["summary"]["kl_abs_err_mean"] < 1e-6
    assert fp32["summary"]["value_stagnation_rate_mean"] == 0.0
    assert fp32["steps"][0]["value_quant_step_median"] < 1e-3


def test_failure_ends_the_run_cleanly_with_the_reason(assets):
    args = SweepArgs(max_steps=3, batch=4, gen_len=8, return_scale=3e4)
    result = run_one(assets, CONFIGS["fp16_pure"], seed=0, args=args)
    assert result["status"] == "failed"
    assert result["failure"]["kind"] == "value_overflow_danger" and result["failure"]["step"] == 0
    assert result["summary"]["steps_done"] == 1


def test_sweep_resumes_after_a_kill(assets, tmp_path):
    cfgs = parse_configs("fp32_baseline,bf16_pure")
    seen = []

    def killer(name, status):
        seen.append((name, status))
        if len(seen) == 1:
            raise KeyboardInterrupt  # killed after the first run was written

    with pytest.raises(KeyboardInterrupt):
        sweep(assets, cfgs, [0, 1], tmp_path, ARGS, on_run=killer)
    files = sorted(p.name for p in (tmp_path / "runs").glob("*.json"))
    assert files == ["fp32_baseline__seed0.json"]
    mtime = os.stat(tmp_path / "runs" / files[0]).st_mtime_ns
    statuses = []
    results = sweep(assets, cfgs, [0, 1], tmp_path, ARGS, on_run=lambda n, s: statuses.append((n, s)))
    assert statuses[0] == ("fp32_baseline__seed0", "skipped (done)")
    assert [s for _, s in statuses[1:]] == ["completed"] * 3
    assert os.stat(tmp_path / "runs" / files[0]).st_mtime_ns == mtime
    assert len(results) == 4
    assert not list((tmp_path / "runs").glob(".*.tmp"))  # atomic writes leave no temp files

    summary = analyze(tmp_path)
    assert (tmp_path / "sweep.png").stat().st_size > 1000
    report = (tmp_path / "report.md").read_text()
    assert "fp32_baseline" in report and "bf16_pure" in report
    table = {r["config"]: r for r in summary["sweep_table"]}
    assert table["bf16_pure"]["seeds"] == 2
    assert table["bf16_pure"]["value_quant_step_median"] > table["fp32_baseline"]["value_quant_step_median"]


def test_resuming_with_other_arguments_is_refused(assets, tmp_path):
    sweep(assets, [CONFIGS["fp32_baseline"]], [0], tmp_path, ARGS)
    with pytest.raises(ValueError, match="other arguments"):
        sweep(assets, [CONFIGS["fp32_baseline"]], [0], tmp_path, SweepArgs(max_steps=3, batch=4, gen_len=8))


def test_analyze_errors(tmp_path):
    with pytest.raises(ValueError, match="no such results directory"):
        analyze(tmp_path / "missing")
    with pytest.raises(ValueError, match="found no"):
        analyze(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "x.json").write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        analyze(tmp_path)


def test_analyze_includes_probe_json(assets, tmp_path):
    from genesis_fp16_tools.forensics.probe import probe

    rows = probe(assets, parse_configs("fp32_baseline,bf16_pure"), num_prompts=3, seq_lengths=(16, 24))
    (tmp_path / "probe.json").write_text(json.dumps({"meta": {"command": "test"}, "rows": rows}))
    out = analyze(tmp_path)
    assert any(p.endswith("probe.png") for p in out["plots"])
    report = (tmp_path / "report.md").read_text()
    assert "Static probe" in report and "slope of accum_err_final" in report
    assert "| accum_err_final | accum_err_rounding_floor |" in report  # the drift beside its floor


def test_length_slopes_recover_a_known_power():
    from genesis_fp16_tools.forensics.analyze import length_slopes

    rows = [
        {
            "config": "c",
            "seq_len": L,
            "accum_err_final": 0.01 * (L - 8) ** 0.5,
            "policy_accum_err_final": 0.02 * (L - 8),
        }
        for L in (16, 32, 64)
    ]
    (row,) = length_slopes(rows)
    assert row["accum_err_slope_across_lengths"] == pytest.approx(0.5)
    assert row["policy_accum_err_slope_across_lengths"] == pytest.approx(1.0)


def test_component_dtypes_speak_the_precision_vocabulary():
    from genesis_fp16_tools.forensics.configs import CONFIGS, DTYPES, ComponentPrecisions
    from genesis_fp16.precision.modes import MODES
    from genesis_fp16.base.settings import PrecisionMode

    for name in ("fp32", "bf16", "fp16"):
        assert DTYPES[name] == MODES[PrecisionMode(name)].compute_dtype
    for cfg in CONFIGS.values():  # what a sweep trains with is a mode the trainer accepts
        for part in ("policy", "value"):
            PrecisionMode(getattr(cfg, part))
    with pytest.raises(ValueError, match="unknown dtype.*'kl': 'fp8'.*expected one of fp64, fp32, bf16, fp16"):
        ComponentPrecisions(name="x", policy="bf16", reference="bf16", reward="bf16", value="bf16", kl="fp8")


def test_value_lr_sweep_runs_each_lr_and_plots_stagnation_against_it(assets, tmp_path):
    cfgs = parse_configs("fp32_baseline,bf16_pure")
    results = sweep(assets, cfgs, [0], tmp_path, ARGS, value_lrs=[1e-6, 1e-2])
    assert sorted(p.name for p in (tmp_path / "runs").glob("*.json")) == [
        "bf16_pure__vlr0.01__seed0.json",
        "bf16_pure__vlr1e-06__seed0.json",
        "fp32_baseline__vlr0.01__seed0.json",
        "fp32_baseline__vlr1e-06__seed0.json",
    ]
    stag = {(r["config"], r["args"]["value_lr"]): r["summary"]["value_stagnation_rate_mean"] for r in results}
    assert len(stag) == 4
    # an update below half a BF16 spacing of the values leaves them unchanged: more so at a small lr
    assert stag["bf16_pure", 1e-6] > stag["bf16_pure", 1e-2]
    assert stag["bf16_pure", 1e-6] > stag["fp32_baseline", 1e-6]
    summary = analyze(tmp_path)
    assert (tmp_path / "h3_value_lr.png").stat().st_size > 1000
    rows = {(r["config"], r["value_lr"]): r for r in summary["sweep_table"]}
    assert set(rows) == set(stag)  # one row per configuration and value lr
    report = (tmp_path / "report.md").read_text()
    assert "![H3 stagnation against value lr](h3_value_lr.png)" in report
    assert "| value_stagnation_rate_mean | value_steps_skipped |" in report
    # resuming with other learning rates is refused
    with pytest.raises(ValueError, match="other arguments"):
        sweep(assets, cfgs, [0], tmp_path, ARGS, value_lrs=[1e-4])


def test_stagnation_leaves_out_value_steps_the_scaler_skipped():
    from genesis_fp16_tools.forensics.analyze import sweep_table

    # a skipped (overflowed) FP16 step leaves every value unchanged: that is
    # the scaler's skip, not rounding, and is counted apart
    steps = [
        {"step": 0, "value_stagnation_rate": 0.1, "value_step_ok": True},
        {"step": 1, "value_stagnation_rate": 1.0, "value_step_ok": False},
        {"step": 2, "value_stagnation_rate": 0.3, "value_step_ok": True},
    ]
    summary = {
        "true_reward_first": 0.5,
        "true_reward_last": 0.6,
        "kl_fp64_last": 0.1,
        "kl_abs_err_mean": 0.0,
        "value_quant_step_median": 0.5,
        "value_stagnation_rate_mean": 0.4667,
        "policy_overflow_steps": 0,
        "value_overflow_steps": 1,
    }
    run = {
        "config": "fp16_pure",
        "args": {"value_lr": 1e-4},
        "status": "completed",
        "failure": None,
        "summary": summary,
        "steps": steps,
    }
    row = sweep_table([run])[0]
    assert row["value_stagnation_rate_mean"] == pytest.approx(0.2)
    assert row["value_steps_skipped"] == 1


def test_run_summary_stagnation_is_over_applied_value_steps(assets, monkeypatch):
    from genesis_fp16.training.trainer import FP16Trainer

    real = FP16Trainer.backward_and_step

    def skip_value_steps(self, loss):
        ok = real(self, loss)
        return ok and not self.name.startswith("forensics.value")  # as if every value step overflowed

    monkeypatch.setattr(FP16Trainer, "backward_and_step", skip_value_steps)
    result = run_one(assets, CONFIGS["fp32_baseline"], seed=0, args=ARGS)
    assert all(s["value_step_ok"] is False for s in result["steps"])
    assert result["summary"]["value_steps_skipped"] == 2
    assert (
        result["summary"]["value_stagnation_rate_mean"] != result["summary"]["value_stagnation_rate_mean"]
    )  # NaN: no applied step

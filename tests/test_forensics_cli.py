"""The `genesis-fp16 forensics` commands, end to end on a tiny cached model."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from genesis_fp16.cli import app
from genesis_fp16_tools.forensics.pretrain import PretrainSpec, assets_path, build_assets, save_assets

runner = CliRunner()


@pytest.fixture
def cached(state_dir):
    # the commands load the default checkpoint; for test speed a tiny model
    # (20 steps) is placed where that checkpoint is cached
    save_assets(build_assets(PretrainSpec(steps=20, finetune_steps=4, reward_samples=64)), assets_path(state_dir))
    yield state_dir


def test_probe_command_json(cached, tmp_path):
    out = tmp_path / "probe.json"
    res = runner.invoke(
        app,
        [
            "forensics",
            "probe",
            "--configs",
            "bf16_pure,bf16_fp32_kl,fp32_baseline,fp16_pure",
            "--num-prompts",
            "4",
            "--seq-lengths",
            "16",
            "24",
            "--json",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert [(r["config"], r["seq_len"]) for r in rows][:4] == [
        ("bf16_pure", 16),
        ("bf16_fp32_kl", 16),
        ("fp32_baseline", 16),
        ("fp16_pure", 16),
    ]
    assert len(rows) == 8
    for key in (
        "config",
        "seq_len",
        "kl_fp64",
        "kl_penalty_mean",
        "kl_abs_err",
        "log_ratio_near_zero_frac",
        "accum_err_final",
        "accum_err_rounding_floor",
        "policy_accum_err_rounding_floor",
        "reward_resolution_median",
        "reward_tie_rate",
        "reward_kendall_tau",
        "value_quant_step_median",
        "value_stagnation_rate",
    ):
        assert all(key in r for r in rows), key
    assert data["meta"]["torch_version"] == str(torch.__version__)


def test_bad_input_is_one_clear_error(cached):
    res = runner.invoke(app, ["forensics", "probe", "--configs", "bf16_nope"])
    assert res.exit_code != 0
    assert "unknown configuration" in res.output and "fp32_baseline" in res.output
    res = runner.invoke(app, ["forensics", "probe", "--configs", "fp32_baseline", "--seq-lengths", "16", "x"])
    assert res.exit_code != 0 and "integers" in res.output
    res = runner.invoke(app, ["forensics", "analyze", "/nonexistent/dir"])
    assert res.exit_code != 0 and "no such results directory" in res.output


def test_freeze_replay_sweep_analyze(cached, tmp_path):
    traj = tmp_path / "traj.pt"
    assert (
        runner.invoke(
            app, ["forensics", "freeze", "--out", str(traj), "--num-prompts", "3", "--seq-len", "16"]
        ).exit_code
        == 0
    )
    results = tmp_path / "results"
    res = runner.invoke(
        app,
        [
            "forensics",
            "replay",
            "--trajectories",
            str(traj),
            "--configs",
            "fp32_baseline,bf16_pure",
            "--json",
            str(results / "replay.json"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert len(json.loads((results / "replay.json").read_text())["rows"]) == 2
    res = runner.invoke(
        app,
        [
            "forensics",
            "sweep",
            "--out",
            str(results),
            "--configs",
            "fp32_baseline",
            "--seeds",
            "1",
            "--quick",
            "--max-steps",
            "1",
            "--json",
            str(tmp_path / "s.json"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "s.json").read_text())["runs"] == 1
    res = runner.invoke(app, ["forensics", "analyze", str(results)])
    assert res.exit_code == 0, res.output
    assert (results / "report.md").exists() and (results / "replay_mismatch.png").exists()
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"junk")
    res = runner.invoke(app, ["forensics", "replay", "--trajectories", str(bad)])
    assert res.exit_code != 0 and "bad.pt" in res.output


def _error_line(result) -> str:
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    return errors[0]


@pytest.mark.parametrize(
    "args, expected",
    [
        (["pretrain", "--steps", "-10"], "--steps -10"),
        (["pretrain", "--steps", "0"], "--steps 0"),
        (["probe", "--return-scale", "nan"], "--return-scale nan"),
        (["probe", "--return-scale", "inf"], "--return-scale inf"),
        (["probe", "--return-scale", "0"], "--return-scale 0"),
        (["replay", "--trajectories", "t.pt", "--return-scale", "-5"], "--return-scale -5"),
    ],
)
def test_bad_numbers_are_refused_before_any_work(state_dir, monkeypatch, args, expected):
    from genesis_fp16_tools.forensics import pretrain

    monkeypatch.setattr(pretrain, "build_assets", lambda *a, **k: pytest.fail("pretraining started"))
    monkeypatch.setattr(pretrain, "load_assets", lambda *a, **k: pytest.fail("assets were loaded"))
    result = runner.invoke(app, ["forensics", *args])
    assert result.exit_code == 2, result.output
    assert expected in _error_line(result)


def test_freeze_longer_than_the_model_is_one_clear_error(cached, tmp_path):
    result = runner.invoke(
        app, ["forensics", "freeze", "--out", str(tmp_path / "t.pt"), "--num-prompts", "2", "--seq-len", "600"]
    )
    assert result.exit_code == 2, result.output
    line = _error_line(result)
    assert "600" in line and "512" in line


@pytest.mark.parametrize("junk", [b"not a checkpoint at all", b""])
def test_corrupt_cached_asset_says_rerun_with_force(cached, monkeypatch, junk):
    from genesis_fp16_tools.forensics import pretrain

    assets_path(cached).write_bytes(junk)
    result = runner.invoke(app, ["forensics", "pretrain"])
    assert result.exit_code == 2, result.output
    line = _error_line(result)
    assert str(assets_path(cached)) in line and "--force" in line
    result = runner.invoke(app, ["forensics", "probe", "--configs", "fp32_baseline"])
    assert result.exit_code == 2, result.output
    assert "genesis-fp16 forensics pretrain --force" in _error_line(result)
    # --force rebuilds without reading the corrupt file
    tiny = pretrain.build_assets
    monkeypatch.setattr(
        pretrain,
        "build_assets",
        lambda spec, cfg=None, progress=None: tiny(PretrainSpec(steps=2, finetune_steps=1, reward_samples=32)),
    )
    result = runner.invoke(app, ["forensics", "pretrain", "--force"])
    assert result.exit_code == 0, result.output
    assert pretrain.load_assets(assets_path(cached)).meta["spec"]["steps"] == 2


def test_asset_without_the_forensics_models_says_rerun_with_force(cached):
    from genesis_fp16.training.checkpoint import build_payload, save_payload

    save_payload(assets_path(cached), build_payload(model={}))  # a genesis-fp16 checkpoint, but not the assets
    result = runner.invoke(app, ["forensics", "pretrain"])
    assert result.exit_code == 2, result.output
    assert "--force" in _error_line(result)


def test_probe_runs_at_length_512_and_refuses_longer(cached, tmp_path, monkeypatch):
    from genesis_fp16_tools.forensics import data, probe

    # sampling 504 tokens one forward at a time takes seconds; held-out text
    # stands in for the samples so the test exercises scoring at length 512
    def text(model, prompts, total_len, generator, temperature=1.0):
        rest = data.sample_windows("heldout", prompts.shape[0], total_len - prompts.shape[1], generator)
        return torch.cat([prompts, rest], dim=1)

    monkeypatch.setattr(probe, "generate", text)
    out = tmp_path / "p512.json"
    res = runner.invoke(
        app,
        [
            "forensics",
            "probe",
            "--configs",
            "fp32_baseline",
            "--num-prompts",
            "2",
            "--seq-lengths",
            "512",
            "--json",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    rows = json.loads(out.read_text())["rows"]
    assert [(r["config"], r["seq_len"]) for r in rows] == [("fp32_baseline", 512)]
    assert rows[0]["kl_fp64"] == rows[0]["kl_fp64"]  # finite, not NaN
    res = runner.invoke(
        app, ["forensics", "probe", "--configs", "fp32_baseline", "--num-prompts", "2", "--seq-lengths", "513"]
    )
    assert res.exit_code == 2, res.output
    line = _error_line(res)
    assert "513" in line and "512" in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
@pytest.mark.parametrize(
    "command", [["probe"], ["freeze", "--out", "t.pt"], ["replay", "--trajectories", "t.pt"], ["sweep", "--quick"]]
)
def test_device_cuda_without_cuda_is_one_clear_error(cached, tmp_path, command):
    result = runner.invoke(app, ["forensics", *command, "--device", "cuda:0"])
    assert result.exit_code == 2, result.output
    line = _error_line(result)
    assert "--device cuda:0" in line and "CUDA" in line and "--device cpu" in line


def test_device_must_be_cpu_or_cuda(cached):
    result = runner.invoke(app, ["forensics", "probe", "--device", "tpu"])
    assert result.exit_code == 2, result.output
    assert "--device tpu" in _error_line(result) and "cuda[:N]" in _error_line(result)


def test_probe_device_cpu_records_the_device(cached, tmp_path):
    out = tmp_path / "p.json"
    res = runner.invoke(
        app,
        [
            "forensics",
            "probe",
            "--configs",
            "fp32_baseline",
            "--num-prompts",
            "2",
            "--seq-lengths",
            "16",
            "--device",
            "cpu",
            "--json",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["meta"]["device"] == "cpu"


def test_sweep_value_lrs(cached, tmp_path):
    out = tmp_path / "lr"
    res = runner.invoke(
        app,
        [
            "forensics",
            "sweep",
            "--out",
            str(out),
            "--configs",
            "bf16_pure",
            "--seeds",
            "1",
            "--quick",
            "--max-steps",
            "1",
            "--value-lrs",
            "1e-5,1e-3",
            "--json",
            str(tmp_path / "s.json"),
        ],
    )
    assert res.exit_code == 0, res.output
    table = json.loads((tmp_path / "s.json").read_text())["table"]
    assert sorted(r["value_lr"] for r in table) == [1e-5, 1e-3]
    for bad in ("1e-5,x", "0", "1e-4,nan"):
        res = runner.invoke(app, ["forensics", "sweep", "--out", str(out), "--quick", "--value-lrs", bad])
        assert res.exit_code == 2, res.output
        assert "--value-lrs" in _error_line(res)

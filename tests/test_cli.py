import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from genesis_fp16.cli import app

runner = CliRunner()


def test_doctor_json_has_auto_precision():
    result = runner.invoke(app, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["auto_precision"] in {"fp32", "fp16", "bf16"}
    assert data["auto_reason"]
    assert data["torch_version"]
    assert data["devices"][0]["device"] == "cpu"
    assert data["settings"]["precision"] == "auto"


def test_doctor_human_output():
    result = runner.invoke(app, ["doctor"])
    assert result.exit_code == 0
    assert "auto picks" in result.stdout


def test_bad_setting_exits_nonzero_with_one_message():
    proc = subprocess.run(
        [sys.executable, "-m", "genesis_fp16.cli", "doctor", "--json"],
        env={"GENESIS_FP16_PRECISION": "fp8", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "GENESIS_FP16_PRECISION='fp8'" in proc.stderr
    assert "auto, fp16, bf16, fp32" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_trainers_lists_registry():
    result = runner.invoke(app, ["trainers", "--json"])
    assert result.exit_code == 0
    names = {row["name"] for row in json.loads(result.stdout)}
    assert {"fp32", "fp16", "bf16"} <= names


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_gpu_acceptance_script_refuses_without_cuda(tmp_path):
    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu_acceptance.sh"
    proc = subprocess.run(
        ["bash", str(script), str(tmp_path / "out")],
        env=dict(os.environ, PYTHON=sys.executable),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "no CUDA device" in proc.stderr
    assert not any((tmp_path / "out").iterdir())  # nothing half-written


def test_fail_prints_markup_like_text_literally(capsys):
    from genesis_fp16.cli import fail

    exit_ = fail("no such file [/bold] [red]x\x1b[31m")
    assert exit_.exit_code == 2
    err = capsys.readouterr().err
    assert "error: no such file [/bold] [red]x\\x1b[31m" in err
    assert "\x1b" not in err


def test_doctor_shows_a_markup_like_state_dir_literally(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a short relative path fits an 80-column table cell
    monkeypatch.setenv("GENESIS_FP16_STATE_DIR", "[b]s")
    result = runner.invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output
    assert "[b]s" in result.stdout


def test_safe_text_makes_control_characters_visible():
    from genesis_fp16.cli import safe_text

    text = safe_text("a\x1b[31mb\x00c\x9bd\u202ee\tf\ng [i]")
    assert text.plain == "a\\x1b[31mb\\x00c\\x9bd\\u202ee\\tf\\ng [i]"
    assert not text.spans  # never parsed as markup

"""Optional extras: a missing package gives one line naming the extra to install."""

import subprocess
import sys

import pytest

from genesis_fp16.extras import MissingExtraError, require


def test_require_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    with pytest.raises(MissingExtraError) as info:
        require("matplotlib", "the bench plot (--plot)")
    message = str(info.value)
    assert "the bench plot (--plot) needs matplotlib" in message
    assert "pip install 'genesis-fp16[plots]'" in message


def test_require_returns_the_module():
    import json

    assert require("json", "anything") is json


def _cli_without(module: str, args: list[str], cwd) -> subprocess.CompletedProcess:
    code = f"import sys; sys.modules[{module!r}] = None; from genesis_fp16.cli import main; main({args!r})"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_bench_plot_without_matplotlib_stops_before_measuring(tmp_path):
    proc = _cli_without("matplotlib", ["bench", "--sizes", "S", "--plot", str(tmp_path / "p.png")], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "genesis-fp16[plots]" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "bench" not in proc.stdout  # no table: nothing was measured
    assert not (tmp_path / "p.png").exists()


def test_forensics_analyze_without_matplotlib(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "probe.json").write_text('{"rows": [], "meta": {}}')
    proc = _cli_without("matplotlib", ["forensics", "analyze", str(results)], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "genesis-fp16 forensics analyze needs matplotlib" in proc.stderr
    assert "Traceback" not in proc.stderr

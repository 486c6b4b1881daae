"""Optional extras: a missing package gives one line naming the extra to install."""

import subprocess
import sys

import pytest

from genesis_fp16.base.extras import MissingExtraError, require


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


@pytest.mark.parametrize(
    "module, args, extra",
    [
        ("matplotlib", ["evolve", "--budget", "24", "--plot", "p.png"], "plots"),
        ("tensorboard", ["evolve", "--budget", "24", "--tensorboard", "tb"], "tensorboard"),
        ("matplotlib", ["ppo", "--env", "CartPole-v1", "--total-steps", "64", "--plot", "p.png"], "plots"),
        ("tensorboard", ["ppo", "--env", "CartPole-v1", "--total-steps", "64", "--tensorboard", "tb"], "tensorboard"),
    ],
)
def test_plot_and_tensorboard_without_their_extra_stop_before_training(module, args, extra, tmp_path):
    proc = _cli_without(module, args, tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"genesis-fp16[{extra}]" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) in ([], [".genesis_fp16"])  # no plot, no event file, no run


CORE_WITHOUT_EXTRAS = """
import importlib, pkgutil, sys
for blocked in ("gymnasium", "cma", "matplotlib", "yaml"):
    sys.modules[blocked] = None  # an import of it now raises ImportError
import genesis_fp16
names = ["genesis_fp16"] + [m.name for m in pkgutil.walk_packages(genesis_fp16.__path__, "genesis_fp16.")]
for name in names:
    importlib.import_module(name)
print(len(names))
"""


def test_every_core_module_imports_without_the_extras(tmp_path):
    """The plugin package needs torch, pydantic, structlog and typer only."""
    proc = subprocess.run(
        [sys.executable, "-c", CORE_WITHOUT_EXTRAS], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.split()[-1]) > 30  # every module, subpackages included


def test_cli_help_without_the_extras(tmp_path):
    """Every subcommand registers (its entry point loads) with no extra installed."""
    code = (
        "import sys\nfor m in ('gymnasium', 'cma', 'matplotlib', 'yaml'): sys.modules[m] = None\n"
        "from genesis_fp16.cli import main\nmain(['--help'])"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for command in ("evolve", "eval", "ppo", "bench", "forensics", "rollout", "state"):
        assert command in proc.stdout, (command, proc.stdout)

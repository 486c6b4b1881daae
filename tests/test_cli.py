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
    result = runner.invoke(app, ["doctor"], terminal_width=400)
    assert result.exit_code == 0
    assert "nothing measured on this host yet" in result.stdout and "rule (not measured)" in result.stdout


def _table_columns(output: str, title: str) -> list[str]:
    """The cells of the table printed under ``title``, column by column, each column's lines joined without spaces (a
    folded value's pieces, or a wrapped one's words, read back whole)."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == title)
    body = next(i for i in range(start, len(lines)) if lines[i].startswith("┡"))
    end = next(i for i in range(body, len(lines)) if lines[i].startswith("└"))
    cells = [line.split("│")[1:-1] for line in lines[body + 1 : end]]
    return ["".join("".join(row[j].split()) for row in cells) for j in range(len(cells[0]))]


def test_doctor_tables_wrap_values_at_80_columns_instead_of_cutting_them(tmp_path, monkeypatch):
    """Issue 44: at 80 columns doctor's tables cut long values ("…"). Every value is there, folded onto more lines."""
    from genesis_fp16 import cli
    from genesis_fp16.precision.modes import MODES
    from genesis_fp16.base.settings import describe_settings, load_settings

    deep = tmp_path / "a-folder-name-far-too-long-for-one-column-of-a-table-eighty-columns-wide"
    monkeypatch.setenv("GENESIS_FP16_PRECISION_CACHE", str(deep / "precision-cache-with-a-long-name.json"))
    monkeypatch.setenv("GENESIS_FP16_NONFINITE_STREAK_THRESHOLD", "3")
    data = json.loads(runner.invoke(app, ["doctor", "--json"]).stdout)
    monkeypatch.setattr(cli.out, "_width", 80)  # as COLUMNS=80 or an 80-column terminal sets it
    result = runner.invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout
    assert (
        max(len(line) for line in result.stdout.splitlines() if line[:1] in "┏┃┡│└") <= 80
    )  # the tables fit (text lines are the terminal's to wrap)
    settings = load_settings()
    names, values = _table_columns(result.stdout, "settings in effect")
    rows = describe_settings()
    assert names == "".join(row["env"] for row in rows)
    assert values == "".join(
        "".join(str(getattr(v, "value", v)).split()) for v in (getattr(settings, row["field"]) for row in rows)
    )
    assert str(deep / "precision-cache-with-a-long-name.json") in values
    columns = _table_columns(result.stdout, "devices and precisions")
    modes = [m.value for m in MODES]  # the table's column order
    expected = [[d["device"], d["name"], *(d["support"][m] for m in modes), d["auto"]] for d in data["devices"]]
    assert columns == ["".join("".join(str(row[j]).split()) for row in expected) for j in range(len(columns))]


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


def _main(argv, monkeypatch, capsys, **env):
    from genesis_fp16.cli import main

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    return exit_.value.code, capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, env, expected",
    [
        (
            ["evolve", "--precision", "tf32", "--budget", "16"],
            {"GENESIS_FP16_ON_UNSUPPORTED": "error"},
            "precision 'tf32' is not supported on cpu",
        ),
        (["evolve", "--budget", "16"], {"GENESIS_FP16_DISTRIBUTED": "fsdp"}, "not started by torchrun"),
        (["ppo", "--total-steps", "256"], {"GENESIS_FP16_DISTRIBUTED": "fsdp"}, "not started by torchrun"),
        (["profiles", "show", "x"], {"ENABLE_FP16_TRAINIG": "false"}, "did you mean ENABLE_FP16_TRAINING?"),
        (
            ["evolve", "--budget", "16", "--precision", "fp16"],
            {"GENESIS_FP16_INIT_SCALE": "1e300"},
            "GENESIS_FP16_INIT_SCALE='1e300'",
        ),
        (
            ["rollout", "status"],
            {"GENESIS_FP16_GROWTH_INTERVAL": "99999999999999999999999"},
            "GENESIS_FP16_GROWTH_INTERVAL=",
        ),
        (["drill"], {"GENESIS_FP16_EVENTS_KEEP": "100000"}, "GENESIS_FP16_EVENTS_KEEP='100000'"),
    ],
)
def test_every_configuration_error_is_one_line_and_exit_2(monkeypatch, capsys, tmp_path, argv, env, expected):
    monkeypatch.chdir(tmp_path)
    code, err = _main(argv, monkeypatch, capsys, **env)
    assert code == 2
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and expected in lines[0], err
    assert "Traceback" not in err
    # a run stopped by the error leaves no evaluation worker behind: one left alive
    # made pytest's own exit wait on it forever (concurrent.futures joins at exit)
    assert _workers_gone(), "evaluation workers outlived the failed run"


def _workers_gone(timeout_s: float = 30.0) -> bool:
    import time

    import psutil

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        workers = [c for c in psutil.Process().children(recursive=True) if _is_worker(c)]
        if not workers:
            return True
        time.sleep(0.2)
    return False


def _is_worker(proc) -> bool:
    import psutil

    try:
        return "spawn_main" in " ".join(proc.cmdline()) and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_configuration_error_found_behind_a_wrapping_error():
    from genesis_fp16.cli import configuration_error
    from genesis_fp16.rollout.profiles import ProfileError

    cause = ProfileError("profiles.toml: bad")
    try:
        try:
            raise cause
        except ProfileError as exc:
            raise RuntimeError("world model training failed") from exc
    except RuntimeError as wrapped:
        assert configuration_error(wrapped) is cause
    assert configuration_error(RuntimeError("a bug")) is None


def test_a_bug_keeps_its_traceback(monkeypatch):
    from genesis_fp16 import cli

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(cli, "app", broken)
    with pytest.raises(ZeroDivisionError):
        cli.main(["doctor"])


def test_version_prints_the_version():
    from genesis_fp16 import __version__

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"genesis-fp16 {__version__}"


def test_help_shows_every_extras_name():
    """An extra's name in brackets is not taken for markup (``.[plots]`` was shown as ``.``)."""
    result = runner.invoke(app, ["bench", "--help"], terminal_width=200)
    assert result.exit_code == 0 and ".[plots]" in result.output


@pytest.mark.parametrize(
    "given, threads, clock", [([], 1, "cpu"), (["--threads", "2"], 2, "wall"), (["--clock", "wall"], 1, "wall")]
)
def test_a_quick_bench_on_a_cpu_times_one_thread_by_its_cpu_clock(monkeypatch, given, threads, clock):
    """``bench --quick`` is robust under load by default on a CPU: one thread, timed by its own CPU clock (the
    defaults a full run keeps are torch's threads and the wall clock)."""
    from genesis_fp16_tools.bench import cli as bench_cli

    seen = {}

    def capture(options, *paths):
        seen["options"] = options
        return {"rows": [], "failed": [{"size": "S", "precision": "fp32", "reason": "captured"}]}

    monkeypatch.setattr(bench_cli, "run_and_write", capture)
    runner.invoke(app, ["bench", "--quick", "--device", "cpu", *given])
    assert seen["options"].threads == threads and seen["options"].clock == clock

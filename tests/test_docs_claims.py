"""Claims in README.md, docs/ and configs/ that a new user runs as written:
the profile example's copy command, the README's `tune` invocation, the
`auto` precision on an AVX512-BF16 CPU without AMX."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

from typer.testing import CliRunner

from genesis_fp16.cli import app
from genesis_fp16.precision import capability

REPO = Path(__file__).resolve().parents[1]


def test_profiles_example_copy_command_works_on_a_fresh_clone(tmp_path):
    text = (REPO / "configs" / "profiles.example.toml").read_text(encoding="utf-8")
    command = re.search(r"^# Use:\s+(.*)$", text, flags=re.M).group(1)
    (tmp_path / "configs").mkdir()
    shutil.copy(REPO / "configs" / "profiles.example.toml", tmp_path / "configs")
    done = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"{command!r}: {done.stderr}"
    assert (tmp_path / ".genesis_fp16" / "profiles.toml").is_file()


def test_readme_tune_line_is_a_working_invocation(state_dir):
    line = next(
        text
        for text in (REPO / "README.md").read_text(encoding="utf-8").splitlines()
        if text.startswith("genesis-fp16 tune")
    )
    synopsis = line.split("#")[0]
    assert "[--events F]" in synopsis and "default <state_dir>/events.jsonl" in line
    args = shlex.split(re.sub(r"\[[^\]]*\]", "", synopsis))[1:]  # the optional parts left out
    assert args == ["tune"]
    events = state_dir / "events.jsonl"
    events.write_text(json.dumps({"event": "trainer.scale_changed", "level": "info"}) + "\n", encoding="utf-8")
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["events"] == str(events)  # the state dir's log, as the README says


def test_auto_is_fp32_on_avx512_bf16_without_amx_as_documented(monkeypatch):

    monkeypatch.setattr(capability, "cpu_flags", lambda: frozenset({"avx512_bf16"}))
    mode, why = capability.auto_precision("cpu")
    assert mode.value == "fp32" and "no AMX" in why
    for doc in ("configs/profiles.example.toml", "docs/DISTRIBUTED.md"):
        text = (REPO / doc).read_text(encoding="utf-8")
        assert "AVX512-BF16/AMX CPUs" not in text and "CPU with AVX512-BF16/AMX, " not in text, doc


def test_every_readme_figure_names_its_host_kind():
    """Issue 54, item 6: each row of the README's measured figures names its host and the host's kind (the CPU
    kind, or the GPU), as the legend above the table defines them; a host letter the legend lacks fails."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    legend = text[text.index("## Measured figures") : text.index("| what | figure | host |")]
    defined = set(re.findall(r"\*\*([A-Z]'?)\*\*", legend))
    kinds = ("Intel AMX", "AVX512-BF16 without AMX", "AMD AVX512-BF16", "AVX2", "NVIDIA H200")
    rows = text[text.index("| what | figure | host |") :].split("\n\n")[0].splitlines()[2:]
    assert len(rows) >= 20
    for row in rows:
        host = row.split(" | ")[2]
        letters = re.findall(r"\b([A-Z]'?)(?=:)", host)
        assert letters, f"a figure without its host: {row[:80]!r}"
        assert set(letters) <= defined, f"hosts {set(letters) - defined} not in the legend: {row[:80]!r}"
        for letter in letters:
            assert re.search(rf"\b{re.escape(letter)}: ({'|'.join(kinds)})", host), (
                f"host {letter} without its kind: {host!r}"
            )

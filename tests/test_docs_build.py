"""The docs site and API reference build with `mkdocs build --strict`: a
renamed or removed documented name (a `::: module.Name` that no longer
resolves), a docstring griffe cannot read, or a broken link between docs
pages fails this test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytest.importorskip("mkdocstrings", reason="the docs extra is not installed: pip install -e '.[docs]' (dev includes it)")


def test_mkdocs_build_strict(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(REPO / "mkdocs.yml"), "-d", str(tmp_path / "site")],
        cwd=REPO, capture_output=True, text=True, timeout=120, env=env,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    assert (tmp_path / "site" / "reference" / "guard" / "index.html").is_file()
    page = (tmp_path / "site" / "reference" / "infrastructure" / "index.html").read_text(encoding="utf-8")
    assert "WorldModel" in page and "TrainReport" in page and "ReplayBuffer" in page

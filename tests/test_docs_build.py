"""The docs site and API reference build with `mkdocs build --strict`: a
renamed or removed documented name (a `::: module.Name` that no longer
resolves), a docstring griffe cannot read, or a broken link or anchor between
docs pages fails this test.

`--strict` fails only on warnings mkdocs counts; `-q` raises the log level so
none is counted, which is why no build here runs with `-q`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]

pytest.importorskip(
    "mkdocstrings", reason="the docs extra is not installed: pip install -e '.[docs]' (dev includes it)"
)


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=config.parent,
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )


def test_mkdocs_build_strict(tmp_path):
    done = _build(REPO / "mkdocs.yml", tmp_path / "site")
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{output}"
    assert "WARNING" not in output, f"mkdocs warned (strict mode should have failed on it):\n{output}"
    assert (tmp_path / "site" / "reference" / "guard" / "index.html").is_file()
    page = (tmp_path / "site" / "reference" / "infrastructure" / "index.html").read_text(encoding="utf-8")
    assert "WorldModel" in page and "TrainReport" in page and "ReplayBuffer" in page
    assert "delete_trajectories" in page and "NonFiniteDataError" in page and "branched_rollouts" in page
    agents = (tmp_path / "site" / "reference" / "agents" / "index.html").read_text(encoding="utf-8")
    assert "Real env steps the run may spend" in agents  # EvolveConfig's field docstrings are rendered
    for ref in (tmp_path / "site" / "reference").rglob("*.html"):
        assert ":class:`" not in ref.read_text(encoding="utf-8"), (
            f"a Sphinx role renders literally in {ref.parent.name}"
        )


def _tiny_site(tmp_path: Path, link: str) -> Path:
    """Two pages under the real mkdocs.yml's validation and Markdown settings
    (no API reference, so it builds in about a second); a.md links to ``link``."""
    real = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text(f"# A\n\nSee [the Ray backend]({link}).\n", encoding="utf-8")
    (docs / "b.md").write_text(
        '# B\n\n<a id="ray-backend"></a>\n## Real evaluations on a Ray cluster\n\nText.\n', encoding="utf-8"
    )
    config = {
        "site_name": "tiny",
        "docs_dir": "docs",
        "strict": real["strict"],
        "validation": real["validation"],
        "markdown_extensions": real["markdown_extensions"],
        "nav": ["a.md", "b.md"],
    }
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return tmp_path / "mkdocs.yml"


def test_explicit_anchor_is_seen_by_link_validation(tmp_path):
    done = _build(_tiny_site(tmp_path, "b.md#ray-backend"), tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("link", "named"),
    [("b.md#ray-bakend", "#ray-bakend"), ("c.md#ray-backend", "c.md")],
    ids=["broken anchor", "missing page"],
)
def test_broken_link_fails_the_build(tmp_path, link, named):
    done = _build(_tiny_site(tmp_path, link), tmp_path / "site")
    output = done.stdout + done.stderr
    assert done.returncode != 0, f"a link to {link} built without error:\n{output}"
    assert named in output and "Aborted with 1 warnings in strict mode" in output, output

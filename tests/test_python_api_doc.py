"""docs/PYTHON_API.md runs as written: its Python blocks, section by section
in order, each section in a fresh namespace (as if pasted alone into a new
interpreter), all in the test's scratch state dir. A renamed name or
argument the page uses fails here, and so does a section that leans on a
name another section defined."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_doc_snippets import PYTHON, parse_blocks, run_sections, sections, undefined_names

DOC = Path(__file__).resolve().parents[1] / "docs" / "PYTHON_API.md"

pytestmark = pytest.mark.usefixtures("one_thread")


def _blocks():
    return [b for b in parse_blocks(DOC) if b.lang in PYTHON]


def test_python_api_page_runs_as_written(state_dir, capsys):
    blocks = _blocks()
    assert len(blocks) == 4
    one, two, three, four = run_sections(DOC, blocks).values()
    assert one["resolved"].policy.precision == "bf16"
    assert two["decision"].action == "none"  # the shadow gap is small
    run, ledger = two["run"], two["ledger"]
    assert (
        run.trainer.precision.name == "fp32" and ledger.stage("my_agent") == "rolled_back" and len(run.rollbacks) == 1
    )
    assert three["ledger"].stage("my_agent") == "rolled_back"  # read back in a section of its own
    assert "non-finite" in three["rollbacks"][-1]["reason"]
    assert four["report"].steps == 60
    rollouts = four["rollouts"]
    assert rollouts.stats.rows == 8 and len(rollouts.transitions) == rollouts.stats.transitions > 0
    assert tuple(four["next_obs"].shape) == (8, 3) and tuple(four["alive"].shape) == (8,)


def test_each_section_defines_the_names_it_uses():
    """Issue 44: section 4 used the torch section 1 imported; pasted alone, it failed."""
    code = {section: "\n".join(b.code for b in blocks) for section, blocks in sections(_blocks()).items()}
    assert len(code) == 4
    problems = {name: found for name, found in undefined_names(code).items() if found}
    assert not problems, problems

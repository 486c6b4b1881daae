"""docs/PYTHON_API.md runs as written: its Python blocks, in order, in one
namespace, in the test's scratch state dir. A renamed name or argument the
page uses fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "PYTHON_API.md"

pytestmark = pytest.mark.usefixtures("one_thread")


def test_python_api_page_runs_as_written(state_dir, capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) == 4
    namespace: dict = {"__name__": "python_api_doc"}
    for i, block in enumerate(blocks, 1):
        exec(compile(block, f"{DOC.name} block {i}", "exec"), namespace)
    run, ledger = namespace["run"], namespace["ledger"]
    assert namespace["resolved"].policy.precision == "bf16"
    assert namespace["decision"].action == "none"  # the shadow gap is small
    assert run.trainer.precision.name == "fp32" and ledger.stage("my_agent") == "rolled_back" and len(run.rollbacks) == 1
    assert "non-finite" in namespace["rollbacks"][-1]["reason"]
    assert namespace["report"].steps == 60
    rollouts = namespace["rollouts"]
    assert rollouts.stats.rows == 8 and len(rollouts.transitions) == rollouts.stats.transitions > 0
    assert tuple(namespace["next_obs"].shape) == (8, 3) and tuple(namespace["alive"].shape) == (8,)

"""examples/custom_task.py runs: a custom task around its own gymnasium env,
evolved through the Python API on a tiny budget."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parents[1] / "examples"

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def custom_task(monkeypatch):
    # on sys.path, so the spawned evaluation workers import the example's env factory by name
    monkeypatch.syspath_prepend(str(EXAMPLES))
    module = importlib.import_module("custom_task")
    yield module
    sys.modules.pop("custom_task", None)


async def test_custom_task_example_runs(custom_task, tmp_path):
    tiny = dict(
        popsize=6,
        wm_steps=20,
        ensemble=2,
        refine_steps=4,
        critic_updates=0.2,
        model_rollouts=16,
        rollout_horizon=2,
        workers=1,
        eval_timeout_s=60,
    )
    report = await custom_task.evolve(12, seed=0, state_dir=str(tmp_path), **tiny)
    assert report["env"] == "Thermostat-v0" and report["config"]["policy"] == "linear" and report["mode"] == "loop"
    assert 8 <= report["real_episodes"] <= 12 and report["env_steps"] > 0
    assert report["heldout_return"] is not None and report["heldout_episodes"] == 16
    first = report["generations"][0]
    assert (
        first["wm_val_loss"] is not None and first["critic_val_loss"] is not None
    )  # the world model and the critic trained in the loop
    assert first["rollouts"] is not None  # the critic learned from the model's short rollouts too
    assert custom_task.THERMOSTAT.resolve().learns_termination  # no termination function given: the done head learns it


def test_the_embedding_page_shows_the_example_verbatim():
    """docs/EMBEDDING.md's one complete example is examples/custom_task.py as it stands (the doc tests run the
    page's block as a script: tests/test_doc_snippets.py::test_python_scripts_run)."""
    page = (EXAMPLES.parent / "docs" / "EMBEDDING.md").read_text(encoding="utf-8")
    start = page.index("<!-- snippet: script thermostat.py")
    block = page[page.index("```python\n", start) + len("```python\n") :]
    block = block[: block.index("```\n")]
    assert block == (EXAMPLES / "custom_task.py").read_text(encoding="utf-8")

"""The agents and infrastructure packages: gymnasium and cma are optional
(the ``agents`` extra), so every module imports without them and ``evolve``
without them stops with one line naming the extra to install; our own objects
have declared types, never probed ones; modules stay small."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

IMPORT_ALL = """
import importlib, pkgutil, sys
sys.modules["gymnasium"] = None  # an import of it now raises ImportError
sys.modules["cma"] = None
names = []
for package in ("agents", "infrastructure"):
    pkg = importlib.import_module(package)
    names.append(package)
    names += [m.name for m in pkgutil.walk_packages(pkg.__path__, package + ".")]
from genesis_fp16.base.extras import MissingExtraError
# PPO's environment code subclasses gymnasium's wrappers and vector envs, so it
# needs the extra to import; it must say so in one line, not with a bare ImportError
ENV_CODE = {"agents.ppo.envs", "agents.ppo.fast", "agents.ppo.ppo"}
refused = []
for name in names:
    try:
        importlib.import_module(name)
    except MissingExtraError as exc:
        assert name in ENV_CODE, f"{name}: {exc}"
        assert "pip install 'genesis-fp16[agents]'" in str(exc), exc
        refused.append(name)
        sys.modules.pop(name, None)
assert sorted(refused) == sorted(ENV_CODE), refused
assert sys.modules["gymnasium"] is None and sys.modules["cma"] is None
print("imported", len(names), " ".join(n for n in names if n not in ENV_CODE))
"""


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_every_module_imports_without_gymnasium_and_cma():
    proc = _python(IMPORT_ALL, ROOT)
    assert proc.returncode == 0, proc.stderr
    imported = proc.stdout.split()
    # the loop's modules (issue 38): the one CMA-ES driver, refinement, the learners, the critic and the model's step
    # API
    loop = [
        "agents.se_darwin_agent",
        "agents.cma_search",
        "agents.refine",
        "agents.learners",
        "agents.verify",
        "agents.run_state",
        "infrastructure.world_model",
        "infrastructure.critic",
        "infrastructure.critic_net",
        "infrastructure.model_env",
        "infrastructure.transitions",
        "infrastructure.learner",
    ]
    assert [name for name in loop if name not in imported] == []
    # the old loop's modules are gone, not left behind beside the new ones
    gone = [
        "agents.operators",
        "agents.probe_search",
        "agents.imagination",
        "agents.imagination_stats",
        "agents.racing",
        "agents.cma_baseline",
    ]
    assert [name for name in gone if name in imported] == []


@pytest.mark.parametrize(
    "missing, args",
    [
        ("cma", []),  # CMA-ES carries the loop's population
        ("cma", ["--baseline", "cma"]),
        ("gymnasium", ["--no-world-model", "--no-critic"]),  # real episodes, with nothing learned
        ("gymnasium", ["--baseline", "cma"]),
    ],
)
def test_evolve_without_the_extra_is_one_line(missing, args, tmp_path, state_dir):
    argv = ["evolve", "--budget", "16", "--workers", "1", *args]
    proc = _python(
        f"import sys; sys.modules[{missing!r}] = None; from genesis_fp16.cli import main; main({argv!r})", tmp_path
    )
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert f"genesis-fp16 evolve needs {missing}" in errors[0] and "pip install 'genesis-fp16[agents]'" in errors[0]
    assert "Traceback" not in proc.stderr
    assert "real episodes" not in proc.stderr, "checked before the progress bar starts"
    assert not any(state_dir.iterdir()), "nothing may be written before the extra is checked"


# benchmarks/ (the model-free yardsticks, not installed) keeps the same rules
SOURCES = sorted(
    p for package in ("agents", "infrastructure", "benchmarks") for p in ROOT.joinpath(package).rglob("*.py")
)
OUR_PACKAGES = ("agents", "infrastructure", "genesis_fp16", "benchmarks")


def _probes(path: Path) -> list[str]:
    """hasattr(...), getattr with a default, and ``try: import`` of our own
    modules guarded by ``except ImportError``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "hasattr" or (node.func.id == "getattr" and len(node.args) == 3):
                found.append(f"{path.name}:{node.lineno} {node.func.id}")
        if isinstance(node, ast.Try):
            catches_import_error = any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                for h in node.handlers
            )
            for stmt in node.body:
                modules = (
                    [a.name for a in stmt.names]
                    if isinstance(stmt, ast.Import)
                    else (
                        [stmt.module or "."]
                        if isinstance(stmt, ast.ImportFrom) and stmt.level == 0
                        else ["."]
                        if isinstance(stmt, ast.ImportFrom)
                        else []
                    )
                )
                ours = [m for m in modules if m == "." or m.split(".")[0] in OUR_PACKAGES]
                if catches_import_error and ours:
                    found.append(f"{path.name}:{stmt.lineno} try-import {ours[0]}")
    return found


def test_no_probing_of_our_own_objects():
    assert SOURCES
    found = [probe for path in SOURCES for probe in _probes(path)]
    assert found == [], f"say the type (a Protocol) instead of probing: {found}"


def test_one_cma_es_driver():
    """Issue 38: CMA-ES over policy parameters is written once (agents/cma_search.py);
    the loop, ``--baseline cma`` and the measured baselines all use it."""
    sites = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in SOURCES + sorted(ROOT.joinpath("scripts").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Call)
        and isinstance(node.func, (ast.Attribute, ast.Name))
        and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "CMAEvolutionStrategy"
    ]
    assert [site.split(":")[0] for site in sites] == ["agents/cma_search.py"], sites

"""The drawing of docs/ARCHITECTURE.md, enforced: the parts' import rules as rows, no module reading another
module's private members, no trainer or guarded training received as ``Any``, a handful of modules at the package's
root, each part saying what it is, and lines of at most 120 characters (ruff's E501, in .ci/run)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

from test_import_cycles import _imported_names, _modules

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("genesis_fp16", "genesis_fp16_tools", "agents", "infrastructure", "benchmarks")

# (importer, what it never imports, why): a module name covers its submodules; every import counts, wherever written
RULES = [
    ("genesis_fp16", "agents", "the core never imports the agents built on it"),
    ("genesis_fp16", "infrastructure", "the core never imports the learners built on it"),
    ("genesis_fp16", "genesis_fp16_tools", "the core never imports the bench or the forensics study"),
    ("genesis_fp16", "benchmarks", "nothing installed imports the yardsticks"),
    ("genesis_fp16.base", "genesis_fp16.precision", "the base stands under every part"),
    ("genesis_fp16.base", "genesis_fp16.training", "the base stands under every part"),
    ("genesis_fp16.base", "genesis_fp16.rollout", "the base stands under every part"),
    ("genesis_fp16.base", "genesis_fp16.distributed", "the base stands under every part"),
    (
        "genesis_fp16.precision",
        "genesis_fp16.rollout",
        "the decision and the measurement never read the ledger, "
        "profiles or policy: the policy layers hand them one typed request",
    ),
    (
        "genesis_fp16.precision",
        "genesis_fp16.training",
        "the precision part is under the training part: a trainer "
        "gets a decided plugin, and the measurement trains copies by a trainer it is handed",
    ),
    ("genesis_fp16.precision", "genesis_fp16.distributed", "the precision part is under the distributed trainers"),
    ("genesis_fp16.training.config", "genesis_fp16.rollout", "the training core is under the rollout part"),
    ("genesis_fp16.training.checkpoint", "genesis_fp16.rollout", "the training core is under the rollout part"),
    ("genesis_fp16.training.trainer", "genesis_fp16.rollout", "the trainer never reads the ledger"),
    ("genesis_fp16.training.trainer", "genesis_fp16.base.settings", "the trainer never reads settings"),
    ("genesis_fp16.training.trainer", "genesis_fp16.precision.measure", "the trainer never measures"),
    ("genesis_fp16.training.trainer", "genesis_fp16.precision.calibration", "the trainer never measures"),
    ("genesis_fp16.training.trainer", "genesis_fp16.precision.cache", "the trainer never reads the host cache"),
    ("genesis_fp16.training.trainer", "genesis_fp16.precision.record", "the trainer never reads the host cache"),
    ("genesis_fp16.training.trainer", "genesis_fp16.training.registry", "the trainer is built by the registry"),
    ("genesis_fp16.training.trainer", "genesis_fp16.training.guarded", "the trainer is trained by guarded training"),
    ("genesis_fp16.rollout.ledger", "genesis_fp16.training", "the ledger is plain storage"),
    ("genesis_fp16.rollout.ledger", "genesis_fp16.precision", "the ledger is plain storage"),
    ("infrastructure", "agents", "the learners never import the agents built on them"),
    ("infrastructure", "genesis_fp16_tools", "the learners never import the tools"),
]
ROOT_MODULES_AT_MOST = 12
LINE_LIMIT = 120


def _covers(prefix: str, module: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _direct_imports() -> dict[str, set[str]]:
    modules = _modules(REPO)
    known = set(modules)
    # only what a module imports itself: a package's __init__ running first is not its choice
    return {
        name: {m for m in _imported_names(name, path, known) if m in known or "." in m}
        for name, path in modules.items()
    }


IMPORTS = _direct_imports()


@pytest.mark.parametrize("importer, forbidden, why", RULES, ids=[f"{a}-x-{b}" for a, b, _ in RULES])
def test_an_import_rule_of_the_drawing(importer, forbidden, why):
    broken = sorted(
        f"{name} -> {imported}"
        for name, imports in IMPORTS.items()
        if _covers(importer, name)
        for imported in imports
        if _covers(forbidden, imported)
    )
    assert broken == [], f"{why}: {broken}"


def test_the_rules_name_real_modules():
    names = set(IMPORTS)
    for importer, forbidden, _ in RULES:
        assert any(_covers(importer, n) for n in names), importer
        assert any(_covers(forbidden, n) for n in names) or forbidden in PACKAGES, forbidden


def _defined_private_names(tree: ast.AST) -> set[str]:
    """Every private name a module defines: functions, classes, assignments (module level, ``self._x = ...``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def private_reads(sources: dict[str, str]) -> list[str]:
    """``file:line: what`` for every read of a private member (``obj._name``, ``from m import _name``) that another
    of ``sources`` (file -> text) defines and the reading file does not: a module that needs another's privates is
    the same concept (merge it) or needs a public method. ``self._x``, ``cls._x`` and ``super()._x`` are the class's
    own; privates of other projects (torch's) are not counted here."""
    trees = {f: ast.parse(text) for f, text in sources.items()}
    defined = {f: _defined_private_names(tree) for f, tree in trees.items()}
    ours = set().union(*defined.values()) if defined else set()
    found = []
    for f, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                    continue
                if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                    continue
                if node.attr in ours and node.attr not in defined[f]:
                    found.append(f"{f}:{node.lineno}: .{node.attr}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PACKAGES + ("",):
                found += [
                    f"{f}:{node.lineno}: import {a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    return sorted(found, key=lambda line: (line.split(":")[0], int(line.split(":")[1])))


def _sources() -> dict[str, str]:
    return {
        str(p.relative_to(REPO)): p.read_text(encoding="utf-8")
        for package in PACKAGES
        for p in sorted((REPO / package).rglob("*.py"))
    }


def test_no_module_reads_another_modules_private_members():
    assert private_reads(_sources()) == []


def test_the_private_read_check_finds_one():
    sources = {
        "a.py": "class A:\n    def __init__(self):\n        self._count = 0\n    def _step(self):\n        return "
        "self._count\n",
        "b.py": "def f(a):\n    a._step()\n    return a._count\n",
        "c.py": "from a import _step\nimport torch\ntorch._foreach_add_([], [])\n",
    }
    assert private_reads(sources) == ["b.py:2: ._step", "b.py:3: ._count"]  # c.py's names are not packages of ours
    assert private_reads({"a.py": sources["a.py"]}) == []


TRAINERS = {"FP16Trainer", "GuardedTraining", "DistributedTrainer", "DDPTrainer", "FSDPTrainer"}


def test_no_parameter_that_receives_a_trainer_is_typed_any():
    """A trainer or a guarded training is received by its type (or a Protocol), never as ``Any``: a parameter named
    after one (``trainer``, ``training``) typed ``Any``, or a module alias of ``Any`` named after one, is refused."""
    found = []
    for f, text in _sources().items():
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for arg in [*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs]:
                    named = arg.arg in ("trainer", "training") or arg.arg.endswith("_trainer")
                    if named and isinstance(arg.annotation, ast.Name) and arg.annotation.id == "Any":
                        found.append(f"{f}:{node.lineno}: {node.name}({arg.arg}: Any)")
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id == "Any":
                found += [
                    f"{f}:{node.lineno}: {t.id} = Any"
                    for t in node.targets
                    if isinstance(t, ast.Name) and t.id in TRAINERS
                ]
    assert found == []


def test_a_handful_of_modules_at_the_root_and_each_part_says_what_it_is():
    root = sorted(p.name for p in (REPO / "genesis_fp16").glob("*.py"))
    assert len(root) <= ROOT_MODULES_AT_MOST, root
    for part in sorted(p for p in (REPO / "genesis_fp16").iterdir() if (p / "__init__.py").is_file()):
        doc = ast.get_docstring(ast.parse((part / "__init__.py").read_text(encoding="utf-8")))
        assert doc and doc.split()[0] == "The" and "part" in doc.split(".")[0] + " " + doc, part.name
    tools = ast.get_docstring(ast.parse((REPO / "genesis_fp16_tools" / "__init__.py").read_text(encoding="utf-8")))
    assert tools and "never imports" in tools


def test_lines_are_at_most_120_characters_by_ruff():
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["ruff"]
    assert config["line-length"] == LINE_LIMIT and "E501" in config["lint"]["select"]


def test_the_drawings_code_references_hold():
    """docs/ARCHITECTURE.md's ``path:line`` (`code`) references point at lines that still hold that code
    (``python scripts/architecture_lines.py`` writes them anew)."""
    from scripts_loader import load_script

    lines = load_script("architecture_lines")
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    assert len(lines.REFERENCE.findall(text)) >= 16
    assert lines.problems(text) == []
    assert lines.problems("`genesis_fp16/training/trainer.py:1` (`def _account(`)")  # a stale line is found

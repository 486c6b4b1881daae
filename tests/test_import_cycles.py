"""The layering of ``genesis_fp16``, ``agents`` and ``infrastructure``: no
import circle among their modules, and imports point down only
(``agents`` -> ``infrastructure`` -> ``genesis_fp16``). ``benchmarks`` (the
model-free yardsticks, at the repository root and not installed) sits on top:
it may import the three, and none of them imports it.

Every ``import`` and ``from ... import`` counts, wherever it is written: at
module level, in a class body, inside a function or method, under
``if TYPE_CHECKING:``. A deferred import still makes one module depend on
the other; deferring it hides a circle from the interpreter, not from the
design. ``from package import name`` is an edge to ``package.name`` when that
is a module, else to the package; importing ``a.b.c`` is also an edge to
``a.b`` (its ``__init__`` runs first) unless the importer lives in ``a.b``.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("genesis_fp16", "genesis_fp16_tools", "agents", "infrastructure", "benchmarks")

# What each package must never import, at any level (docs/ARCHITECTURE.md: arrows point down only).
# Nothing installed imports `benchmarks`: an installed copy has no such package.
FORBIDDEN = {
    "genesis_fp16": ("agents", "infrastructure", "benchmarks", "genesis_fp16_tools"),
    "genesis_fp16_tools": ("benchmarks",),
    "infrastructure": ("agents", "benchmarks"),
    "agents": ("benchmarks",),
}

# Circles that exist today and are being removed on another branch. Each entry
# is one circle exactly as `cycles` names it; the test fails when an allowed
# circle disappears, so the allowance is deleted together with the circle.
# import circles tolerated for now (none): a new one fails the test, and so does
# an entry here that is no longer a circle
KNOWN_CIRCLES: set[tuple[str, ...]] = set()


def _modules(root: Path = REPO) -> dict[str, Path]:
    """Module name -> file, for every module of `PACKAGES` under ``root``."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imported_names(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module name the file of ``name`` (at ``path``) imports, relative
    imports resolved, whether or not it is one of ``known``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = parts[: len(parts) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.add(submodule if submodule in known else source)
    # importing a.b.c runs a/b/__init__ first, unless a.b is one of name's own
    # packages (those are being imported already when name runs)
    own = {name.rsplit(".", depth)[0] for depth in range(1, name.count(".") + 1)}
    for module in list(found):
        parts = module.split(".")
        found.update(".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) not in own)
    return {module for module in found if module and module != name}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules that the module ``name`` (at ``path``) imports."""
    return _imported_names(name, path, known) & known


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def layer_violations(modules: dict[str, Path]) -> list[str]:
    """``importer -> imported`` for every import that points up a layer (`FORBIDDEN`)."""
    known = set(modules)
    found = []
    for name, path in sorted(modules.items()):
        banned = FORBIDDEN.get(name.split(".")[0], ())
        for imported in sorted(_imported_names(name, path, known)):
            if imported.split(".")[0] in banned:
                found.append(f"{name} -> {imported}")
    return found


def _parse(source: str, tmp_path: Path, name: str) -> set[str]:
    path = tmp_path / f"{name.rpartition('.')[2]}.py"
    path.write_text(source, encoding="utf-8")
    return _imports(name, path, {"pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.sub", "pkg.sub.d"})


def test_the_cycle_finder_names_each_cycle() -> None:
    graph = {"a": {"b"}, "b": {"a"}, "c": {"a", "d"}, "d": {"e"}, "e": {"c"}}
    assert cycles(graph) == [["a", "b"], ["c", "d", "e"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_every_import_is_an_edge_wherever_it_is_written(tmp_path: Path) -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import a\n"
        "from .sub import d\n"
        "import pkg.c\n"
        "try:\n    from .sub import something\nexcept ImportError:\n    pass\n"
    )
    assert _parse(source, tmp_path, "pkg.x") == {"pkg.a", "pkg.sub.d", "pkg.c", "pkg.sub"}
    assert _parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import b\n", tmp_path, "pkg.x") == {
        "pkg.b"
    }
    assert _parse("def f():\n    from . import b\n", tmp_path, "pkg.x") == {"pkg.b"}
    assert _parse("class K:\n    def m(self):\n        import pkg.c\n", tmp_path, "pkg.x") == {"pkg.c"}
    assert _parse("async def f():\n    if True:\n        from .sub.d import g\n", tmp_path, "pkg.x") == {
        "pkg.sub.d",
        "pkg.sub",
    }
    assert _parse("from .. import a\n", tmp_path, "pkg.sub.d") == {"pkg.a"}
    assert _parse("def f():\n    from ..c import y\n", tmp_path, "pkg.sub.d") == {"pkg.c"}
    assert _parse("from pkg.sub.d import f\n", tmp_path, "pkg.a") == {"pkg.sub.d", "pkg.sub"}


def _tree(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for relative, source in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(source, encoding="utf-8")
    return _modules(root)


def test_a_circle_through_a_function_level_import_is_found(tmp_path: Path) -> None:
    modules = _tree(
        tmp_path,
        {
            "agents/__init__.py": "",
            "agents/a.py": "from .b import B\n",
            "agents/b.py": "B = 1\ndef make():\n    from .a import A\n",
            "agents/c.py": "from . import a, b\n",
        },
    )
    assert cycles(import_graph(modules)) == [["agents.a", "agents.b"]]


def test_the_layer_rule_sees_imports_at_any_level(tmp_path: Path) -> None:
    modules = _tree(
        tmp_path,
        {
            "genesis_fp16/__init__.py": "",
            "genesis_fp16/ok.py": "import json\nfrom . import util\nfrom genesis_fp16 import settings\n",
            "genesis_fp16/late.py": "def f():\n    from agents.tasks import Task\n",
            "genesis_fp16/sub/deep.py": "class K:\n    def m(self):\n        from ...infrastructure import dynamics\n",
            "infrastructure/store.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import "
            "agents\nimport genesis_fp16\n",
            "agents/loop.py": "import infrastructure.store\nimport genesis_fp16.ok\n",
            "agents/yardstick.py": "def f():\n    from benchmarks.baselines import run_ars\n",
            "benchmarks/baselines/ars.py": "from agents.tasks import Task\nimport infrastructure.store\nimport "
            "genesis_fp16.ok\n",
        },
    )
    assert layer_violations(modules) == [
        "agents.yardstick -> benchmarks",
        "agents.yardstick -> benchmarks.baselines",
        "genesis_fp16.late -> agents",
        "genesis_fp16.late -> agents.tasks",
        "genesis_fp16.sub.deep -> infrastructure",
        "infrastructure.store -> agents",
    ]


def test_the_graph_covers_every_package() -> None:
    graph = import_graph(_modules())
    assert {"genesis_fp16.training.trainer", "agents.se_darwin_agent", "infrastructure.world_model"} <= set(graph)
    assert "benchmarks.baselines.cma_tuned" in graph and "agents.evaluation" in graph["benchmarks.baselines.cma_tuned"]
    assert "genesis_fp16.precision.bare" in graph["genesis_fp16.training.trainer"]
    # a function-level import is an edge: the loop builds its world model on demand
    assert "infrastructure.world_model" in graph["agents.se_darwin_agent"]


def test_no_import_cycle() -> None:
    found = [tuple(c) for c in cycles(import_graph(_modules()))]
    new = [c for c in found if c not in KNOWN_CIRCLES]
    assert not new, "import cycles: " + "; ".join(" <-> ".join(c) for c in new)
    gone = KNOWN_CIRCLES - set(found)
    assert not gone, f"no longer circles, delete them from KNOWN_CIRCLES: {sorted(gone)}"


def test_imports_point_down_only() -> None:
    """``genesis_fp16`` imports neither ``agents`` nor ``infrastructure``, and
    ``infrastructure`` never imports ``agents``: the plugin reaches the agents'
    commands through entry points instead."""
    found = layer_violations(_modules())
    assert not found, "imports up a layer: " + "; ".join(found)


def test_registry_and_distributed_never_import_each_other() -> None:
    """The registry names the distributed factories as "module:attr" strings,
    and the distributed package needs no registry."""
    graph = import_graph(_modules())
    assert not {m for m in graph["genesis_fp16.training.registry"] if m.startswith("genesis_fp16.distributed")}
    for name, imported in graph.items():
        if name.startswith("genesis_fp16.distributed"):
            assert "genesis_fp16.training.registry" not in imported, name

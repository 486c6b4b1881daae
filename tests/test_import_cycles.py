"""No import cycle among the modules of ``genesis_fp16``, ``agents`` and
``infrastructure``.

An edge is an ``import`` or ``from ... import`` that runs when the module is
imported: at module level, in a class body, or under a module-level ``if`` /
``try`` / ``with``. Imports inside functions run later and are not edges, nor
are those under ``if TYPE_CHECKING:``. ``from package import name`` is an edge
to ``package.name`` when that is a module, else to the package; importing
``a.b.c`` is also an edge to ``a.b`` (its ``__init__`` runs first) unless the
importer lives in ``a.b``.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("genesis_fp16", "agents", "infrastructure")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_time_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of ``body`` that run at import time, nested blocks included."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        yield node
        if isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _import_time_statements(node.body)
            yield from _import_time_statements(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _import_time_statements(block)
        elif isinstance(node, (ast.With, ast.ClassDef)):
            yield from _import_time_statements(node.body)


def _imports(name: str, path: Path, known: set[str], *, in_functions: bool = False) -> set[str]:
    """The project modules that importing ``name`` (at ``path``) imports directly;
    with ``in_functions``, also those its functions import when called."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree) if in_functions else _import_time_statements(tree.body):
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
    return {module for module in found if module in known and module != name}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
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


def _parse(source: str, tmp_path: Path, name: str) -> set[str]:
    path = tmp_path / f"{name.rpartition('.')[2]}.py"
    path.write_text(source, encoding="utf-8")
    return _imports(name, path, {"pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.sub", "pkg.sub.d"})


def test_the_cycle_finder_names_each_cycle() -> None:
    graph = {"a": {"b"}, "b": {"a"}, "c": {"a", "d"}, "d": {"e"}, "e": {"c"}}
    assert cycles(graph) == [["a", "b"], ["c", "d", "e"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_edges_are_the_imports_that_run_at_import_time(tmp_path: Path) -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import a\n"
        "from .sub import d\n"
        "import pkg.c\n"
        "if TYPE_CHECKING:\n    from . import b\n"
        "try:\n    from .sub import something\nexcept ImportError:\n    pass\n"
        "def f():\n    from . import b\n"
        "class K:\n    from . import b as bb\n"
    )
    assert _parse(source, tmp_path, "pkg.x") == {"pkg.a", "pkg.sub.d", "pkg.c", "pkg.sub", "pkg.b"}
    lazy_only = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import b\ndef f():\n    from . import c\n"
    assert _parse(lazy_only, tmp_path, "pkg.x") == set()
    assert _parse("from .. import a\n", tmp_path, "pkg.sub.d") == {"pkg.a"}
    assert _parse("from pkg.sub.d import f\n", tmp_path, "pkg.a") == {"pkg.sub.d", "pkg.sub"}


def test_the_graph_covers_all_three_packages() -> None:
    graph = import_graph()
    assert {"genesis_fp16.trainer", "agents.se_darwin_agent", "infrastructure.world_model"} <= set(graph)
    assert "genesis_fp16.settings" in graph["genesis_fp16.trainer"]


def test_no_import_cycle() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_registry_and_distributed_never_import_each_other() -> None:
    """Not even inside a function: the registry names the distributed factories
    as "module:attr" strings, and the distributed package needs no registry."""
    modules = _modules()
    known = set(modules)
    registry = _imports("genesis_fp16.registry", modules["genesis_fp16.registry"], known, in_functions=True)
    assert not {m for m in registry if m.startswith("genesis_fp16.distributed")}
    for name, path in modules.items():
        if name.startswith("genesis_fp16.distributed"):
            assert "genesis_fp16.registry" not in _imports(name, path, known, in_functions=True), name

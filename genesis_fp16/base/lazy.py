"""Package attributes imported on first use (PEP 562).

A package whose ``__init__`` re-exports names from torch-heavy submodules
makes every importer pay for torch (about 3 s of CPU on a 2-core machine),
including commands that train nothing. ``lazy_exports`` gives such a package
a module-level ``__getattr__`` and ``__dir__`` so that ``from pkg import Name``
still works, importing the submodule only then.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Iterable, Mapping


def lazy_exports(
    package: str, exports: Mapping[str, str], public: Iterable[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``exports`` maps a public
    name to the (relative) submodule that defines it; ``public`` is ``__all__``."""
    names = tuple(public)

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        vars(importlib.import_module(package))[name] = value  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(importlib.import_module(package))) | set(names))

    return __getattr__, __dir__

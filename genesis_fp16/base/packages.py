"""Our top-level packages next to a host project's: who owns ``agents`` and ``infrastructure``.

genesis-fp16 installs three top-level packages: ``genesis_fp16`` (the plugin),
``infrastructure`` (world model, replay buffer, the seed's
``infrastructure.training``) and ``agents`` (the evolution loop, PPO). Python
holds one package per top-level name, so a host project with its own
``agents`` (or ``infrastructure``) earlier on ``sys.path`` hides ours, and the
failure would read ``No module named 'agents.se_darwin_agent'``. This module
finds such a shadow without importing either package and names both paths;
docs/EMBEDDING.md ("Next to a project with its own agents package") says what
to do about it. ``genesis_fp16`` itself never imports either package, so the
trainer, settings and rollout work next to any host.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

SIBLINGS = ("agents", "infrastructure")
_ROOT = (
    Path(__file__).resolve().parents[2]
)  # where genesis_fp16 and its siblings were installed together (this is genesis_fp16/base/)


class PackageShadowedWarning(UserWarning):
    """A host project's package of the same top-level name hides one of ours."""


class PackageShadowedError(ImportError):
    """One of our packages is needed, and a host project's package of the same name is found instead."""


@dataclass(frozen=True)
class Shadow:
    name: str
    found: Path  # the package Python resolves the name to
    ours: Path  # where genesis-fp16's own package of that name is installed

    def message(self) -> str:
        return (
            f"the top-level package {self.name!r} resolves to {self.found}, not genesis-fp16's {self.ours}: "
            f"another project's {self.name!r} comes first on sys.path. genesis_fp16 works next to it; for "
            f"genesis-fp16's {self.name} see docs/EMBEDDING.md (next to a project with its own agents package)"
        )


def _location(name: str) -> Optional[Path]:
    """The directory the top-level ``name`` resolves to, without importing it."""
    module = sys.modules.get(name)
    spec = module.__spec__ if module is not None and module.__spec__ is not None else None
    if spec is None:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    if locations:
        return Path(locations[0]).resolve()
    return Path(spec.origin).resolve().parent if spec.origin else None


def shadowed(names: tuple[str, ...] = SIBLINGS, root: Path = _ROOT) -> list[Shadow]:
    """Our packages among ``names`` that resolve to another project's package.
    A name that resolves nowhere is not a shadow (e.g. the core install,
    or ours not installed beside genesis_fp16)."""
    out = []
    for name in names:
        ours = root / name
        if not (ours / "__init__.py").is_file():
            continue
        found = _location(name)
        if found is not None and found != ours.resolve():
            out.append(Shadow(name, found, ours))
    return out


def require_ours(*names: str) -> None:
    """Raise `PackageShadowedError` naming both paths when one of
    ``names`` resolves to another project's package."""
    found = shadowed(names)
    if found:
        raise PackageShadowedError("; ".join(shadow.message() for shadow in found))


def warn_if_shadowed() -> None:
    """One `PackageShadowedWarning` per shadowed package (filter it
    with ``warnings.filterwarnings("ignore", category=PackageShadowedWarning)``
    where the host's package is meant to win)."""
    for shadow in shadowed():
        warnings.warn(shadow.message(), PackageShadowedWarning, stacklevel=3)

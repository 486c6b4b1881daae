"""Optional dependencies.

The core package needs only what the trainer, rollout and forensics math need.
The evolution agents (gymnasium, cma) and the plots (matplotlib) are extras;
``dev`` includes them all. A command that needs a missing extra stops with one
line naming the package and the install command, never an ImportError trace.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# module name -> the extra that installs it
EXTRAS = {
    "gymnasium": "agents",
    "cma": "agents",
    "yaml": "agents",
    "matplotlib": "plots",
    "ray": "ray",
    "tensorboard": "tensorboard",
    "stable_baselines3": "bench",
}


class MissingExtraError(ImportError):
    """An optional package a feature needs is not installed."""


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module`` or raise `MissingExtraError` saying what to install.

    ``purpose`` completes "... needs <module>", e.g. ``"genesis-fp16 evolve"``.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".", 1)[0]
        extra = EXTRAS.get(top)
        hint = f"pip install 'genesis-fp16[{extra}]'" if extra else f"pip install {top}"
        raise MissingExtraError(
            f"{purpose} needs {top}, which is not installed ({exc}); install it with: {hint}"
        ) from None

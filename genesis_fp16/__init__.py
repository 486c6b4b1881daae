"""genesis-fp16: mixed-precision training for the learned parts of self-evolving agents.

The names below are imported on first use (PEP 562), so that commands which
train nothing (``genesis-fp16 --help``, ``rollout status``) do not pay for
importing torch: ``from genesis_fp16 import FP16Trainer`` imports the trainer
then, and not before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from genesis_fp16.base.lazy import lazy_exports
from genesis_fp16.base.packages import PackageShadowedError, PackageShadowedWarning, warn_if_shadowed

if TYPE_CHECKING:  # for type checkers and IDEs; at run time `__getattr__` imports these
    from genesis_fp16.training.config import FP16TrainingConfig
    from genesis_fp16.base.errors import CheckpointError, DeviceUnavailableError, UnsupportedPrecisionError
    from genesis_fp16.base.settings import PrecisionConfig, Settings, SettingsError, load_settings
    from genesis_fp16.training.trainer import FP16Trainer

__version__ = "0.1.0"

# a host project's own `agents` or `infrastructure` hiding ours: say so now,
# naming both paths, rather than fail later with "No module named agents.x"
warn_if_shadowed()

# public name -> the submodule that defines it
_LAZY = {
    "CheckpointError": ".base.errors",
    "DeviceUnavailableError": ".base.errors",
    "UnsupportedPrecisionError": ".base.errors",
    "FP16Trainer": ".training.trainer",
    "FP16TrainingConfig": ".training.config",
    "PrecisionConfig": ".base.settings",
    "Settings": ".base.settings",
    "SettingsError": ".base.settings",
    "load_settings": ".base.settings",
}

__all__ = [
    "CheckpointError",
    "DeviceUnavailableError",
    "FP16Trainer",
    "FP16TrainingConfig",
    "PackageShadowedError",
    "PackageShadowedWarning",
    "PrecisionConfig",
    "Settings",
    "SettingsError",
    "UnsupportedPrecisionError",
    "load_settings",
    "__version__",
]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)

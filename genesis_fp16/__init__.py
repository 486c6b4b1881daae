"""genesis-fp16: mixed-precision training for the learned parts of self-evolving agents."""

from .checkpoint import CheckpointError
from .config import FP16TrainingConfig
from .device import DeviceUnavailableError
from .packages import PackageShadowedError, PackageShadowedWarning, warn_if_shadowed
from .precision import UnsupportedPrecisionError
from .settings import PrecisionConfig, Settings, SettingsError, load_settings
from .trainer import FP16Trainer

__version__ = "0.1.0"

# a host project's own `agents` or `infrastructure` hiding ours: say so now,
# naming both paths, rather than fail later with "No module named agents.x"
warn_if_shadowed()

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

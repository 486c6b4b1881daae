"""genesis-fp16: mixed-precision training for the learned parts of self-evolving agents."""

from .checkpoint import CheckpointError
from .precision import UnsupportedPrecisionError
from .settings import Settings, SettingsError, load_settings
from .trainer import FP16Trainer, FP16TrainingConfig

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "FP16Trainer",
    "FP16TrainingConfig",
    "Settings",
    "SettingsError",
    "UnsupportedPrecisionError",
    "load_settings",
    "__version__",
]

"""genesis-fp16: mixed-precision training for the learned parts of self-evolving agents."""

from .checkpoint import CheckpointError
from .config import FP16TrainingConfig
from .precision import UnsupportedPrecisionError
from .settings import PrecisionConfig, Settings, SettingsError, load_settings
from .trainer import FP16Trainer

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "FP16Trainer",
    "FP16TrainingConfig",
    "PrecisionConfig",
    "Settings",
    "SettingsError",
    "UnsupportedPrecisionError",
    "load_settings",
    "__version__",
]

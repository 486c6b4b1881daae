"""``infrastructure.training.fp16_trainer``: the single-process trainer, the
same objects as ``genesis_fp16`` (the plugin owns them; this path keeps
agent-side code that imports it working)."""

from genesis_fp16.training.config import FP16TrainingConfig
from genesis_fp16.training.trainer import FP16Trainer

__all__ = ["FP16Trainer", "FP16TrainingConfig"]

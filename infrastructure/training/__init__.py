"""The seed's import path for the trainer; the same objects as ``genesis_fp16``."""

from genesis_fp16.trainer import FP16Trainer, FP16TrainingConfig

__all__ = ["FP16Trainer", "FP16TrainingConfig"]

"""Training re-exports: ``fp16_trainer`` (FP16Trainer, FP16TrainingConfig,
also importable from this package) and ``fp16_trainer_extended`` (DDP/FSDP2
trainers, registry lookup); the same objects as ``genesis_fp16``."""

from .fp16_trainer import FP16Trainer, FP16TrainingConfig

__all__ = ["FP16Trainer", "FP16TrainingConfig"]

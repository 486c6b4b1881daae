"""``infrastructure.training.fp16_trainer_extended``: the distributed trainers
(DDP, FSDP2 under ``torchrun``; docs/DISTRIBUTED.md) and the registry lookup
that picks a trainer by name or by an agent's policy, the same objects as
``genesis_fp16.distributed`` and ``genesis_fp16.training.registry``."""

from genesis_fp16.distributed import DDPTrainer, DistributedTrainer, FSDPTrainer
from genesis_fp16.training.registry import available, create_trainer, trainer_for

__all__ = ["DDPTrainer", "DistributedTrainer", "FSDPTrainer", "available", "create_trainer", "trainer_for"]

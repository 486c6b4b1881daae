"""``infrastructure.training``'s module paths re-export the plugin's own objects,
so code written against ``infrastructure.training.fp16_trainer`` and
``infrastructure.training.fp16_trainer_extended`` imports unchanged."""

from __future__ import annotations

import importlib

import genesis_fp16
from genesis_fp16 import distributed
from genesis_fp16.training import registry


def test_fp16_trainer_path_gives_the_plugins_classes() -> None:
    from infrastructure.training.fp16_trainer import FP16Trainer, FP16TrainingConfig

    assert FP16Trainer is genesis_fp16.FP16Trainer
    assert FP16TrainingConfig is genesis_fp16.FP16TrainingConfig
    package = importlib.import_module("infrastructure.training")
    module = importlib.import_module("infrastructure.training.fp16_trainer")
    assert set(package.__all__) <= set(module.__all__)
    for name in module.__all__:
        assert getattr(module, name) is getattr(genesis_fp16, name)


def test_fp16_trainer_extended_path_gives_the_distributed_trainers_and_the_registry() -> None:
    from infrastructure.training.fp16_trainer_extended import (
        DDPTrainer,
        FSDPTrainer,
        available,
        create_trainer,
        trainer_for,
    )

    assert DDPTrainer is distributed.DDPTrainer and FSDPTrainer is distributed.FSDPTrainer
    assert create_trainer is registry.create_trainer and trainer_for is registry.trainer_for
    assert available is registry.available
    assert {"ddp", "fsdp"} <= set(available())
    module = importlib.import_module("infrastructure.training.fp16_trainer_extended")
    origins = {
        "DistributedTrainer": distributed,
        "DDPTrainer": distributed,
        "FSDPTrainer": distributed,
        "available": registry,
        "create_trainer": registry,
        "trainer_for": registry,
    }
    assert sorted(module.__all__) == sorted(origins)
    for name, origin in origins.items():
        assert getattr(module, name) is getattr(origin, name)

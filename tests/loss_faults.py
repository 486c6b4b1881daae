"""A loss fault injected into a world model's training by the tests:
`WorldModel.train` has no test hook, so a NaN storm for the guard to roll
back goes in here: each `GuardedTraining.step` (and each step of
`GuardedTraining.train_windows`) gets the world model's loss function wrapped, so the trained model's loss is rewritten
before the
backward while the FP32 reference (another model) is spared. World-model
training runs in a thread of this process, so patching the instance reaches it."""

from __future__ import annotations

import itertools
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch

FaultFn = Callable[[int, torch.Tensor], torch.Tensor]


@contextmanager
def loss_fault(world_model: Any, fault: FaultFn) -> Iterator[None]:
    """While the block runs, each training step of ``world_model`` passes
    its loss through ``fault(step, loss) -> loss``; ``step`` counts from 0 at
    the start of the block (one `train` call: that call's step)."""
    training = world_model.training
    real, real_windows = training.step, training.train_windows
    steps = itertools.count()

    def step(batch: Any, loss_fn: Any, **kwargs: Any) -> bool:
        n = next(steps)

        def faulty(model: torch.nn.Module, data: Any) -> torch.Tensor:
            loss = loss_fn(model, data)
            return fault(n, loss) if model is training.trainer.model else loss

        return real(batch, faulty, **kwargs)

    def train_windows(batches: Any, loss_fn: Any, **kwargs: Any) -> Any:
        def faulty(model: torch.nn.Module, data: Any) -> torch.Tensor:  # the trained model's loss, once per step
            loss = loss_fn(model, data)
            return fault(next(steps), loss) if model is training.trainer.model else loss

        return real_windows(batches, faulty, **kwargs)

    training.step, training.train_windows = step, train_windows
    try:
        yield
    finally:
        del training.step, training.train_windows


def nan_storm(first: int, end: int) -> FaultFn:
    """NaN losses at steps ``first`` .. ``end - 1``."""
    return lambda step, loss: loss * float("nan") if first <= step < end else loss

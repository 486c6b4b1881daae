"""TensorBoard scalars from the structured events.

A structlog processor maps the numbers of known events (docs/EVENTS.md) to
scalar tags, so no training code knows about TensorBoard: the trainer's loss
scale and overflow rate, PPO's losses, the world model's losses, the FP32 gap
of shadow, canary and inference checks, and the guard's and canary's verdicts
as numbers. ``genesis-fp16 evolve --tensorboard DIR`` and ``ppo`` use it;
in a program::

    with tensorboard_events(Path("runs/tb")):
        ...  # everything logged meanwhile becomes scalars

Needs the ``tensorboard`` extra (``torch.utils.tensorboard`` writes the files).
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

from genesis_fp16.base import telemetry
from genesis_fp16.base.extras import require

PURPOSE = "TensorBoard scalars (--tensorboard, GENESIS_FP16_TENSORBOARD_DIR)"
ACTIONS = {"none": 0.0, "warn": 1.0, "rollback": 2.0}
SEVERITIES = {None: 0.0, "P2": 1.0, "P1": 2.0, "P0": 3.0}


@dataclass(frozen=True)
class Scalar:
    """One field of one event as a scalar. ``tag`` may name event fields in
    braces (``{agent}``), so two trainers' curves stay apart."""

    event: str
    field: str
    tag: str
    # the field that places the point on the x axis; None: the tag's own count
    step: Optional[str] = None
    # a verdict's words as numbers (the order of severity)
    codes: Optional[Mapping[Any, float]] = None


SCALARS = (
    Scalar("trainer.scale_changed", "new_scale", "trainer/{trainer}/loss_scale", step="step"),
    Scalar("trainer.step_skipped", "overflow_rate", "trainer/{trainer}/overflow_rate", step="step"),
    Scalar("ppo.iteration", "pg_loss", "ppo/policy_loss", step="global_step"),
    Scalar("ppo.iteration", "v_loss", "ppo/value_loss", step="global_step"),
    Scalar("ppo.iteration", "mean_return", "ppo/episode_return", step="global_step"),
    Scalar("ppo.iteration", "loss_scale", "ppo/loss_scale", step="global_step"),
    Scalar("ppo.iteration", "overflow_rate", "ppo/overflow_rate", step="global_step"),
    Scalar("world_model.trained", "train_loss", "world_model/{agent}/train_loss"),
    Scalar("world_model.trained", "val_loss", "world_model/{agent}/val_loss"),
    Scalar("world_model.trained", "fp32_val_loss", "world_model/{agent}/fp32_val_loss"),
    Scalar("world_model.trained", "inference_gap", "fp32_gap/{agent}/inference"),
    Scalar("rollout.shadow_gap", "gap", "fp32_gap/{agent}/shadow"),
    Scalar("guard.canary", "val_loss_ratio", "fp32_gap/{agent}/canary_val_loss_ratio"),
    Scalar("guard.canary", "kl", "fp32_gap/{agent}/canary_kl"),
    Scalar("guard.canary", "alarm", "verdict/{agent}/canary_alarm", codes={False: 0.0, True: 1.0}),
    Scalar("guard.decision", "action", "verdict/{agent}/guard_action", codes=ACTIONS),
    Scalar("guard.decision", "severity", "verdict/{agent}/guard_severity", codes=SEVERITIES),
    Scalar("evolve.generation", "best_return", "evolve/best_return", step="real_episodes"),
    Scalar("evolve.generation", "wm_val_loss", "evolve/wm_val_loss", step="real_episodes"),
    Scalar("evolve.generation", "critic_val_loss", "evolve/critic_val_loss", step="real_episodes"),
)


class _Fields(dict):
    def __missing__(self, key: str) -> str:
        return "-"  # an event without the field still lands under one tag


class TensorBoardSink:
    """A processor that writes the scalars of `SCALARS` and passes
    every event on unchanged. ``writer`` is anything with ``add_scalar(tag,
    value, step)``; `tensorboard_events` gives it a ``SummaryWriter``."""

    def __init__(self, writer: Any, scalars: tuple[Scalar, ...] = SCALARS) -> None:
        self.writer = writer
        self._by_event: dict[str, list[Scalar]] = {}
        for scalar in scalars:
            self._by_event.setdefault(scalar.event, []).append(scalar)
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()  # world-model training logs from a worker thread

    def __call__(self, logger: Any, method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
        for scalar in self._by_event.get(str(event_dict.get("event")), ()):
            if scalar.field not in event_dict:
                continue
            value = self._value(scalar, event_dict[scalar.field])
            if value is None:
                continue
            tag = scalar.tag.format_map(_Fields(event_dict))
            with self._lock:
                step = event_dict.get(scalar.step) if scalar.step else None
                if not isinstance(step, int) or isinstance(step, bool):
                    step = self._counts[tag]
                self._counts[tag] += 1
                self.writer.add_scalar(tag, value, step)
        return event_dict

    @staticmethod
    def _value(scalar: Scalar, raw: Any) -> Optional[float]:
        if scalar.codes is not None:
            return scalar.codes.get(raw)
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
            return None
        return float(raw)


def check_available() -> None:
    """Raise `genesis_fp16.base.extras.MissingExtraError` naming the extra
    when the tensorboard package is missing: call it before any work."""
    require("tensorboard", PURPOSE)


@contextmanager
def tensorboard_events(directory: Optional[Path]) -> Iterator[Optional[TensorBoardSink]]:
    """While the block runs, the events become scalars in ``directory`` (a
    new event file there); closed and flushed after it. ``None``: nothing."""
    if directory is None:
        yield None
        return
    check_available()
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(directory))
    sink = TensorBoardSink(writer)
    telemetry.add_sink(sink)
    try:
        yield sink
    finally:
        telemetry.remove_sink(sink)
        writer.close()

"""genesis_fp16/base/tensorboard_sink.py: events become scalars, with no training code involved."""

from __future__ import annotations

import sys

import pytest

from genesis_fp16.base import telemetry
from genesis_fp16.base.extras import MissingExtraError
from genesis_fp16.base.tensorboard_sink import TensorBoardSink, check_available, tensorboard_events


class Writer:
    def __init__(self):
        self.scalars = []

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))


def _feed(sink, event, **fields):
    out = sink(None, "info", {"event": event, **fields})
    assert out["event"] == event  # passed on unchanged


def test_known_fields_become_tagged_scalars():
    writer = Writer()
    sink = TensorBoardSink(writer)
    _feed(sink, "trainer.scale_changed", old_scale=65536.0, new_scale=32768.0, step=7, trainer="wm")
    _feed(
        sink, "trainer.step_skipped", reason="nonfinite_loss", step=8, loss=float("nan"), trainer="wm"
    )  # no overflow_rate
    _feed(
        sink,
        "world_model.trained",
        train_loss=0.2,
        val_loss=0.3,
        fp32_val_loss=None,
        inference_gap=0.01,
        agent="pendulum",
    )
    _feed(
        sink,
        "world_model.trained",
        train_loss=0.1,
        val_loss=0.2,
        fp32_val_loss=0.19,
        inference_gap=0.0,
        agent="pendulum",
    )
    _feed(sink, "guard.decision", action="rollback", severity="P0", agent="pendulum")
    _feed(sink, "guard.canary", alarm=True, val_loss_ratio=1.4, agent="pendulum")
    _feed(sink, "rollout.shadow_gap", gap=0.02, agent="pendulum")
    _feed(sink, "checkpoint.saved", path="x", step=3)  # not a scalar
    assert writer.scalars == [
        ("trainer/wm/loss_scale", 32768.0, 7),
        ("world_model/pendulum/train_loss", 0.2, 0),
        ("world_model/pendulum/val_loss", 0.3, 0),
        ("fp32_gap/pendulum/inference", 0.01, 0),
        ("world_model/pendulum/train_loss", 0.1, 1),
        ("world_model/pendulum/val_loss", 0.2, 1),
        ("world_model/pendulum/fp32_val_loss", 0.19, 0),
        ("fp32_gap/pendulum/inference", 0.0, 1),
        ("verdict/pendulum/guard_action", 2.0, 0),
        ("verdict/pendulum/guard_severity", 3.0, 0),
        ("fp32_gap/pendulum/canary_val_loss_ratio", 1.4, 0),
        ("verdict/pendulum/canary_alarm", 1.0, 0),
        ("fp32_gap/pendulum/shadow", 0.02, 0),
    ]


def test_sink_sees_logged_events_only_while_installed(tmp_path):
    writer = Writer()
    sink = TensorBoardSink(writer)
    log = telemetry.get_logger("test")
    telemetry.add_sink(sink)
    try:
        log.info("evolve.generation", generation=0, real_episodes=16, best_return=-900.0, wm_val_loss=0.01)
    finally:
        telemetry.remove_sink(sink)
    log.info("evolve.generation", generation=1, real_episodes=32, best_return=-800.0, wm_val_loss=0.01)
    assert writer.scalars == [("evolve/best_return", -900.0, 16), ("evolve/wm_val_loss", 0.01, 16)]


def test_event_file_holds_the_tags(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = telemetry.get_logger("test")
    with tensorboard_events(tmp_path / "tb"):
        for step, scale in ((1, 32768.0), (5, 16384.0)):
            log.warning("trainer.scale_changed", old_scale=scale * 2, new_scale=scale, step=step, trainer="ppo")
        log.info("guard.decision", action="none", severity=None, agent="ppo")
    accumulator = EventAccumulator(str(tmp_path / "tb"))
    accumulator.Reload()
    assert set(accumulator.Tags()["scalars"]) == {
        "trainer/ppo/loss_scale",
        "verdict/ppo/guard_action",
        "verdict/ppo/guard_severity",
    }
    assert [(e.step, e.value) for e in accumulator.Scalars("trainer/ppo/loss_scale")] == [(1, 32768.0), (5, 16384.0)]


def test_missing_tensorboard_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import now raises ImportError
    with pytest.raises(MissingExtraError, match=r"needs tensorboard.*genesis-fp16\[tensorboard\]"):
        check_available()
    with pytest.raises(MissingExtraError):
        with tensorboard_events(tmp_path / "tb"):
            pass
    assert not (tmp_path / "tb").exists()

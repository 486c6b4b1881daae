"""Shared fixtures: every test gets its own state dir and a clean environment."""

from __future__ import annotations

import os

import pytest

from genesis_fp16 import telemetry


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path_factory, monkeypatch):
    state = tmp_path_factory.mktemp("state")
    for var in list(os.environ):
        if var.startswith("GENESIS_FP16_") or var == "ENABLE_FP16_TRAINING":
            monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GENESIS_FP16_STATE_DIR", str(state))
    telemetry.configure_logging(force=True)
    telemetry.reset_once()
    yield state
    telemetry.reset_once()


@pytest.fixture
def state_dir(_isolated_state):
    """The state dir the current test's settings point at."""
    return _isolated_state

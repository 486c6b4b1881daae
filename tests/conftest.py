"""Shared fixtures: every test gets its own state dir and a clean environment."""

from __future__ import annotations

import os

import pytest
import torch

from genesis_fp16.base import telemetry
from genesis_fp16.precision import capability

CPU_KINDS = {
    "amx": frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile"}),
    "avx512-bf16": frozenset({"avx2", "avx512f", "avx512_bf16"}),
    "avx2": frozenset({"avx2", "f16c"}),
}


def pytest_addoption(parser):
    parser.addoption(
        "--cpu-kind",
        choices=sorted(CPU_KINDS),
        default=None,
        help="run the suite as if this process ran on that CPU kind (its flags patched into the capability "
        "check; tests that patch the flags themselves still win; subprocesses see the real CPU)",
    )


@pytest.fixture(autouse=True)
def _cpu_kind(request, monkeypatch):
    kind = request.config.getoption("--cpu-kind")
    if kind is not None:
        monkeypatch.setattr(capability, "cpu_flags", lambda: CPU_KINDS[kind])
    yield


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path_factory, monkeypatch):
    state = tmp_path_factory.mktemp("state")
    for var in list(os.environ):
        if var.startswith("GENESIS_FP16_") or var == "ENABLE_FP16_TRAINING":
            monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GENESIS_FP16_STATE_DIR", str(state))
    # auto's host-level decision cache: never the real ~/.cache in a test
    monkeypatch.setenv("GENESIS_FP16_PRECISION_CACHE", str(state / "precision-cache.json"))
    # the world model's device: the CPU, whatever the machine has (auto would pick a GPU where
    # there is one); the CUDA tests ask for device="cuda" by name
    monkeypatch.setenv("GENESIS_FP16_DEVICE", "cpu")
    # precision=auto by the flag rule: a measured auto would decide by this machine's timings, so the
    # suite's outcome would depend on its load; the tests of the measured path set it to measure and
    # inject the timings (tests/test_calibration.py)
    monkeypatch.setenv("GENESIS_FP16_AUTO_PRECISION", "rule")
    # a quiet machine's load: a measured decision is kept in the host cache only when measured under a load
    # at most the core count, and this machine's load must not decide what a test sees (the tests of a
    # loaded measurement patch it)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.25, 0.25, 0.25))
    telemetry.configure_logging(force=True)
    telemetry.reset_once()
    yield state
    telemetry.reset_once()


@pytest.fixture
def state_dir(_isolated_state):
    """The state dir the current test's settings point at."""
    return _isolated_state


@pytest.fixture
def one_thread():
    """One intra-op thread: tiny tensors on a shared 2-core machine run fastest
    and least noisy on one. Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

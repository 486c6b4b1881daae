"""Where the world model runs (genesis_fp16/base/device.py, GENESIS_FP16_DEVICE):
the setting's values, a device that is not there (error or a logged fallback,
by GENESIS_FP16_ON_UNSUPPORTED), and the imagination policy's constants on
the observations' device. The CUDA check is patched, so every path runs on
any machine; tests/test_world_model_cuda.py runs the real thing on a GPU."""

from __future__ import annotations

import pytest
import torch
from structlog.testing import capture_logs

from agents.tasks.builtin import pendulum
from agents.tasks.torch_policy import BatchedPolicy, clamp_projection
from genesis_fp16.base.device import DeviceUnavailableError, resolve_device
from genesis_fp16.training.guarded import UNGUARDED
from genesis_fp16.base.settings import OnUnsupported, SettingsError, load_settings
from infrastructure.world_model import WorldModel


@pytest.mark.parametrize(
    "value, expected", [("auto", "auto"), ("CPU", "cpu"), (" cuda ", "cuda"), ("cuda:3", "cuda:3")]
)
def test_the_device_setting_takes_auto_cpu_cuda_and_an_index(monkeypatch, value, expected):
    monkeypatch.setenv("GENESIS_FP16_DEVICE", value)
    assert load_settings().device == expected


@pytest.mark.parametrize("value", ["gpu", "cuda:", "cuda:x", "mps", "cpu:0"])
def test_another_device_name_is_a_settings_error(monkeypatch, value):
    monkeypatch.setenv("GENESIS_FP16_DEVICE", value)
    with pytest.raises(
        SettingsError, match=rf"GENESIS_FP16_DEVICE='{value}': allowed values are auto, cpu, cuda or cuda:N"
    ):
        load_settings()


def test_the_default_is_auto_which_is_the_cpu_without_cuda(monkeypatch):
    monkeypatch.delenv("GENESIS_FP16_DEVICE")  # the tests' own cpu (conftest)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert load_settings().device == "auto"
    assert resolve_device("auto", OnUnsupported.ERROR, owner="t").device == torch.device("cpu")
    wm = WorldModel(3, 1, guard=UNGUARDED)
    assert wm.device == torch.device("cpu") and next(wm.model.parameters()).device.type == "cpu"


def test_cuda_without_cuda_is_one_clear_error_under_on_unsupported_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("GENESIS_FP16_ON_UNSUPPORTED", "error")
    assert load_settings().device == "cpu"  # the tests' own (conftest): a device="cuda" argument wins over it
    with pytest.raises(
        DeviceUnavailableError,
        match=r"WorldModel\('world_model'\): device 'cuda' is not available: torch sees no CUDA.*GENESIS_FP16_DEVICE",
    ):
        WorldModel(3, 1, guard=UNGUARDED, device="cuda")
    monkeypatch.setenv("GENESIS_FP16_DEVICE", "cuda:0")  # from the setting as well
    with pytest.raises(DeviceUnavailableError, match=r"device 'cuda:0' is not available"):
        WorldModel(3, 1, guard=UNGUARDED)


def test_cuda_without_cuda_falls_back_to_the_cpu_with_a_logged_reason(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("GENESIS_FP16_DEVICE", "cuda")  # on_unsupported: fallback, the default
    with capture_logs() as logs:
        wm = WorldModel(3, 1, guard=UNGUARDED)
    assert wm.device == torch.device("cpu")
    events = [log for log in logs if log["event"] == "world_model.device_fallback"]
    assert len(events) == 1 and events[0]["log_level"] == "warning"
    assert (
        events[0]["requested"] == "cuda"
        and events[0]["device"] == "cpu"
        and "torch sees no CUDA" in events[0]["reason"]
    )


def test_a_gpu_index_past_the_last_gpu_is_not_there(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(
        DeviceUnavailableError,
        match=r"device 'cuda:2' is not available: torch sees 2 CUDA device\(s\), numbered 0 to 1",
    ):
        resolve_device("cuda:2", OnUnsupported.ERROR, owner="WorldModel")
    fallback = resolve_device("cuda:5", OnUnsupported.FALLBACK, owner="WorldModel")
    assert fallback.device == torch.device("cpu") and "numbered 0 to 1" in fallback.fallback_reason
    assert resolve_device("cuda:1", OnUnsupported.ERROR, owner="WorldModel").device == torch.device("cuda:1")


def test_a_bad_device_argument_is_a_value_error():
    with pytest.raises(
        ValueError, match=r"WorldModel\('world_model'\): device='tpu': expected auto, cpu, cuda or cuda:N"
    ):
        WorldModel(3, 1, guard=UNGUARDED, device="tpu")


def test_the_policy_and_the_projection_follow_the_observations_device():
    """The meta device stands in for a GPU: nothing is computed, but a
    constant left on the CPU would fail to combine with it."""
    spec = pendulum().resolve().policy
    policy = BatchedPolicy(spec)
    params = torch.zeros(2, spec.n_params, device="meta")
    obs = torch.zeros(2, 5, spec.obs_dim, device="meta")
    assert policy(params, obs).device.type == "meta"
    cpu_params, cpu_obs = torch.zeros(2, spec.n_params), torch.zeros(2, 5, spec.obs_dim)
    assert policy(cpu_params, cpu_obs).device.type == "cpu"  # each device's copy is kept
    project = clamp_projection((-1.0, -1.0, -8.0), (1.0, 1.0, 8.0))
    assert project(obs).device.type == "meta" and project(cpu_obs).device.type == "cpu"

import pytest
import torch
from structlog.testing import capture_logs

from genesis_fp16 import precision as P
from genesis_fp16.settings import PrecisionMode


def test_auto_on_cuda_is_fp16_with_scaler_reason():
    mode, reason = P.auto_precision(torch.device("cuda"))
    assert mode == PrecisionMode.FP16 and "scaler" in reason


def test_auto_on_cpu_with_native_bf16(monkeypatch):
    monkeypatch.setattr(P, "cpu_flags", lambda: frozenset({"avx512_bf16", "amx_bf16"}))
    assert P.auto_precision("cpu")[0] == PrecisionMode.BF16


def test_auto_on_cpu_without_native_bf16_is_fp32(monkeypatch):
    monkeypatch.setattr(P, "cpu_flags", lambda: frozenset({"avx2"}))
    mode, reason = P.auto_precision("cpu")
    assert mode == PrecisionMode.FP32 and reason


def test_auto_logs_its_reason_once(monkeypatch):
    monkeypatch.setattr(P, "cpu_flags", lambda: frozenset({"avx512_bf16", "amx_bf16"}))
    with capture_logs() as logs:
        for _ in range(3):
            chosen = P.resolve_precision("auto", "cpu")
    events = [log for log in logs if log["event"] == "precision.auto_selected"]
    assert len(events) == 1 and events[0]["precision"] == "bf16" and events[0]["reason"]
    assert isinstance(chosen, P.BF16Mixed)


def test_cpu_support_table(monkeypatch):
    monkeypatch.setattr(P, "cpu_flags", lambda: frozenset({"avx2"}))
    assert P.device_support("cpu", PrecisionMode.BF16) == P.Support.SLOW
    assert P.device_support("cpu", PrecisionMode.FP16) == P.Support.SLOW
    assert P.device_support("cpu", PrecisionMode.FP32) == P.Support.NATIVE


def test_avx512_bf16_without_amx_is_slow_and_auto_stays_fp32(monkeypatch):
    # measured on such a CPU: BF16 autocast 0.66-0.74x FP32 at every bench size
    monkeypatch.setattr(P, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16", "avx512_fp16"}))
    assert P.cpu_has_native_bf16() and not P.cpu_has_fast_bf16()
    assert P.device_support("cpu", PrecisionMode.BF16) == P.Support.SLOW
    mode, reason = P.auto_precision("cpu")
    assert mode == PrecisionMode.FP32 and "AMX" in reason
    with capture_logs() as logs:
        chosen = P.resolve_precision("bf16", "cpu")  # asked for explicitly: runs, and says why it is slow
    assert isinstance(chosen, P.BF16Mixed)
    slow = [log for log in logs if log["event"] == "precision.slow_on_device"]
    assert len(slow) == 1 and "no AMX" in slow[0]["reason"]


def test_cuda_without_bf16_is_unsupported(monkeypatch):
    monkeypatch.setattr(P, "cuda_supports_bf16", lambda d: False)
    assert P.device_support("cuda", PrecisionMode.BF16) == P.Support.NONE
    assert P.device_support("cuda", PrecisionMode.FP16) == P.Support.NATIVE


def test_modes_give_contexts_and_scalers():
    fp32, fp16, bf16 = (P.MODES[m]("cpu") for m in (PrecisionMode.FP32, PrecisionMode.FP16, PrecisionMode.BF16))
    assert not fp32.make_scaler().is_enabled() and not bf16.make_scaler().is_enabled()
    assert fp16.make_scaler().is_enabled()
    x = torch.randn(4, 4)
    with fp16.autocast():
        assert (x @ x).dtype == torch.float16
    with bf16.autocast():
        assert (x @ x).dtype == torch.bfloat16
    with fp32.autocast():
        assert (x @ x).dtype == torch.float32


def test_scaler_options_named_as_torch_names_them():
    opts = P.ScalerOptions(init_scale=128.0, growth_factor=4.0, backoff_factor=0.25, growth_interval=400)
    scaler = P.FP16Mixed("cpu", opts).make_scaler()
    assert scaler.get_scale() == 128.0
    assert scaler.get_growth_factor() == 4.0 and scaler.get_backoff_factor() == 0.25
    assert scaler.get_growth_interval() == 400


def test_bad_mode_string_lists_choices():
    with pytest.raises(ValueError, match="auto, fp16, bf16, fp32"):
        P.resolve_precision("half", "cpu")


def test_capability_report_shape():
    rep = P.capability_report("cpu")
    assert set(rep["support"]) == {"fp32", "fp16", "bf16"}
    assert rep["auto_precision"] in {"fp32", "bf16"} and rep["auto_reason"]

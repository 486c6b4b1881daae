import pytest
import torch
from tf32_probe import RecordMatmulPrecision
from structlog.testing import capture_logs

from genesis_fp16.base.errors import UnsupportedPrecisionError
from genesis_fp16.precision.capability import (
    Support,
    auto_precision,
    cpu_has_fast_bf16,
    cpu_has_native_bf16,
    device_support,
    unsupported_reason,
)
from genesis_fp16.precision.modes import (
    AT_LEAST_AS_PRECISE,
    FP32_WEIGHT_MODES,
    MODES,
    capability_report,
    fallback_for,
    supported_modes,
)
from genesis_fp16.precision.plugins import BF16Mixed, FP16Mixed, HalfTrue, TF32
from genesis_fp16.precision.decision import decide
from genesis_fp16.precision.request import PrecisionRequest
from genesis_fp16.precision import capability as C
from genesis_fp16.base.settings import PrecisionConfig, PrecisionMode
from genesis_fp16.training.trainer import FP16TrainingConfig


def plugin_for(requested, device, on_unsupported="fallback", config=None, *, plugins=MODES):
    """The plugin a trainer asked for ``requested`` on ``device`` runs: the request decided by the one decision
    (``auto``: the flag rule), its mode's class from ``plugins``."""
    request = PrecisionRequest.parse(requested, on_unsupported=on_unsupported)
    return plugins[decide(request, device).mode](device, config)


def test_auto_on_cuda_is_fp16_with_scaler_reason():
    mode, reason = auto_precision(torch.device("cuda"))
    assert mode == PrecisionMode.FP16 and "scaler" in reason


def test_auto_on_cpu_with_native_bf16(monkeypatch):
    monkeypatch.setattr(C, "cpu_flags", lambda: frozenset({"avx512_bf16", "amx_bf16"}))
    assert auto_precision("cpu")[0] == PrecisionMode.BF16


def test_auto_on_cpu_without_native_bf16_is_fp32(monkeypatch):
    monkeypatch.setattr(C, "cpu_flags", lambda: frozenset({"avx2"}))
    mode, reason = auto_precision("cpu")
    assert mode == PrecisionMode.FP32 and reason


def test_auto_logs_its_decision_once(monkeypatch):
    from genesis_fp16.precision.decision import Source, decide

    monkeypatch.setattr(C, "cpu_flags", lambda: frozenset({"avx512_bf16", "amx_bf16"}))
    with capture_logs() as logs:
        for _ in range(3):
            chosen = decide(FP16TrainingConfig(precision="auto").request, "cpu")
    events = [log for log in logs if log["event"] == "precision.auto_selected"]
    assert len(events) == 1 and events[0]["precision"] == "bf16" and events[0]["source"] == "rule"
    assert chosen.mode == PrecisionMode.BF16 and chosen.source == Source.RULE and "rule (not measured)" in chosen.reason
    assert isinstance(plugin_for("auto", "cpu"), BF16Mixed)


def test_cpu_support_table(monkeypatch):
    monkeypatch.setattr(C, "cpu_flags", lambda: frozenset({"avx2"}))
    assert device_support("cpu", PrecisionMode.BF16) == Support.SLOW
    assert device_support("cpu", PrecisionMode.FP16) == Support.SLOW
    assert device_support("cpu", PrecisionMode.FP32) == Support.NATIVE


def test_avx512_bf16_without_amx_is_slow_and_auto_stays_fp32(monkeypatch):
    # measured on such a CPU: BF16 autocast 0.66-0.74x FP32 at every bench size
    monkeypatch.setattr(C, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16", "avx512_fp16"}))
    assert cpu_has_native_bf16() and not cpu_has_fast_bf16()
    assert device_support("cpu", PrecisionMode.BF16) == Support.SLOW
    mode, reason = auto_precision("cpu")
    assert mode == PrecisionMode.FP32 and "AMX" in reason
    with capture_logs() as logs:
        chosen = plugin_for("bf16", "cpu")  # asked for explicitly: runs
    assert isinstance(chosen, BF16Mixed)
    # issue 37: unmeasured, no slow_on_device warning (a measurement decides that, tests/test_decision.py)
    assert not [log for log in logs if log["event"] == "precision.slow_on_device"]


def test_cuda_without_bf16_is_unsupported(monkeypatch):
    monkeypatch.setattr(C, "cuda_supports_bf16", lambda d: False)
    assert device_support("cuda", PrecisionMode.BF16) == Support.NONE
    assert device_support("cuda", PrecisionMode.FP16) == Support.NATIVE


def test_modes_give_contexts_and_scalers():
    fp32, fp16, bf16 = (MODES[m]("cpu") for m in (PrecisionMode.FP32, PrecisionMode.FP16, PrecisionMode.BF16))
    assert not fp32.make_scaler().is_enabled() and not bf16.make_scaler().is_enabled()
    assert fp16.make_scaler().is_enabled()
    x = torch.randn(4, 4)
    with fp16.forward_context():
        assert (x @ x).dtype == torch.float16
    with bf16.forward_context():
        assert (x @ x).dtype == torch.bfloat16
    with fp32.forward_context():
        assert (x @ x).dtype == torch.float32


def test_scaler_options_named_as_torch_names_them():
    config = PrecisionConfig(init_scale=128.0, growth_factor=4.0, backoff_factor=0.25, growth_interval=400)
    plugin = FP16Mixed("cpu", config)
    assert plugin.scaler_kwargs == config.scaler_kwargs()
    scaler = plugin.make_scaler()
    assert scaler.get_scale() == 128.0
    assert scaler.get_growth_factor() == 4.0 and scaler.get_backoff_factor() == 0.25
    assert scaler.get_growth_interval() == 400


def test_bad_mode_string_lists_choices():
    with pytest.raises(ValueError, match="auto, fp16, bf16, fp32"):
        plugin_for("half", "cpu")


def test_capability_report_shape():
    rep = capability_report("cpu")
    assert set(rep["support"]) == {"fp32", "tf32", "fp16", "bf16", "fp16-true"}
    assert rep["support"]["tf32"] == "none" and "tf32" not in supported_modes("cpu")
    assert rep["auto_precision"] in {"fp32", "bf16"} and rep["auto_reason"]


# -- one vocabulary ------------------------------------------------------------


def test_modes_cover_the_vocabulary_and_auto_never_picks_tf32_or_fp16_true(monkeypatch):
    assert set(MODES) == set(PrecisionMode) - {PrecisionMode.AUTO}
    assert {cls.name for cls in MODES.values()} == {m.value for m in MODES}
    assert [m.value for m in FP32_WEIGHT_MODES] == ["fp32", "tf32", "bf16", "fp16"]
    monkeypatch.setattr(C, "cuda_supports_tf32", lambda d: True)
    for flags in (frozenset(), frozenset({"avx512_bf16"}), frozenset({"amx_bf16"})):
        monkeypatch.setattr(C, "cpu_flags", lambda flags=flags: flags)
        for device in ("cpu", "cuda", "meta"):
            assert auto_precision(device)[0] not in (PrecisionMode.TF32, PrecisionMode.FP16_TRUE)


def test_resolve_precision_builds_from_the_given_plugins():
    class Custom(FP16Mixed):
        pass

    plugins = dict(MODES, **{PrecisionMode.FP16: Custom})
    assert type(plugin_for("fp16", "cpu", plugins=plugins)) is Custom
    assert type(plugin_for("bf16", "cpu", plugins=plugins)) is BF16Mixed


# -- plugin hooks -------------------------------------------------------------------


def _linear_step(precision, grad_scale=1.0):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with precision.forward_context():
        loss = model(torch.ones(2, 3)).float().sum() * grad_scale
    precision.backward(loss)
    precision.unscale_(opt)
    before = [p.detach().clone() for p in model.parameters()]
    stepped = precision.optimizer_step(opt)
    changed = any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    return model, stepped, changed


@pytest.mark.parametrize("mode", [PrecisionMode.FP32, PrecisionMode.BF16])
def test_modes_without_a_scaler_are_plain_torch(mode):
    precision = MODES[mode]("cpu")
    model, stepped, changed = _linear_step(precision)
    assert stepped and changed
    assert precision.scale == 1.0 and precision.state_dict() == {}
    assert not precision.uses_scaler and not precision.scaler.is_enabled()
    precision.load_state_dict({})


def test_fp16_owns_its_scaler_and_detects_overflow():
    precision = FP16Mixed("cpu", PrecisionConfig(init_scale=1024.0))
    model, stepped, changed = _linear_step(precision)
    assert stepped and changed and precision.scale == 1024.0
    # the unscaled gradient is the true gradient: d(sum(Wx+b))/db = batch size
    assert model.bias.grad.item() == pytest.approx(2.0)
    _, stepped, changed = _linear_step(precision, grad_scale=float("inf"))
    assert stepped is False and not changed and precision.scale == 512.0
    state = precision.state_dict()
    restored = FP16Mixed("cpu")
    restored.load_state_dict(state)
    assert restored.scale == 512.0 and restored.scaler.get_scale() == 512.0
    fresh = FP16Mixed("cpu", PrecisionConfig(init_scale=64.0))
    fresh.load_state_dict({})  # a checkpoint saved without a scaler keeps the fresh one
    assert fresh.scale == 64.0


def test_make_scaler_is_the_override_point():
    class Quiet(torch.amp.GradScaler):
        pass

    class Variant(FP16Mixed):
        def make_scaler(self):
            return Quiet(self.device.type, init_scale=self.scaler_kwargs["init_scale"])

    precision = Variant("cpu", PrecisionConfig(init_scale=8.0))
    assert isinstance(precision.scaler, Quiet) and precision.scale == 8.0


def test_autocast_is_an_alias_of_forward_context():
    x = torch.randn(2, 2)
    with FP16Mixed("cpu").forward_context():
        assert (x @ x).dtype == torch.float16


def test_tf32_switches_are_on_for_forward_and_backward_only():
    precision = TF32("cuda")
    before = (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.fp32_precision)
    RecordMatmulPrecision.seen = []
    x = torch.ones(2, requires_grad=True)
    with precision.forward_context():
        loss = RecordMatmulPrecision.apply(x).sum()
    assert (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.fp32_precision) == before
    precision.backward(loss)
    assert RecordMatmulPrecision.seen == [("forward", "tf32"), ("backward", "tf32")]
    assert (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.fp32_precision) == before
    assert precision.compute_dtype == torch.float32 and not precision.uses_scaler


@pytest.mark.parametrize(
    "flags",
    [frozenset({"avx2"}), frozenset({"avx512_bf16"}), frozenset({"avx512_bf16", "amx_bf16"})],
    ids=["avx2", "avx512-bf16", "amx"],
)
def test_tf32_is_unsupported_on_cpu_and_follows_on_unsupported(monkeypatch, flags):
    # on every CPU kind: with AMX, auto is bf16, and a fallback to "the best
    # supported" would have given BF16 autocast for a request of near-FP32 matmuls
    monkeypatch.setattr(C, "cpu_flags", lambda: flags)
    assert device_support("cpu", PrecisionMode.TF32) == Support.NONE
    with capture_logs() as logs:
        chosen = plugin_for("tf32", "cpu")
    assert chosen.name == "fp32"
    fallback = [log for log in logs if log["event"] == "precision.fallback"]
    assert fallback and fallback[0]["requested"] == "tf32" and "CUDA" in fallback[0]["reason"]
    with pytest.raises(UnsupportedPrecisionError, match="tf32.*not supported on cpu.*CUDA"):
        plugin_for("tf32", "cpu", on_unsupported="error")
    monkeypatch.setattr(C, "cuda_supports_tf32", lambda d: True)
    assert device_support("cuda", PrecisionMode.TF32) == Support.NATIVE
    monkeypatch.setattr(C, "cuda_supports_tf32", lambda d: False)
    assert "compute capability" in unsupported_reason("cuda", PrecisionMode.TF32)


def test_fp16_true_converts_the_weights_and_trains_without_a_scaler():
    precision = plugin_for("fp16-true", "cpu")
    assert isinstance(precision, HalfTrue) and not precision.scaler.is_enabled()
    model = precision.convert_module(torch.nn.Linear(3, 1))
    assert all(p.dtype == torch.float16 for p in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with precision.forward_context():  # FP32 inputs meet FP16 weights
        loss = model(torch.ones(2, 3)).float().sum()
    precision.backward(loss)
    assert precision.optimizer_step(opt) is True and precision.state_dict() == {}


@pytest.mark.parametrize("mode", ["fp32", "bf16", "fp16"])
def test_fp32_weight_modes_cast_fp16_true_weights_back(mode, tmp_path):
    """A rollback from fp16-true rebuilds the trainer in an FP32-weight mode
    over the same model and optimizer: the weights (and, once a checkpoint is
    restored, the optimizer's moments) are FP32 again and training goes on."""
    from genesis_fp16.training.registry import create_trainer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    batch = (torch.randn(8, 3), torch.randn(8, 1))

    def loss_fn(m, b):
        return ((m(b[0]).float() - b[1]) ** 2).mean()

    half = create_trainer("auto", model, opt, FP16TrainingConfig(precision="fp16-true", enabled=True))
    assert all(p.dtype == torch.float16 for p in model.parameters())
    half.backward_and_step(half.training_step(batch, loss_fn))
    good = half.save_checkpoint(tmp_path / "good.pt")
    params = list(model.parameters())
    rebuilt = create_trainer(mode, model, opt, FP16TrainingConfig())
    assert rebuilt.precision.name == mode
    assert [id(p) for p in model.parameters()] == [id(p) for p in params]  # the optimizer still holds them
    assert all(p.dtype == torch.float32 for p in model.parameters())
    rebuilt.load_checkpoint(good)
    assert all(v.dtype == torch.float32 for s in opt.state.values() for k, v in s.items() if k != "step")
    assert rebuilt.backward_and_step(rebuilt.training_step(batch, loss_fn))


@pytest.mark.parametrize("flags", [frozenset({"avx2"}), frozenset({"avx512_bf16", "amx_bf16"})], ids=["avx2", "amx"])
def test_fallback_is_never_less_precise_than_asked(monkeypatch, flags):
    monkeypatch.setattr(C, "cpu_flags", lambda: flags)
    monkeypatch.setattr(C, "cuda_supports_bf16", lambda d: False)
    monkeypatch.setattr(C, "cuda_supports_tf32", lambda d: False)
    # a CUDA device without BF16 or TF32: bf16 becomes fp32 (not fp16, another format), tf32 fp32
    assert fallback_for("cuda", PrecisionMode.BF16) == PrecisionMode.FP32
    assert fallback_for("cuda", PrecisionMode.TF32) == PrecisionMode.FP32
    assert plugin_for("tf32", "cpu").name == "fp32"
    # every fallback is the mode itself or a mode at least as precise
    order = [PrecisionMode.FP32, PrecisionMode.TF32, PrecisionMode.BF16, PrecisionMode.FP16, PrecisionMode.FP16_TRUE]
    for mode in MODES:
        assert set(AT_LEAST_AS_PRECISE[mode]) <= set(order[: order.index(mode)] + [PrecisionMode.FP32])
        assert fallback_for("cpu", mode) in AT_LEAST_AS_PRECISE[mode] + (PrecisionMode.FP32,)


def test_fp16_true_falls_back_to_fp16_mixed_where_fp16_runs(monkeypatch):
    real = C.device_support
    monkeypatch.setattr(C, "device_support", lambda d, m: Support.NONE if m == PrecisionMode.FP16_TRUE else real(d, m))
    with capture_logs() as logs:
        chosen = plugin_for("fp16-true", "cpu")
    assert chosen.name == "fp16"  # FP32 master weights: more precise than FP16 weights
    assert any(log["event"] == "precision.fallback" and log["precision"] == "fp16" for log in logs)

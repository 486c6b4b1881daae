from types import SimpleNamespace

import pytest
import torch

from genesis_fp16 import FP16Trainer, FP16TrainingConfig
from genesis_fp16.training import registry
from genesis_fp16.base.settings import load_settings


def model_opt():
    model = torch.nn.Linear(3, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_builtin_names_listed():
    names = set(registry.available())
    assert {"auto", "fp32", "fp16", "bf16"} <= names


@pytest.mark.parametrize("name", ["fp32", "fp16", "bf16"])
def test_factory_forces_precision_without_mutating_config(name):
    cfg = FP16TrainingConfig(precision="auto")
    trainer = registry.create_trainer(name, *model_opt(), cfg)
    assert trainer.precision.name == name
    assert cfg.precision == "auto"


def test_unknown_trainer_lists_choices():
    with pytest.raises(registry.UnknownTrainerError) as info:
        registry.create_trainer("fp8", *model_opt())
    assert "fp8" in str(info.value) and "fp16" in str(info.value)


def test_entry_point_plugin_is_registered(monkeypatch):
    def plugin_factory(model, optimizer, config=None, scheduler=None, **kw):
        """A third-party trainer."""
        return FP16Trainer(model, optimizer, FP16TrainingConfig(precision="fp32"), scheduler, **kw)

    fake_ep = SimpleNamespace(name="thirdparty", value="pkg.mod:factory", load=lambda: plugin_factory)
    monkeypatch.setattr(
        registry.metadata, "entry_points", lambda group: [fake_ep] if group == registry.ENTRY_POINT_GROUP else []
    )
    monkeypatch.setattr(registry, "_ENTRY_POINTS_LOADED", False)
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    specs = registry.available()
    assert specs["thirdparty"].source == "entry point pkg.mod:factory"
    assert registry.create_trainer("thirdparty", *model_opt()).precision.name == "fp32"


def test_concurrent_first_lookups_both_see_the_plugin(monkeypatch):
    # the loaded flag was set before the plugins were registered: a second thread
    # looking a plugin up meanwhile got UnknownTrainerError
    import threading
    import time

    def slow_load():
        time.sleep(0.3)
        return lambda model, optimizer, config=None, scheduler=None, **kw: FP16Trainer(
            model, optimizer, config, scheduler, **kw
        )

    fake_ep = SimpleNamespace(name="slowplugin", value="pkg:slow", load=slow_load)
    monkeypatch.setattr(
        registry.metadata, "entry_points", lambda group: [fake_ep] if group == registry.ENTRY_POINT_GROUP else []
    )
    monkeypatch.setattr(registry, "_ENTRY_POINTS_LOADED", False)
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    errors = []

    def lookup():
        try:
            registry.get("slowplugin")
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=lookup) for _ in range(2)]
    threads[0].start()
    time.sleep(0.05)
    threads[1].start()
    for t in threads:
        t.join()
    assert errors == []


def test_broken_plugin_does_not_hide_builtins(monkeypatch):
    def boom():
        raise ImportError("missing dependency")

    fake_ep = SimpleNamespace(name="broken", value="pkg:nope", load=boom)
    monkeypatch.setattr(registry.metadata, "entry_points", lambda group: [fake_ep])
    monkeypatch.setattr(registry, "_ENTRY_POINTS_LOADED", False)
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    names = registry.available()
    assert "broken" not in names and "fp16" in names


def test_trainer_for_follows_settings(monkeypatch):
    monkeypatch.setenv("GENESIS_FP16_PRECISION", "fp16")
    resolved = registry.resolve_trainer("agent-a", *model_opt())
    trainer = resolved.trainer
    assert trainer.precision.name == "fp16"
    assert trainer.name == "agent-a"
    assert resolved.policy.sources["precision"] == "settings"
    assert (
        registry.trainer_for("agent-a", *model_opt()).precision.name == "fp16"
    )  # the same trainer, without its policy


def test_trainer_for_explicit_argument_beats_settings(monkeypatch):
    monkeypatch.setenv("GENESIS_FP16_PRECISION", "fp16")
    resolved = registry.resolve_trainer("agent-a", *model_opt(), precision="bf16")
    assert resolved.trainer.precision.name == "bf16"
    assert resolved.policy.sources["precision"] == "argument"


def test_kill_switch_wins_over_explicit_argument(monkeypatch):
    monkeypatch.setenv("ENABLE_FP16_TRAINING", "false")
    resolved = registry.resolve_trainer("agent-a", *model_opt(), precision="fp16")
    assert resolved.trainer.precision.name == "fp32"
    assert "kill switch" in resolved.policy.sources["enabled"]


def test_trainer_for_passes_scaler_settings(monkeypatch):
    settings = load_settings(precision="fp16", init_scale=1024.0, growth_interval=7)
    trainer = registry.trainer_for("agent-a", *model_opt(), settings=settings)
    assert trainer.current_scale == 1024.0
    assert trainer.scaler.get_growth_interval() == 7


def test_ddp_and_fsdp_are_listed_without_importing_torch_distributed_trainers():
    import subprocess
    import sys

    code = (
        "import sys; from genesis_fp16.training import registry; names = registry.available(); "
        "print('ddp' in names and 'fsdp' in names, any(m.startswith('genesis_fp16.distributed') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["True", "False"], out.stderr


def test_lazy_builtin_resolves_on_first_use():
    from genesis_fp16 import distributed

    assert registry.get("ddp").factory.resolve() == distributed.DDPTrainer.create
    assert registry.get("fsdp").factory.resolve() == distributed.FSDPTrainer.create


def test_lazy_factory_that_cannot_load_says_which():
    factory = registry.LazyFactory("genesis_fp16.no_such_module:create")
    with pytest.raises(ImportError, match="genesis_fp16.no_such_module:create"):
        factory(*model_opt())


def test_policy_shows_the_precision_that_runs_and_keeps_the_request(monkeypatch):
    monkeypatch.setenv("GENESIS_FP16_PRECISION", "auto")
    resolved = registry.resolve_trainer("agent-a", *model_opt())
    trainer, policy = resolved.trainer, resolved.policy
    assert policy.precision == "auto" and policy.precision.mode.value == "auto"  # the request, kept as asked
    assert policy.running == trainer.precision.name == trainer.get_stats()["precision"] != "auto"
    shown = policy.as_dict()
    assert (
        shown["precision"] == trainer.precision.name
        and shown["requested"] == "auto"
        and shown["running"] == trainer.precision.name
    )


def test_the_policy_is_declared_beside_the_trainer_not_patched_onto_it():
    resolved = registry.resolve_trainer("agent-a", *model_opt(), precision="bf16")
    assert not hasattr(resolved.trainer, "policy")
    assert resolved.policy.agent == "agent-a" and resolved.policy.running == "bf16"

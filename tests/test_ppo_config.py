"""PPO config: YAML, --set overrides, one clear error per bad value."""

from __future__ import annotations

from pathlib import Path

import warnings

import pytest

from agents.ppo.config import ConfigError, Optimizations, PPOConfig, load_config

BASE = Path(__file__).resolve().parents[1] / "configs" / "base.yaml"

OPTIMIZATION_KEYS = {
    "use_subproc_vec_env",
    "force_dummy_vec_env",
    "precision",
    "use_torch_compile",
    "compile_mode",
    "use_pinned_memory",
    "num_workers",
    "batch_inference",
    "inference_batch_size",
    "action_repeat",
    "vec_env",
    "cpu_fast_path",
}


def test_base_yaml_has_every_optimization_key_and_loads():
    import yaml

    data = yaml.safe_load(BASE.read_text())
    assert set(data["training"]["optimizations"]) == OPTIMIZATION_KEYS
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # base.yaml uses no deprecated key
        cfg = load_config(BASE)
    assert (cfg.num_envs, cfg.num_steps, cfg.update_epochs, cfg.minibatch_size) == (8, 128, 4, 256)
    assert cfg.optimizations.vec_env == "auto"


def test_set_overrides_parse_types_and_nest():
    cfg = load_config(BASE, ["optimizations.precision=BF16", "training.learning_rate=1e-3", "action_repeat=3"])
    assert cfg.optimizations.precision == "bf16"
    assert cfg.learning_rate == pytest.approx(1e-3) and cfg.optimizations.action_repeat == 3
    assert load_config(None, ["learning_rate=1"]).learning_rate == 1.0  # int -> float for float fields


@pytest.mark.parametrize(
    "override, key",
    [
        ("optimizations.precision=float16", "precision"),
        ("optimizations.precision=fp16-true", "precision"),
        ("optimizations.precision=tf32", "precision"),
        ("optimizations.compile_mode=fast", "compile_mode"),
        ("optimizations.vec_env=threads", "vec_env"),
        ("optimizations.action_repeat=0", "action_repeat"),
        ("optimizations.inference_batch_size=-1", "inference_batch_size"),
        ("optimizations.num_workers=1.5", "num_workers"),
        ("gamma=1.5", "gamma"),
        ("minibatch_size=5000", "minibatch_size"),
        ("minibatch_size=1", "minibatch_size"),  # with norm_adv (the default): NaN advantages
        ("device=tpu", "device"),
        ("no_such_key=1", "no_such_key"),
    ],
)
def test_invalid_values_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key):
        load_config(BASE, [override])


def test_precision_takes_the_modes_the_update_runs_in():
    for mode in ("fp32", "fp16", "bf16", "auto"):  # auto: measured at the first update (tests/test_calibration.py)
        assert load_config(None, [f"precision={mode}"]).optimizations.precision == mode
    assert load_config(None).optimizations.precision == "fp32"
    with pytest.raises(ConfigError, match="expected one of fp32, fp16, bf16, auto"):
        load_config(None, ["precision=tf32"])


@pytest.mark.parametrize(
    "override",
    ["use_amp=true", "optimizations.use_amp=false", "amp_dtype=bfloat16", "training.optimizations.amp_dtype=float16"],
)
def test_the_removed_amp_keys_are_an_error_naming_precision(tmp_path, override):
    import yaml

    with pytest.raises(ConfigError, match=r"was removed; use training\.optimizations\.precision"):
        load_config(None, [override])
    key, value = override.split("=")
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump({"training": {"optimizations": {key.split(".")[-1]: yaml.safe_load(value)}}}))
    with pytest.raises(ConfigError, match="precision"):
        load_config(old)


def test_conflicting_vec_env_flags_are_one_error():
    with pytest.raises(ConfigError, match="force_dummy_vec_env"):
        load_config(None, ["force_dummy_vec_env=true", "vec_env=async"])


def test_bad_file_and_missing_equals(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("training: [1, 2]\n")
    with pytest.raises(ConfigError, match="training"):
        load_config(bad)
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["precision"])


def test_every_field_has_a_docstring():
    import inspect

    for cls in (PPOConfig, Optimizations):
        src = inspect.getsource(cls)
        for name in cls.__dataclass_fields__:
            line = next(i for i, text in enumerate(src.splitlines()) if text.strip().startswith(f"{name}:"))
            assert src.splitlines()[line + 1].strip().startswith('"""'), f"{cls.__name__}.{name} has no docstring"


def test_yaml_file_accepts_exponent_floats_without_a_dot(tmp_path):
    # YAML 1.1 (PyYAML) reads 3e-4 as a string; --set already coerced it, the file must too
    path = tmp_path / "c.yaml"
    path.write_text("training:\n  learning_rate: 3e-4\n  target_kl: 1e-2\n  ent_coef: 1e-3\n")
    cfg = load_config(path)
    assert cfg.learning_rate == pytest.approx(3e-4) and cfg.target_kl == pytest.approx(1e-2)
    assert cfg.ent_coef == pytest.approx(1e-3)


@pytest.mark.parametrize("device", ["cuda:abc", "cudax", "cuda:"])
def test_malformed_cuda_device_is_a_config_error(device):
    with pytest.raises(ConfigError, match="device"):
        load_config(None, [f"device={device}"])
    assert load_config(None, ["device=cuda:1"]).device == "cuda:1"


@pytest.mark.parametrize(
    "override", ["ent_coef=nan", "vf_coef=nan", "ent_coef=.inf", "vf_coef=.inf", "learning_rate=.inf"]
)
def test_non_finite_coefficients_are_rejected(override):
    with pytest.raises(ConfigError, match=override.split("=")[0]):
        load_config(None, [override])


def test_agents_ppo_imports_without_the_agents_extra_and_training_names_it():
    """``import agents.ppo`` needs neither gymnasium nor yaml; the modules that do
    raise MissingExtraError naming the extra, which the CLI prints as one line."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "sys.modules['gymnasium'] = None\n"
        "sys.modules['yaml'] = None\n"
        "import agents.ppo\n"
        "from genesis_fp16.base.extras import MissingExtraError\n"
        "try:\n"
        "    import agents.ppo.ppo\n"
        "except MissingExtraError as exc:\n"
        "    print(exc)\n"
        "try:\n"
        "    agents.ppo.load_config(None, ['seed=2'])\n"
        "except MissingExtraError as exc:\n"
        "    print(exc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2, proc.stdout
    assert "needs gymnasium" in lines[0] and "genesis-fp16[agents]" in lines[0]
    assert "needs yaml" in lines[1] and "genesis-fp16[agents]" in lines[1]

from pathlib import Path

import pytest

from genesis_fp16.settings import OnUnsupported, PrecisionMode, SettingsError, describe_settings, load_settings


def test_defaults(state_dir):
    s = load_settings()
    assert s.enable_fp16_training is True
    assert s.precision == PrecisionMode.AUTO
    assert s.on_unsupported == OnUnsupported.FALLBACK
    assert s.scaler_kwargs() == {"init_scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000}
    assert s.max_grad_norm == 1.0
    assert s.state_dir == Path(state_dir)


@pytest.mark.parametrize(
    "var,value,allowed",
    [
        ("ENABLE_FP16_TRAINING", "maybe", "true, false"),
        ("GENESIS_FP16_PRECISION", "fp8", "auto, fp16, bf16, fp32"),
        ("GENESIS_FP16_ON_UNSUPPORTED", "ignore", "fallback, error"),
        ("GENESIS_FP16_INIT_SCALE", "-1", "> 0"),
        ("GENESIS_FP16_GROWTH_FACTOR", "0.5", "> 1.0"),
        ("GENESIS_FP16_BACKOFF_FACTOR", "1.5", "< 1.0"),
        ("GENESIS_FP16_GROWTH_INTERVAL", "zero", ">= 1"),
        ("GENESIS_FP16_MAX_GRAD_NORM", "-3", "none"),
        ("GENESIS_FP16_LOG_FORMAT", "xml", "console, json"),
        ("GENESIS_FP16_LOG_LEVEL", "loud", "DEBUG, INFO, WARNING, ERROR"),
        ("GENESIS_FP16_DISTRIBUTED", "mpi", "none, ddp, fsdp"),
        # infinite values passed settings and failed later (init_scale) or not at all (growth_factor)
        ("GENESIS_FP16_INIT_SCALE", "inf", "finite"),
        ("GENESIS_FP16_GROWTH_FACTOR", "inf", "finite"),
        ("GENESIS_FP16_MAX_GRAD_NORM", "inf", "finite"),
        ("GENESIS_FP16_GROWTH_INTERVAL", "1.5", "an integer >= 1"),
    ],
)
def test_invalid_value_names_variable_value_and_allowed(monkeypatch, var, value, allowed):
    monkeypatch.setenv(var, value)
    with pytest.raises(SettingsError) as info:
        load_settings()
    message = str(info.value)
    assert var in message
    assert repr(value) in message
    assert allowed in message
    assert "\n" not in message


def test_max_grad_norm_none_disables(monkeypatch):
    monkeypatch.setenv("GENESIS_FP16_MAX_GRAD_NORM", "none")
    assert load_settings().max_grad_norm is None


def test_bool_spellings(monkeypatch):
    for text, expected in [("false", False), ("0", False), ("off", False), ("TRUE", True), ("yes", True)]:
        monkeypatch.setenv("ENABLE_FP16_TRAINING", text)
        assert load_settings().enable_fp16_training is expected


# -- precedence, pair by pair: init > env > .env > TOML file -----------------


@pytest.fixture
def sources(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def write(env=None, dotenv=None, toml=None):
        if dotenv is not None:
            (tmp_path / ".env").write_text(f"GENESIS_FP16_PRECISION={dotenv}\n")
        if toml is not None:
            (tmp_path / "genesis_fp16.toml").write_text(f'precision = "{toml}"\n')
        if env is not None:
            monkeypatch.setenv("GENESIS_FP16_PRECISION", env)

    return write


def test_init_beats_env(sources):
    sources(env="fp16")
    assert load_settings(precision="bf16").precision == PrecisionMode.BF16


def test_init_beats_dotenv(sources):
    sources(dotenv="fp16")
    assert load_settings(precision="bf16").precision == PrecisionMode.BF16


def test_init_beats_toml(sources):
    sources(toml="fp16")
    assert load_settings(precision="bf16").precision == PrecisionMode.BF16


def test_env_beats_dotenv(sources):
    sources(env="fp32", dotenv="fp16")
    assert load_settings().precision == PrecisionMode.FP32


def test_env_beats_toml(sources):
    sources(env="fp32", toml="fp16")
    assert load_settings().precision == PrecisionMode.FP32


def test_dotenv_beats_toml(sources):
    sources(dotenv="bf16", toml="fp16")
    assert load_settings().precision == PrecisionMode.BF16


def test_each_source_alone_is_read(sources):
    sources(toml="fp16")
    assert load_settings().precision == PrecisionMode.FP16
    sources(dotenv="bf16")
    assert load_settings().precision == PrecisionMode.BF16


def test_config_file_variable(tmp_path, monkeypatch):
    cfg = tmp_path / "custom.toml"
    cfg.write_text('growth_interval = 400\nprecision = "fp16"\n')
    monkeypatch.setenv("GENESIS_FP16_CONFIG_FILE", str(cfg))
    s = load_settings()
    assert s.growth_interval == 400 and s.precision == PrecisionMode.FP16


def test_missing_config_file_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("GENESIS_FP16_CONFIG_FILE", str(tmp_path / "nope.toml"))
    with pytest.raises(SettingsError, match="GENESIS_FP16_CONFIG_FILE"):
        load_settings()


def test_invalid_toml_value_is_reported(sources):
    sources(toml="fp64")
    with pytest.raises(SettingsError, match="GENESIS_FP16_PRECISION='fp64'"):
        load_settings()


def test_env_example_lists_every_setting():
    text = (Path(__file__).resolve().parents[1] / ".env.example").read_text()
    for row in describe_settings():
        assert row["env"] in text, row["env"]
    assert "GENESIS_FP16_CONFIG_FILE" in text


def test_no_getenv_outside_settings():
    root = Path(__file__).resolve().parents[1]
    offenders = []
    for path in list((root / "genesis_fp16").rglob("*.py")) + list((root / "agents").rglob("*.py")) + list((root / "infrastructure").rglob("*.py")):
        if path.name == "settings.py" and path.parent.name == "genesis_fp16":
            continue
        text = path.read_text()
        if "os.getenv(" in text or "os.environ.get(" in text or "os.environ[" in text:
            offenders.append(str(path.relative_to(root)))
    assert offenders == []

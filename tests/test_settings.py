from pathlib import Path

import pytest

from genesis_fp16.base.settings import OnUnsupported, PrecisionMode, SettingsError, describe_settings, load_settings


def test_defaults(state_dir):
    s = load_settings()
    assert s.enable_fp16_training is True
    assert s.precision == PrecisionMode.AUTO
    assert s.on_unsupported == OnUnsupported.FALLBACK
    assert s.scaler_kwargs() == {
        "init_scale": 65536.0,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 2000,
    }
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
        ("GENESIS_FP16_DEVICE", "gpu", "auto, cpu, cuda or cuda:N"),
        ("GENESIS_FP16_DEVICE", "cuda:-1", "auto, cpu, cuda or cuda:N"),
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


def test_env_example_lists_exactly_the_precision_modes():
    lines = (Path(__file__).resolve().parents[1] / ".env.example").read_text().splitlines()
    at = lines.index("GENESIS_FP16_PRECISION=auto")
    listed = lines[at - 1].removeprefix("#").split()[0].split("|")  # the comment right above the variable
    assert sorted(listed) == sorted(m.value for m in PrecisionMode)


def test_no_getenv_outside_settings():
    root = Path(__file__).resolve().parents[1]
    offenders = []
    for path in (
        list((root / "genesis_fp16").rglob("*.py"))
        + list((root / "agents").rglob("*.py"))
        + list((root / "infrastructure").rglob("*.py"))
    ):
        if path.name == "settings.py" and path.parent.name == "base" and path.parent.parent.name == "genesis_fp16":
            continue
        text = path.read_text()
        if "os.getenv(" in text or "os.environ.get(" in text or "os.environ[" in text:
            offenders.append(str(path.relative_to(root)))
    assert offenders == []


# -- files that cannot be read, lines that cannot be parsed, names that do not exist ----


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_non_utf8_dotenv_names_file_and_line(cwd):
    (cwd / ".env").write_bytes(b"GENESIS_FP16_PRECISION=fp16\nGENESIS_FP16_STATE_DIR=/tmp/caf\xe9\n")
    with pytest.raises(SettingsError) as err:
        load_settings()
    message = str(err.value)
    assert ".env:2:" in message and "UTF-8" in message and "\n" not in message


def test_unparseable_dotenv_line_names_file_and_line(cwd):
    (cwd / ".env").write_text("# settings\nGENESIS_FP16_PRECISION=fp16\nthis line is not an assignment\n")
    with pytest.raises(SettingsError) as err:
        load_settings()
    message = str(err.value)
    assert ".env:3:" in message and "this line is not an assignment" in message and "NAME=value" in message


def test_dotenv_with_other_programs_variables_is_fine(cwd):
    (cwd / ".env").write_text("export DATABASE_URL=postgres://x\n\nGENESIS_FP16_PRECISION=bf16\nPATH_EXTRA=\n")
    assert load_settings().precision == PrecisionMode.BF16


def test_misspelled_variable_in_environment_is_refused_with_a_suggestion(monkeypatch):
    monkeypatch.setenv("GENESIS_FP16_PRECISON", "bf16")
    with pytest.raises(SettingsError) as err:
        load_settings()
    message = str(err.value)
    assert "unknown setting GENESIS_FP16_PRECISON" in message and "environment" in message
    assert "did you mean GENESIS_FP16_PRECISION?" in message and "genesis-fp16 doctor" in message


def test_misspelled_variable_in_dotenv_names_file_and_line(cwd):
    (cwd / ".env").write_text("GENESIS_FP16_PRECISION=fp16\n\nGENESIS_FP16_GROWTH_INTERVALL=10\n")
    with pytest.raises(SettingsError) as err:
        load_settings()
    message = str(err.value)
    assert ".env:3:" in message and "did you mean GENESIS_FP16_GROWTH_INTERVAL?" in message


def test_every_valid_name_and_spelling_is_accepted(monkeypatch):
    from genesis_fp16.base.settings import CONFIG_FILE_ENV

    for row in describe_settings():
        if row["field"] not in ("state_dir", "enable_fp16_training"):  # an empty kill switch is an error
            monkeypatch.setenv(row["env"], "")  # empty values are ignored (env_ignore_empty)
    monkeypatch.setenv("genesis_fp16_precision", "bf16")  # the environment is read case-insensitively
    monkeypatch.delenv(CONFIG_FILE_ENV, raising=False)
    assert load_settings().precision == PrecisionMode.BF16
    monkeypatch.setenv("GENESIS_FP16_PRECISIONS", "bf16")
    with pytest.raises(SettingsError, match="did you mean GENESIS_FP16_PRECISION"):
        load_settings()


def test_kill_switch_under_the_prefix_points_at_its_real_name(monkeypatch):
    monkeypatch.setenv("GENESIS_FP16_ENABLE_FP16_TRAINING", "false")
    with pytest.raises(SettingsError, match="did you mean ENABLE_FP16_TRAINING"):
        load_settings()


@pytest.mark.parametrize(
    "content, expected",
    [
        (b'precision = "bf16\n', "line 1"),
        (b'growth_interval = 400\nprecision == "fp16"\n', "line 2"),
        (b'precision = "bf16"\n# caf\xe9\n', ":2: "),
    ],
)
def test_malformed_toml_names_file_and_line(sources, content, expected):
    (Path.cwd() / "genesis_fp16.toml").write_bytes(content)
    with pytest.raises(SettingsError) as err:
        load_settings()
    message = str(err.value)
    assert "genesis_fp16.toml" in message and expected in message and "\n" not in message


def test_unknown_toml_key_is_refused_with_a_suggestion(sources):
    (Path.cwd() / "genesis_fp16.toml").write_text('precison = "bf16"\n')
    with pytest.raises(SettingsError, match="genesis_fp16.toml: unknown setting 'precison'; did you mean 'precision'"):
        load_settings()


def _odd_file(path: Path, kind: str) -> str:
    """Put a ``kind`` of file at ``path``; how the error names it."""
    import os

    if kind == "fifo":
        os.mkfifo(path)
        return "is a FIFO, expected a regular file"
    if kind == "dev_zero":
        path.symlink_to("/dev/zero")
        return "is a character device (a symlink to /dev/zero), expected a regular file"
    if kind == "directory":
        path.mkdir()
        return "is a directory, expected a regular file"
    path.write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    return "is nested more than 16 levels deep"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "directory", "deep"])
def test_a_settings_file_that_is_no_toml_file_is_one_line(cwd, kind):
    """Issue 52 (D11): a 100,000-deep array in genesis_fp16.toml was a RecursionError from ``rollout status`` and
    ``doctor``; a FIFO or /dev/zero there was skipped as no file (pydantic-settings read only regular files). Each is
    one line naming the file, what is there and the fix, for every command, ``doctor`` too."""
    from typer.testing import CliRunner

    from genesis_fp16.cli import app

    named = _odd_file(cwd / "genesis_fp16.toml", kind)
    for check_names in (True, False):
        with pytest.raises(SettingsError, match="genesis_fp16.toml") as err:
            load_settings(check_names=check_names)
        assert named in str(err.value) and "\n" not in str(err.value)
    for command in (["rollout", "status"], ["doctor"]):
        result = CliRunner().invoke(app, command, env={"COLUMNS": "300"})
        assert result.exit_code == 2, result.output
        assert result.output.startswith("error: ") and result.output.count("\n") == 1 and named in result.output


@pytest.mark.timeout(30)
def test_a_fifo_as_dotenv_is_named_and_a_directory_called_dotenv_is_none(cwd):
    """pydantic-settings reads a FIFO called .env (and would wait on it); a directory called .env is a virtualenv."""
    import os

    os.mkdir(cwd / ".env")
    load_settings()
    os.rmdir(cwd / ".env")
    os.mkfifo(cwd / ".env")
    with pytest.raises(SettingsError, match=r"^the \.env file \.env is a FIFO, expected a regular file; replace it"):
        load_settings()


def test_cli_misspelled_variable_is_one_line_and_doctor_still_lists_names(monkeypatch):
    from typer.testing import CliRunner

    from genesis_fp16.cli import app

    monkeypatch.setenv("GENESIS_FP16_LOG_LEVLE", "DEBUG")
    result = CliRunner().invoke(app, ["rollout", "status"])
    assert result.exit_code == 2
    assert "did you mean GENESIS_FP16_LOG_LEVEL?" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output
    assert "GENESIS_FP16_LOG_LEVEL" in result.stdout and "GENESIS_FP16_LOG_LEVLE" in result.output


def test_log_levels_in_any_case(monkeypatch):
    from genesis_fp16.base.settings import LogLevel

    monkeypatch.setenv("GENESIS_FP16_LOG_LEVEL", "debug")
    monkeypatch.setenv("GENESIS_FP16_CONSOLE_LOG_LEVEL", "Error")
    s = load_settings()
    assert s.log_level is LogLevel.DEBUG and s.console_log_level is LogLevel.ERROR
    assert LogLevel("warning") is LogLevel.WARNING


@pytest.mark.parametrize(
    "name",
    [
        "ENABLE_FP16_TRAINIG",
        "ENABLE_FP16_TRAINNING",
        "ENABEL_FP16_TRAINING",
        "enable_fp16_trainig",
        "ENABLE_BF16_TRAINING",
    ],
)
def test_kill_switch_near_miss_in_environment_is_refused_with_a_suggestion(monkeypatch, name):
    monkeypatch.setenv(name, "false")
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert f"unknown setting {name} in the environment; did you mean ENABLE_FP16_TRAINING?" in str(err.value)


def test_kill_switch_near_miss_in_dotenv_names_file_and_line(cwd):
    (cwd / ".env").write_text("GENESIS_FP16_PRECISION=fp16\nENABLE_FP16_TRAINIG=false\n")
    with pytest.raises(
        SettingsError,
        match=r"\.env:2: unknown setting ENABLE_FP16_TRAINIG in the \.env file; did you mean ENABLE_FP16_TRAINING\?",
    ):
        load_settings()


def test_mangled_prefix_is_refused_with_a_suggestion(monkeypatch):
    monkeypatch.setenv("GENESIS_FP16PRECISION", "bf16")
    with pytest.raises(SettingsError, match="did you mean GENESIS_FP16_PRECISION"):
        load_settings()


@pytest.mark.parametrize(
    "name",
    [
        "PATH",
        "HOME",
        "ENABLE_SOMETHING_ELSE",
        "ENABLE_TRAINING",
        "BF16_ONLY",
        "FP16",
        "NO_PROXY",
        "USE_LIBUV",
        "TORCH_USE_CUDA_DSA",
        "ACCELERATE_MIXED_PRECISION",
        "FP16_TRAINING_LOG",
        "PYTORCH_ENABLE_MPS_FALLBACK",
        "NVIDIA_TF32_OVERRIDE",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_LAUNCH_BLOCKING",
        "TORCH_CUDNN_V8_API_ENABLED",
        "TF_ENABLE_AUTO_MIXED_PRECISION",
        "GENESIS_HOME",
        "enable_fp16_training",
        # the rule's short words are whole words (BEHALF, CHAMP, AMPLIFIER, TRAINING_LOG are not); others' by prefix
        "BEHALF_MODE",
        "CHAMP_MODE",
        "USE_AMPLIFIER",
        "HALF_LIFE",
        "TRAIN_MODE",
        "AMP",
        "HALF",
        "CUDA_MODULE_LOADING",
        "TF_ENABLE_AUTO_MIXED_PRECISION_LOSS_SCALING",
        "XLA_USE_BF16",
        "ORT_TENSORRT_FP16_ENABLE",
        "PYTORCH_NO_CUDA_MEMORY_CACHING",
    ],
)
def test_other_variables_are_not_taken_for_settings(monkeypatch, cwd, name):
    monkeypatch.setenv(name, "1")
    (cwd / ".env").write_text(f"{name}=1\n")
    load_settings()


# -- the kill switch cannot be missed: a name that reads as one, or an empty one, is refused --


@pytest.mark.parametrize(
    "name, value",
    [
        ("ENABLE_FP16", "false"),
        ("ENABLE_FP16_TRAIN", "false"),
        ("DISABLE_FP16_TRAINING", "true"),
        ("DISABLE_BF16", "1"),
        ("enable_mixed_precision", "0"),
        ("GENESIS_FP16_DISABLE_FP16", "true"),
        # the switch without its verb, or with USE / NO for it (issue 44: these two were skipped silently)
        ("FP16_TRAINING", "false"),
        ("USE_FP16", "false"),
        ("use_bf16", "0"),
        ("NO_FP16", "1"),
        ("BF16_TRAINING", "false"),
        ("MIXED_PRECISION_TRAINING", "false"),
        ("USE_MIXED_PRECISION", "false"),
        ("GENESIS_FP16_USE_FP16", "false"),
        # issue 52 (D13): these passed (exit 0, reduced precision on); by the rule, not by a list, they are refused
        ("TRAIN_FP16", "false"),
        ("FP16_MODE", "false"),
        ("HALF_PRECISION", "false"),
        ("ENABLE_AMP", "false"),
        ("USE_AMP", "false"),
        ("NO_AMP", "1"),
        ("AMP_MODE", "off"),
        ("use_half", "0"),
        ("TRAIN_BF16", "0"),
        ("MIXED_PRECISION", "no"),
        ("GENESIS_FP16_DISABLE", "true"),
    ],
)
def test_a_name_that_reads_as_the_kill_switch_is_refused(monkeypatch, cwd, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as err:
        load_settings()
    message = str(err.value)
    assert f"unknown setting {name} in the environment; did you mean ENABLE_FP16_TRAINING?" in message
    assert "\n" not in message
    # also where unknown names are let pass (doctor, a trainer without settings): it would leave FP16 on
    with pytest.raises(SettingsError, match="did you mean ENABLE_FP16_TRAINING"):
        load_settings(check_names=False)


def test_the_verbless_kill_switch_in_dotenv_names_file_and_line(cwd):
    (cwd / ".env").write_text("GENESIS_FP16_PRECISION=fp16\nUSE_FP16=false\n")
    with pytest.raises(
        SettingsError,
        match=r"^\.env:2: unknown setting USE_FP16 in the \.env file; did you mean ENABLE_FP16_TRAINING\?",
    ):
        load_settings()


def test_an_unknown_name_under_the_prefix_is_not_taken_for_the_kill_switch(monkeypatch):
    """The prefix's own FP16 does not make a name a switch: GENESIS_FP16_NO_COLOR is a misspelt setting, let pass where
    unknown names are (doctor), not a kill switch refused everywhere."""
    from genesis_fp16.base.setting_names import looks_like_switch

    assert not looks_like_switch("GENESIS_FP16_NO_COLOR", "GENESIS_FP16_")
    monkeypatch.setenv("GENESIS_FP16_NO_COLOR", "1")
    with pytest.raises(
        SettingsError, match="unknown setting GENESIS_FP16_NO_COLOR in the environment; did you mean GENESIS_FP16_"
    ):
        load_settings()
    load_settings(check_names=False)


def test_settings_with_precision_in_their_name_are_read(monkeypatch, cwd):
    monkeypatch.setenv("GENESIS_FP16_PRECISION", "fp32")
    (cwd / ".env").write_text("GENESIS_FP16_AUTO_PRECISION=rule\nENABLE_FP16_TRAINING=false\n")
    settings = load_settings()
    assert settings.precision == PrecisionMode.FP32 and settings.auto_precision.value == "rule"
    assert settings.enable_fp16_training is False


def test_a_name_that_reads_as_the_kill_switch_in_dotenv_names_file_and_line(cwd):
    (cwd / ".env").write_text("GENESIS_FP16_PRECISION=fp16\n\nDISABLE_FP16_TRAINING=true\n")
    with pytest.raises(
        SettingsError,
        match=r"^\.env:3: unknown setting DISABLE_FP16_TRAINING in the \.env file; did you mean ENABLE_FP16_TRAINING\?",
    ):
        load_settings()


def test_an_empty_kill_switch_is_an_error_not_unset(monkeypatch, cwd):
    monkeypatch.setenv("ENABLE_FP16_TRAINING", "")
    for check_names in (True, False):
        with pytest.raises(SettingsError, match=r"^ENABLE_FP16_TRAINING is empty in the environment; set it to false"):
            load_settings(check_names=check_names)


def test_an_empty_kill_switch_in_dotenv_names_file_and_line(cwd):
    (cwd / ".env").write_text("GENESIS_FP16_PRECISION=fp16\nENABLE_FP16_TRAINING=\n")
    with pytest.raises(SettingsError, match=r"^\.env:2: ENABLE_FP16_TRAINING is empty in the \.env file"):
        load_settings()


@pytest.mark.parametrize("name", ["DISABLE_FP16_TRAINING", "TRAIN_FP16", "HALF_PRECISION", "USE_AMP"])
def test_cli_refuses_a_switch_like_name_in_one_line(monkeypatch, cwd, name):
    from typer.testing import CliRunner

    from genesis_fp16.cli import app

    monkeypatch.setenv(name, "false")
    for command in (["rollout", "status"], ["doctor"]):
        result = CliRunner().invoke(app, command, env={"COLUMNS": "300"})
        assert result.exit_code == 2, result.output
        assert name in result.output and "did you mean ENABLE_FP16_TRAINING?" in result.output
        assert "Traceback" not in result.output and result.output.count("\n") == 1


def test_the_kill_switch_itself_in_any_case_is_read(monkeypatch, cwd):
    (cwd / ".env").write_text("enable_fp16_training=false\n")
    assert load_settings().enable_fp16_training is False


INT32_MAX, INT64_MAX, FP32_MAX = 2**31 - 1, 2**63 - 1, 3.4028234663852886e38


@pytest.mark.parametrize(
    "var, highest, too_high",
    [
        ("GENESIS_FP16_INIT_SCALE", FP32_MAX, "1e300"),
        ("GENESIS_FP16_GROWTH_FACTOR", FP32_MAX, "1e39"),
        ("GENESIS_FP16_MAX_GRAD_NORM", FP32_MAX, "1e39"),
        ("GENESIS_FP16_GROWTH_INTERVAL", INT32_MAX, "99999999999999999999999"),
        ("GENESIS_FP16_GRAD_ACCUMULATION_STEPS", INT64_MAX, str(INT64_MAX + 1)),
        ("GENESIS_FP16_NONFINITE_STREAK_THRESHOLD", INT64_MAX, str(INT64_MAX + 1)),
        ("GENESIS_FP16_EVENTS_MAX_BYTES", INT64_MAX, str(INT64_MAX + 1)),
        ("GENESIS_FP16_EVENTS_KEEP", 1000, "1001"),
        ("GENESIS_FP16_TORCH_THREADS", 4096, "4097"),
    ],
)
def test_every_number_has_an_upper_bound_named_in_the_error(monkeypatch, var, highest, too_high):
    monkeypatch.setenv(var, repr(highest))
    assert getattr(load_settings(), var.removeprefix("GENESIS_FP16_").lower()) == highest
    monkeypatch.setenv(var, too_high)
    with pytest.raises(SettingsError) as err:
        load_settings()
    message = str(err.value)
    assert message.startswith(f"invalid setting {var}={too_high!r}") and "<=" in message


def test_every_number_setting_has_an_upper_bound():
    from genesis_fp16.base.settings import Settings

    for name, info in Settings.model_fields.items():
        if info.annotation in (int, float) or str(info.annotation) == "typing.Optional[float]":
            assert any(
                getattr(meta, "le", None) is not None or getattr(meta, "lt", None) is not None for meta in info.metadata
            ), name

"""Profiles: parsing, layering of [defaults] and [agents.NAME], validation
messages (agent, key, allowed values), atomic writes, `profiles show`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from genesis_fp16.rollout import profiles
from genesis_fp16.cli import app
from genesis_fp16.rollout.profiles import ProfileError, load_profiles, profile_layer, thresholds_for, write_profiles
from genesis_fp16.base.settings import load_settings

runner = CliRunner()
EXAMPLE = Path(__file__).resolve().parents[1] / "configs" / "profiles.example.toml"


def _write(state_dir: Path, text: str) -> Path:
    path = state_dir / "profiles.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_dotted_agent_inherits_its_family_table(state_dir):
    """The loop's world model is `world_model.<task id>`: `[agents.world_model]`
    applies to every task's, and a quoted per-task table wins over it."""
    _write(
        state_dir,
        """
[defaults]
growth_interval = 1000
[agents.world_model]
precision = "bf16"
init_scale = 1024.0
[agents.world_model.thresholds]
overflow_rollback = 0.25
[agents."world_model.Swimmer-v5"]
precision = "fp32"
""",
    )
    s = load_settings()
    pendulum = profile_layer("world_model.Pendulum-v1", s)
    assert pendulum["trainer"] == {"growth_interval": 1000, "precision": "bf16", "init_scale": 1024.0}
    assert pendulum["thresholds"] == {"overflow_rollback": 0.25}
    assert pendulum["sources"]["precision"].endswith("[agents.world_model]")
    swimmer = profile_layer("world_model.Swimmer-v5", s)
    assert swimmer["trainer"]["precision"] == "fp32" and swimmer["trainer"]["init_scale"] == 1024.0
    assert swimmer["sources"]["precision"].endswith('[agents."world_model.Swimmer-v5"]')
    assert profile_layer("world_modelx", s)["trainer"] == {"growth_interval": 1000}  # a family is a dotted prefix


def test_an_unquoted_dotted_agent_table_says_to_quote_it(state_dir):
    _write(state_dir, '[agents.world_model.Pendulum-v1]\nprecision = "bf16"\n')
    with pytest.raises(ProfileError, match=r'quoted in TOML: \[agents."world_model.Pendulum-v1"\]'):
        profile_layer("world_model.Pendulum-v1", load_settings())


def test_no_file_is_an_empty_layer(state_dir):
    layer = profile_layer("wm", load_settings())
    assert layer["trainer"] == {} and layer["thresholds"] == {} and layer["source"] is None


def test_explicit_missing_file_is_an_error(state_dir, monkeypatch):
    monkeypatch.setenv("GENESIS_FP16_PROFILES_FILE", str(state_dir / "nope.toml"))
    with pytest.raises(ProfileError, match="GENESIS_FP16_PROFILES_FILE=.*nope.toml.*file not found"):
        profile_layer("wm", load_settings())


def test_defaults_then_agent_table(state_dir):
    _write(
        state_dir,
        """
[defaults]
growth_interval = 1000
precision = "bf16"
[defaults.thresholds]
min_steps = 5
[agents.wm]
precision = "fp16"
init_scale = 1024.0
max_grad_norm = "none"
[agents.wm.thresholds]
overflow_rollback = 0.25
""",
    )
    s = load_settings()
    wm = profile_layer("wm", s)
    assert wm["trainer"] == {"growth_interval": 1000, "precision": "fp16", "init_scale": 1024.0, "max_grad_norm": None}
    assert wm["thresholds"] == {"min_steps": 5, "overflow_rollback": 0.25}
    assert wm["sources"]["init_scale"].endswith("[agents.wm]") and wm["sources"]["growth_interval"].endswith(
        "[defaults]"
    )
    other = profile_layer("policy", s)
    assert other["trainer"] == {"growth_interval": 1000, "precision": "bf16"}
    th = thresholds_for("wm", s)
    assert th["overflow_rollback"] == 0.25 and th["overflow_warn"] == 0.10 and th["min_steps"] == 5


@pytest.mark.parametrize(
    "table, message",
    [
        ('precision = "fp8"', "agent 'wm': precision = 'fp8' is invalid; allowed values are auto, fp16, bf16, fp32"),
        ("init_scale = -1.0", "agent 'wm': init_scale = -1.0 is invalid; allowed values are a finite number > 0"),
        ("growth_interval = 1.5", "agent 'wm': growth_interval = 1.5 is invalid; allowed values are an integer >= 1"),
        ('enabled = "yes"', "agent 'wm': enabled = 'yes' is invalid; allowed values are true or false"),
        ("loss_scale = 8.0", "agent 'wm': unknown key 'loss_scale'; allowed keys are enabled, precision"),
        (
            "[agents.wm.thresholds]\noverflow_rollback = 1.5",
            "agent 'wm': thresholds.overflow_rollback = 1.5 is invalid; allowed values are a finite number > 0 and <= "
            "1",
        ),
        (
            "[agents.wm.thresholds]\nspeed = 1",
            "agent 'wm': unknown threshold 'speed'; allowed thresholds are failed_fraction",
        ),
        (
            "[agents.wm.thresholds]\noverflow_warn = 0.5",
            "overflow_warn (0.5) must not exceed thresholds.overflow_rollback (0.3)",
        ),
    ],
)
def test_validation_names_agent_key_and_allowed(state_dir, table, message):
    _write(state_dir, "[agents.wm]\n" + table + "\n")
    with pytest.raises(ProfileError) as err:
        profile_layer("other_agent", load_settings())  # the whole file is validated
    assert message in str(err.value)
    assert "profiles.toml" in str(err.value)


@pytest.mark.parametrize(
    "key, value", [("growth_factor", "1.0"), ("backoff_factor", "1.0"), ("init_scale", "true"), ("max_grad_norm", "0")]
)
def test_profile_and_settings_allow_the_same_values(state_dir, monkeypatch, key, value):
    # a profile table is checked by the model that checks the settings, so both say the same
    from genesis_fp16.base.settings import PrecisionConfig, SettingsError, allowed_values

    _write(state_dir, f"[agents.wm]\n{key} = {value}\n")
    with pytest.raises(ProfileError) as err:
        profile_layer("wm", load_settings())
    assert f"allowed values are {allowed_values(PrecisionConfig, key)}" in str(err.value)
    (state_dir / "profiles.toml").unlink()
    monkeypatch.setenv(f"GENESIS_FP16_{key.upper()}", value)
    with pytest.raises(SettingsError, match=f"allowed values are {allowed_values(PrecisionConfig, key)}"):
        load_settings()


def test_every_bad_key_is_named_on_one_line(state_dir):
    _write(state_dir, "[defaults]\ngrowth_interval = 0\nprecison = 'bf16'\n")
    with pytest.raises(ProfileError) as err:
        profile_layer("wm", load_settings())
    message = str(err.value)
    assert "[defaults]: " in message and "\n" not in message
    assert "growth_interval = 0 is invalid" in message and "unknown key 'precison'" in message
    assert "(did you mean 'precision'?)" in message


def test_threshold_order_is_checked_on_the_layered_agent(state_dir):
    # each table is fine alone, but agent 'wm' would get warn 0.25 > rollback 0.2
    _write(state_dir, "[defaults.thresholds]\noverflow_rollback = 0.2\n[agents.wm.thresholds]\noverflow_warn = 0.25\n")
    with pytest.raises(ProfileError) as err:
        profile_layer("other_agent", load_settings())
    assert "agent 'wm': thresholds.overflow_warn (0.25) must not exceed thresholds.overflow_rollback (0.2" in str(
        err.value
    )
    assert "[defaults]" in str(err.value)


def test_bad_toml_and_unknown_section(state_dir):
    _write(state_dir, "[agents.wm\n")
    with pytest.raises(ProfileError, match="not valid TOML"):
        profile_layer("wm", load_settings())
    _write(state_dir, "[agent.wm]\nprecision='bf16'\n")
    with pytest.raises(ProfileError, match="unknown top-level key"):
        profile_layer("wm", load_settings())


def test_a_profile_file_nested_too_deep_is_one_error(state_dir):
    """tomllib recurses: a 100,000-deep array was a RecursionError (the settings file's reader, issue 52)."""
    _write(state_dir, "[agents.wm]\nx = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ProfileError, match="profile file is nested more than 16 levels deep"):
        profile_layer("wm", load_settings())


def test_example_file_is_valid():
    pf = load_profiles(EXAMPLE)
    assert pf.agents, "the example should show at least one agent"


def test_write_profiles_atomic_with_backup_and_refuses_invalid(state_dir):
    path = _write(state_dir, '[agents.wm]\nprecision = "bf16"\n')
    result = write_profiles(path, {"agents": {"wm": {"precision": "fp32", "max_grad_norm": None}}})
    assert result["backup"] is not None and 'precision = "bf16"' in result["backup"].read_text()
    assert load_profiles(path).agents["wm"].values == {"precision": "fp32", "max_grad_norm": None}
    before = path.read_text()
    with pytest.raises(ProfileError, match="agent 'wm': precision = 'fp9'"):
        write_profiles(path, {"agents": {"wm": {"precision": "fp9"}}})
    assert path.read_text() == before
    assert not list(state_dir.glob(".profiles.toml.*.tmp"))


def test_cache_sees_changes(state_dir):
    path = _write(state_dir, '[agents.wm]\nprecision = "bf16"\n')
    assert profile_layer("wm", load_settings())["trainer"]["precision"] == "bf16"
    path.write_text('[agents.wm]\nprecision = "fp16"\ngrowth_interval = 7\n')
    profiles._CACHE.clear()  # same mtime within the clock's resolution is possible on fast writes
    assert profile_layer("wm", load_settings())["trainer"]["precision"] == "fp16"


def test_cli_profiles_show(state_dir):
    _write(state_dir, '[agents.wm]\nprecision = "fp32"\ninit_scale = 256.0\n[agents.wm.thresholds]\nmin_steps = 4\n')
    r = runner.invoke(app, ["profiles", "show", "wm", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)["agents"][0]
    assert data["config"]["init_scale"] == 256.0 and data["sources"]["init_scale"].startswith("profile:")
    assert data["sources"]["growth_interval"] == "settings"
    assert data["thresholds"]["min_steps"] == 4
    r = runner.invoke(app, ["profiles", "show"])
    assert r.exit_code == 0 and "wm" in r.stdout and "thresholds.min_steps" in r.stdout


def test_cli_profiles_show_bad_file_is_one_error(state_dir):
    _write(state_dir, '[agents.wm]\nprecision = "fp8"\n')
    r = runner.invoke(app, ["profiles", "show", "wm"])
    assert r.exit_code == 2
    assert "precision = 'fp8' is invalid" in r.output and "Traceback" not in r.output


def test_non_utf8_profile_file_names_file_and_line(state_dir):
    (state_dir / "profiles.toml").write_bytes(b'[agents.wm]\nprecision = "bf16"\n# r\xe9glage\n')
    with pytest.raises(ProfileError) as err:
        profile_layer("wm", load_settings())
    assert "profiles.toml:3:" in str(err.value) and "UTF-8" in str(err.value)
    r = runner.invoke(app, ["profiles", "show", "wm"])
    assert r.exit_code == 2 and "UTF-8" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("table", ['[agents."../x"]', '[agents."/etc/x"]', '[agents.".hidden"]', '[agents."a b"]'])
def test_a_bad_agent_name_in_the_profile_file_names_the_rule(state_dir, table):
    (state_dir / "profiles.toml").write_text(f'{table}\nprecision = "bf16"\n')
    with pytest.raises(ProfileError, match="profiles.toml: \\[agents\\] table: invalid agent name .*letters, digits"):
        profile_layer("wm", load_settings())


def test_profile_layer_refuses_a_bad_agent_name(state_dir):
    with pytest.raises(ValueError, match="invalid agent name '../x'"):
        profile_layer("../x", load_settings())


@pytest.mark.parametrize(
    "key, value",
    [
        ("init_scale", 1e300),
        ("growth_factor", 1e39),
        ("max_grad_norm", 1e39),
        ("growth_interval", 99999999999999999),
        ("grad_accumulation_steps", 2**63),
        ("nonfinite_streak_threshold", 2**63),
    ],
)
def test_profile_tables_have_the_settings_upper_bounds(state_dir, key, value):
    (state_dir / "profiles.toml").write_text(f"[agents.wm]\n{key} = {value!r}\n".replace("e+", "e"))
    with pytest.raises(ProfileError, match=f"{key} = .* is invalid; allowed values are .*<="):
        profile_layer("wm", load_settings())


@pytest.mark.parametrize(
    "key,value", [("min_steps", 2**31), ("canary_every", 2**40), ("canary_window", 1001), ("canary_confirm", 5000)]
)
def test_integer_thresholds_have_upper_bounds(state_dir, key, value):
    _write(state_dir, f"[agents.wm.thresholds]\n{key} = {value}\n")
    with pytest.raises(ProfileError, match=key):
        profile_layer("wm", load_settings())

"""Agent names: one rule for the ledger, profiles, checkpoints and the CLI."""

from __future__ import annotations

import pytest

from genesis_fp16.base.names import AGENT_NAME_MAX, AgentNameError, check_agent_name

VALID = [
    "world_model",
    "world_model.Pendulum-v1",
    "world_model.fp32_shadow",
    "ppo",
    "se_darwin",
    "drill_nan_storm",
    "wm",
    "a",
    "my_agent",
    "[red]x",
    "0",
    "x" * AGENT_NAME_MAX,
]
INVALID = [
    "",
    "/elsewhere/x",
    "../x",
    "..",
    ".",
    ".hidden",
    "a/b",
    "a\\b",
    "C:x",
    "a b",
    "a\x00b",
    "a\nb",
    "wm*",
    "wé",
    "x" * (AGENT_NAME_MAX + 1),
    None,
    3,
]


@pytest.mark.parametrize("name", VALID)
def test_names_in_use_are_valid(name):
    assert check_agent_name(name) == name


@pytest.mark.parametrize("name", INVALID)
def test_a_bad_name_is_one_error_naming_the_rule(name):
    with pytest.raises(AgentNameError) as err:
        check_agent_name(name)
    message = str(err.value)
    assert "letters, digits" in message and "\n" not in message.replace(repr(name), "")


def test_the_loop_s_task_world_model_names_are_valid():
    from agents.evolve_config import world_model_agent
    from agents.tasks.registry import task_names

    for task_id in [*task_names(), "ale_py:ALE/Pong-v5", "my env v0"]:
        check_agent_name(world_model_agent(task_id))

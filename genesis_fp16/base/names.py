"""Agent names: one rule wherever a name becomes a path, a ledger key or a profile table.

An agent's name is a directory (``<state_dir>/checkpoints/<agent>``), part of a
file name (``<agent>.pt``), a ledger row and an ``[agents.NAME]`` table, so it
is held to what is safe as one path component on every file system: letters,
digits, ``.``, ``_``, ``-``, ``[`` and ``]`` (no separator, so no absolute
path or ``..`` can leave the state dir; no space, quote, ``*``, ``?``, ``:`` or
control character that a shell, Windows or a terminal reads), not starting
with a dot (``.``, ``..`` and hidden files), at most `AGENT_NAME_MAX`
characters (under the 255 bytes of a file name, with room for suffixes such
as ``.fp32_shadow`` and ``.initial.pt``). A dot inside the name marks a
family: ``world_model.Pendulum-v1`` is a task's world model.
"""

from __future__ import annotations

import re
from typing import Any

AGENT_NAME_MAX = 128
AGENT_NAME_RULE = (
    f"1 to {AGENT_NAME_MAX} characters of letters, digits, '.', '_', '-', '[' and ']', not starting with '.' "
    "(e.g. world_model, world_model.Pendulum-v1, ppo)"
)
_AGENT_NAME = re.compile(r"[A-Za-z0-9_\[\]-][A-Za-z0-9._\[\]-]*")


class AgentNameError(ValueError):
    """An agent name outside the rule; the message names the name and the rule."""


def check_agent_name(name: Any) -> str:
    """``name`` when it is a valid agent name; an `AgentNameError` naming the rule otherwise."""
    if not isinstance(name, str) or not name:
        raise AgentNameError(f"agent name {name!r}: expected a non-empty string of {AGENT_NAME_RULE}")
    if len(name) > AGENT_NAME_MAX:
        raise AgentNameError(
            f"agent name {name[:40]!r}... has {len(name)} characters; an agent name is {AGENT_NAME_RULE}"
        )
    if not _AGENT_NAME.fullmatch(name):
        raise AgentNameError(f"invalid agent name {name!r}: an agent name is {AGENT_NAME_RULE}")
    return name

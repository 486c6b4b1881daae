"""A broken task stops the run after one generation: when every candidate of
a generation failed with the same error (its numbers aside), the env is
broken for every policy (a ``reset`` that returns None, an action space the
env does not take, a simulator that cannot start), and the rest of the
budget would only repeat it. The run then stops as ``failed`` with that
error and the fix to try (`fix_for`), instead of charging the whole budget.

A generation where candidates fail differently, or where one succeeded, goes
on as before: a failed candidate is charged and skipped.
"""

from __future__ import annotations

import re
from typing import Any, Optional, Sequence

MIN_CANDIDATES = 2
"""The fewest failed candidates that stop a run: one lone failure (a budget's last episode) says little."""

_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def normalised(error: str) -> str:
    """``error`` with every number as ``#``: the same failure of different candidates (another episode, step or
    action value) reads the same."""
    return _NUMBER.sub("#", error)


def common_error(failures: Sequence[dict[str, Any]], candidates: Sequence[str]) -> Optional[str]:
    """The error every one of ``candidates`` (ids, at least `MIN_CANDIDATES`) failed with, the first one's words,
    when each is among ``failures`` (``{candidate, error}``: `agents.run_state.Spent.failures`) and their errors
    read the same (`normalised`); else None."""
    if len(candidates) < MIN_CANDIDATES:
        return None
    errors = {f["candidate"]: str(f["error"]) for f in failures if f.get("candidate") in set(candidates)}
    if len(errors) < len(set(candidates)):
        return None
    first = errors[candidates[0]]
    if any(normalised(e) != normalised(first) for e in errors.values()):
        return None
    return first


_PREFIX = re.compile(r"^real evaluation of \d+ episodes failed: ")


def env_said(error: str) -> str:
    """``error`` without the evaluator's ``real evaluation of N episodes failed:`` before what the env said."""
    return _PREFIX.sub("", error)


def fix_for(error: str) -> str:
    """What to try for an error every candidate failed with: where in the env to look."""
    if "returned None" in error or "must return" in error:
        return "fix the env as the error says, then start a new run"
    if "raised in make" in error:
        return (
            "check that the env can be made outside the loop (its id, its package, what its factory needs), then "
            "start a new run"
        )
    if "raised in reset" in error:
        return "check the env's reset(seed=...) outside the loop: it must return (obs, info); then start a new run"
    if "raised in step" in error:
        return (
            "check the env's step(action) outside the loop with an action from its action space (the policy's "
            "actions are in that box, of its shape): it must return (obs, reward, terminated, truncated, info); "
            "then start a new run"
        )
    if "non-finite" in error:
        return (
            "the env gives non-finite values whatever the policy: check its reward and observations, then start a new "
            "run"
        )
    return "fix the task's env (every policy fails in it), then start a new run"

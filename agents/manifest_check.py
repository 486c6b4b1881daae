"""What a resume reads from a run manifest, checked field by field
(`agents.runs.read_manifest` calls `check_manifest`): a hand-edited manifest is
one line naming the field, never a traceback later."""

from __future__ import annotations

from typing import Any, Optional

from .manifest_fields import ManifestFieldError, check_fields, check_whole_numbers, is_int, is_number, is_numbers

_STATE_TEXT = "a string or null"
LAST_TIME = 253402300799
"""The last second of the year 9999 (a later start time cannot be shown as a date)."""
STOP_REASONS = ("target", "budget", "failed")
"""The values of `agents.run_state.StopReason` (not imported: the run state imports the search, and this stays a leaf).
"""


def check_manifest(data: dict[str, Any]) -> None:
    """Raise `ManifestFieldError` for the first field a resume reads whose type
    or range is not what this code writes (a hand-edited manifest): the
    counts, the state, the candidates, the observation statistics, the CMA-ES
    record, the config. A field that is absent is let be here (`state list`
    reads minimal manifests too); `resumed_config` asks for `RESUME_FIELDS`."""
    from .evolve_config import check_candidate, check_saved_config
    from .search_space import check_obs_stats

    def objects(v: Any) -> bool:
        return isinstance(v, list) and all(isinstance(x, dict) for x in v)

    def optional_text(v: Any) -> bool:
        return v is None or isinstance(v, str)

    def snapshot_name(v: Any) -> bool:  # a file in the run's world-model folder, nothing outside it
        return v is None or (isinstance(v, str) and v not in (".", "..") and "/" not in v and "\\" not in v)

    check_whole_numbers(data)
    check_fields(
        data,
        {
            "run_id": (lambda v: isinstance(v, str), "a string"),
            "status": (lambda v: isinstance(v, str), "a string"),
            "started": (
                lambda v: v is None or is_number(v) and 0 <= v <= LAST_TIME,
                "a time in seconds since 1970, before the year 10000",
            ),
            "wall_s": (lambda v: v is None or is_number(v) and v >= 0, "seconds >= 0"),
            "generation": (lambda v: is_int(v, -1), "a whole number >= -1 (the last committed generation; -1: none)"),
            "real_episodes": (lambda v: is_int(v, 0), "a whole number >= 0 (the real episodes the run spent)"),
            "env_steps": (
                lambda v: v is None or is_int(v, 0),
                "a whole number >= 0 (the real env steps the run spent)",
            ),
            "sessions": (objects, "a list of objects"),
            "failures": (objects, "a list of objects"),
            "confirmations": (objects, "a list of objects"),
            "generations": (objects, "a list of objects, one per committed generation"),
            "pool": (objects, "a list of objects, one per candidate"),
            "state": (lambda v: isinstance(v, dict), "an object (the loop's state)"),
            "obs_stats": (lambda v: isinstance(v, dict), "an object with count, mean and m2"),
            "search": (lambda v: isinstance(v, dict), "an object (the CMA-ES record)"),
            "actor": (lambda v: v is None or is_numbers(v), "null or a list of finite numbers"),
            "time": (
                lambda v: isinstance(v, dict) and all(is_number(x) and x >= 0 for x in v.values()),
                "an object of seconds >= 0",
            ),
            "config": (lambda v: isinstance(v, dict), "an object (the run's options)"),
            "world_model_checkpoint": (snapshot_name, "null or a file name in the run's world-model folder"),
            "critic_checkpoint": (snapshot_name, "null or a file name in the run's world-model folder"),
        },
    )
    for i, gen in enumerate(data.get("generations") or []):
        try:
            check_fields(
                gen,
                {
                    "generation": (lambda v: is_int(v, 0), "a whole number >= 0"),
                    "real_episodes": (lambda v: is_int(v, 0), "a whole number >= 0"),
                    "env_steps": (lambda v: is_int(v, 0), "a whole number >= 0"),
                },
            )
        except ManifestFieldError as exc:
            raise exc.within(f"generations[{i}].") from None
    try:
        check_fields(
            data.get("state", {}),
            {
                "generation": (lambda v: is_int(v, -1), "a whole number >= -1"),
                "candidates_run": (lambda v: is_int(v, 0), "a whole number >= 0"),
                "reached_at": (lambda v: v is None or is_int(v, 0), "null or a whole number >= 0"),
                "answer": (optional_text, _STATE_TEXT),
                "budget_exhausted": (optional_text, _STATE_TEXT),
                "unconfirmed": (optional_text, _STATE_TEXT),
                "stop": (
                    lambda v: v is None or v in STOP_REASONS,
                    f"null or one of {', '.join(STOP_REASONS)} (why the run stopped)",
                ),
            },
            known_only=True,
        )
    except ManifestFieldError as exc:
        raise exc.within("state.") from None
    n_params = _check_search(data.get("search"))
    for i, candidate in enumerate(data.get("pool") or []):
        try:
            check_candidate(candidate, n_params=n_params)
        except ManifestFieldError as exc:
            raise exc.within(f"pool[{i}].") from None
    actor = data.get("actor")
    if actor is not None and n_params is not None and len(actor) != n_params:
        raise ManifestFieldError("actor", actor, f"{n_params} numbers, one per policy parameter (as search.x0)")
    for name, check in (("obs_stats", check_obs_stats), ("config", check_saved_config)):
        if name in data:
            try:
                check(data[name])
            except ManifestFieldError as exc:
                raise exc.within(f"{name}.") from None
    stats, policy = data.get("obs_stats") or {}, (data.get("config") or {}).get("policy")
    if (
        stats.get("count")
        and n_params is not None
        and isinstance(policy, str)
        and not _fits(n_params, policy, len(stats["mean"]))
    ):
        raise ManifestFieldError(
            "obs_stats.mean",
            stats["mean"],
            f"one value per observation dimension: {len(stats['mean'])} do not fit the {policy} policy's {n_params} "
            "parameters",
        )


def _fits(n_params: int, policy: str, obs_dim: int) -> bool:
    """Whether a ``policy`` with ``n_params`` parameters can see ``obs_dim`` observations (some whole number of actions
    >= 1 makes the count: ``act (obs + 1)`` for linear, ``H (obs + 1) + act (H + 1)`` for ``mlp:H``)."""
    from .tasks.policies import parse_policy

    try:
        hidden = parse_policy(policy)
    except ValueError:
        return True  # the config check names a bad policy
    rest, per_action = (n_params, obs_dim + 1) if hidden == 0 else (n_params - hidden * (obs_dim + 1), hidden + 1)
    return rest >= per_action and rest % per_action == 0


def _check_search(search: Any) -> Optional[int]:
    """Check the CMA-ES record's fields; its policy parameter count (len x0), None without one."""
    if search is None:
        return None

    def rows(v: Any) -> bool:
        return isinstance(v, list) and all(is_numbers(r) for r in v)

    try:
        check_fields(
            search,
            {
                "x0": (
                    lambda v: is_numbers(v) and len(v) > 0,
                    "a non-empty list of finite numbers (the search's start)",
                ),
                "sigma0": (lambda v: is_number(v) and v > 0, "a finite number > 0"),
                "seed": (lambda v: is_int(v, 0), "a whole number >= 0"),
                "popsize": (lambda v: v is None or is_int(v, 2), "null or a whole number >= 2"),
                "told": (
                    lambda v: isinstance(v, list) and all(isinstance(t, dict) for t in v),
                    "a list of objects, one per generation",
                ),
            },
            required=("x0", "sigma0", "seed"),
        )
        for g, told in enumerate(search.get("told") or []):
            try:
                check_fields(
                    told,
                    {
                        "x": (rows, "a list of rows of finite numbers (the asked points)"),
                        "f": (lambda v: is_numbers(v, finite=False), "a list of numbers (what CMA-ES was told)"),
                        "injected": (lambda v: is_int(v, 0), "a whole number >= 0"),
                        "extras": (lambda v: is_int(v, 0), "a whole number >= 0"),
                        "told_x": (rows, "a list of rows of finite numbers (the told points)"),
                    },
                    required=("x", "f"),
                )
            except ManifestFieldError as exc:
                raise exc.within(f"told[{g}].") from None
    except ManifestFieldError as exc:
        raise exc.within("search.") from None
    return len(search["x0"])


# -- running or not --------------------------------------------------------------------

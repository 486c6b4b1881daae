"""The evolved policy as a file: what a run gives, loaded, run, evaluated and
put inside a host project.

Every finished ``evolve`` run writes its answer to
``<state_dir>/runs/<run_id>/policy.json`` (`agents.runs.policy_path`; the
report's ``policy_file``). The file is JSON, never a pickle: a format marker
and version, a digest of its content, the policy (family, sizes, observation
scale, action bounds, the raw parameters), the task (env id, episode length,
target), the run it came from (id, seed, candidate, operator, whether its
target was confirmed), its returns (training, validation, held-out, each
held-out episode's) and the run's held-out start states with the seed and the
rule they derive from.

`load_policy(path)` reads it as untrusted input (a regular file, bounded in
size and depth, strict JSON, every field checked, the digest compared: a file
edited by hand is refused) and gives an `EvolvedPolicy`: ``predict(obs)``
(batched, deterministic, NumPy in and out: the float32 actions the run's
episodes gave the env), ``module()`` (a `torch.nn.Module` computing the same
actions), ``evaluate(env_id, episodes, seed)`` (real episodes through the run's
own episode runner, by default on the run's held-out start states: their mean
is the report's ``heldout_return``), ``record_video`` and ``save``. A policy
runs only on an env whose observation and action sizes and action bounds are
its own; anything else is refused in one line (`PolicyError`).

Torch-free: ``module()`` imports torch when called.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union

import numpy as np

from genesis_fp16.base import untrusted
from genesis_fp16.base.storage import PathLike

from .tasks import EpisodeSpec, PolicySpec, ResolvedTask, Task, TaskError, get_task, parse_policy, run_episodes

if TYPE_CHECKING:
    import torch

__all__ = [
    "POLICY_FORMAT",
    "POLICY_VERSION",
    "EvolvedPolicy",
    "PolicyError",
    "PolicyEvaluation",
    "load_policy",
]

POLICY_FORMAT = "genesis-fp16.policy"
POLICY_VERSION = 1
POLICY_MAX_BYTES = 16 * 1024 * 1024
"""A larger policy file is not read (the largest policy a run takes, 11,585 parameters, writes about 300 KiB)."""
POLICY_MAX_DEPTH = 8
"""Deeper nesting is not a policy file this code writes (it nests at most 3 deep)."""
MAX_EPISODES = 100_000
"""The most episodes one evaluation runs."""
HELDOUT_RULE = (
    "ResolvedTask.start_states(seed).heldout: for a task with exact states its own split(seed), else the reset seeds "
    "reset_seed_base(seed) + 500000 + k (agents/tasks/task.py)"
)
NORMALISER = (
    "obs * policy.obs_scale, elementwise, before the first layer; the search's running observation mean and standard "
    "deviation are folded into the raw params"
)
NETWORK = (
    "linear: a = center + half_range * tanh(x @ W + b); mlp:H: a = center + half_range * tanh(tanh(x @ W1 + b1) @ W2 "
    "+ b2); x the normalised observation, center and half_range from the action bounds; params are W1 (obs_dim x H, "
    "row-major), b1, W2 (H x act_dim), b2 (linear: W, b)"
)
_FIX = "use the policy file a run wrote (genesis-fp16 evolve prints its path; the report's policy_file)"


class PolicyError(ValueError):
    """A policy file that cannot be used (missing, not a policy file, edited,
    damaged), or a policy that does not fit the env it is asked to run on: one
    line naming the file and what to do."""


@dataclass(frozen=True)
class PolicyEvaluation:
    """A policy's real episodes: one return per start state, in their order.
    ``start_states`` says which states they were."""

    env_id: str
    seed: int
    start_states: str
    returns: list[float]

    @property
    def mean_return(self) -> float:
        return float(np.mean(self.returns))

    @property
    def std_return(self) -> float:
        return float(np.std(self.returns))

    @property
    def min_return(self) -> float:
        return float(np.min(self.returns))

    @property
    def max_return(self) -> float:
        return float(np.max(self.returns))

    def as_dict(self) -> dict[str, Any]:
        return {
            "env": self.env_id,
            "seed": self.seed,
            "start_states": self.start_states,
            "episodes": len(self.returns),
            "mean_return": self.mean_return,
            "std_return": self.std_return,
            "min_return": self.min_return,
            "max_return": self.max_return,
            "returns": list(self.returns),
        }


@dataclass(frozen=True)
class EvolvedPolicy:
    """An evolved policy and where it came from. ``spec`` and ``params`` are the
    policy (`agents.tasks.PolicySpec`, its raw parameter vector); ``env_id``,
    ``episode_steps`` and ``target`` its task; ``run`` the run it came from
    (``run_id``, ``seed``, ``mode``, ``candidate``, ``operator``,
    ``generation``, ``confirmed``, ``target_reached``, ``stop_reason``);
    ``returns`` its returns in that run (``train``, ``train_states_run``,
    ``validation``, ``heldout``, ``heldout_returns``); ``heldout_seed`` and
    ``heldout_states`` the run's held-out start states (one row each).
    ``path``: the file it was loaded from."""

    spec: PolicySpec
    params: np.ndarray
    env_id: str
    episode_steps: int
    target: Optional[float] = None
    run: dict[str, Any] = field(default_factory=dict)
    returns: dict[str, Any] = field(default_factory=dict)
    heldout_seed: int = 0
    heldout_states: np.ndarray = field(default_factory=lambda: np.zeros((0, 1)))
    path: Optional[Path] = None

    def __post_init__(self) -> None:
        params = np.array(self.params, dtype=np.float64).reshape(-1)
        if params.size != self.spec.n_params:
            raise PolicyError(
                f"{self.spec.name} policy of {self.spec.obs_dim} observations -> {self.spec.act_dim} actions: "
                f"{params.size} parameters, expected {self.spec.n_params}"
            )
        params.flags.writeable = False
        object.__setattr__(self, "params", params)
        object.__setattr__(self, "heldout_states", np.array(self.heldout_states, dtype=np.float64, ndmin=2))

    @property
    def name(self) -> str:
        """Where it is, for messages: the file, else the run and candidate."""
        if self.path is not None:
            return f"policy file {self.path}"
        return f"policy {self.run.get('candidate', '?')} of run {self.run.get('run_id', '?')}"

    # -- acting -------------------------------------------------------------------------------
    def predict(self, obs: Any) -> np.ndarray:
        """The actions for ``obs``: one observation (obs_dim,) -> (act_dim,), or a
        batch (N, obs_dim) -> (N, act_dim). Deterministic; float32, as the run's
        episodes gave them to the env (computed in float64, as there)."""
        x = np.asarray(obs, dtype=np.float64)
        if x.ndim not in (1, 2) or x.shape[-1] != self.spec.obs_dim:
            raise ValueError(
                f"observations of shape {tuple(x.shape)}: expected ({self.spec.obs_dim},) or (N, {self.spec.obs_dim}) "
                f"(the policy's {self.spec.obs_dim} observations)"
            )
        return self.spec.act(self.params, x).astype(np.float32)

    def module(self, dtype: Optional["torch.dtype"] = None) -> "torch.nn.Module":
        """The policy as a `torch.nn.Module` (`agents.tasks.torch_policy.PolicyNetwork`):
        ``module(obs (..., obs_dim)) -> actions (..., act_dim)``, the same
        network as `predict`, in ``dtype`` (default float32; float64 gives
        `predict`'s actions to the last float32 bit)."""
        import torch

        from .tasks.torch_policy import PolicyNetwork

        return PolicyNetwork(self.spec, self.params, dtype=dtype or torch.float32).eval()

    # -- real episodes ------------------------------------------------------------------------
    def resolve(self, env_id: Optional[str] = None, task: Optional[Task] = None) -> ResolvedTask:
        """The task to run on: ``task``, else the registered task (or gymnasium
        id) ``env_id``, else the policy's own; refused (`PolicyError`) when its
        observation or action sizes or action bounds are not the policy's."""
        own = (task.env_id if task is not None else env_id or self.env_id) == self.env_id
        chosen = task if task is not None else get_task(env_id or self.env_id)
        try:
            resolved = chosen.resolve(
                target=self.target if self.target is not None else 0.0,  # evaluation judges nothing against it
                policy=self.spec.name,
                episode_steps=self.episode_steps if own else None,
            )
        except TaskError as exc:
            raise PolicyError(f"{self.name}: {exc}") from None
        theirs = resolved.policy
        if (theirs.obs_dim, theirs.act_dim) != (self.spec.obs_dim, self.spec.act_dim) or not (
            np.allclose(theirs.action_low, self.spec.action_low, rtol=0, atol=1e-6)
            and np.allclose(theirs.action_high, self.spec.action_high, rtol=0, atol=1e-6)
        ):
            raise PolicyError(
                f"{self.name} was evolved for {self.env_id} ({_spaces(self.spec)}); env {resolved.env_id!r} has "
                f"{_spaces(theirs)}: the policy cannot run there; evaluate it on {self.env_id} (leave --env out)"
            )
        return resolved

    def start_states(
        self, resolved: ResolvedTask, episodes: Optional[int], seed: Optional[int]
    ) -> tuple[np.ndarray, str]:
        """The start states an evaluation of ``episodes`` on ``resolved`` runs, and
        what they are in words: the run's own held-out states where the task is
        the policy's and ``seed`` the run's (then more of their kind past their
        number: `agents.tasks.ResolvedTask.heldout_states`), else the held-out
        states a run seeded ``seed`` would have."""
        seed = self.heldout_seed if seed is None else int(seed)
        n = len(self.heldout_states) if episodes is None else int(episodes)
        if not 1 <= n <= MAX_EPISODES:
            raise PolicyError(f"episodes={n}: expected 1..{MAX_EPISODES}")
        stored = self.heldout_states
        try:
            if resolved.env_id != self.env_id or seed != self.heldout_seed:
                return resolved.heldout_states(seed, n), f"held-out start states of seed {seed}"
            if n <= len(stored):
                return stored[:n], f"the run's held-out start states (seed {seed})"
            more = resolved.heldout_states(seed, n)[len(stored) :]
        except TaskError as exc:
            raise PolicyError(f"{self.name}: {exc}") from None
        what = f"the run's held-out start states (seed {seed}), then {n - len(stored)} more of their kind"
        return np.concatenate([stored, more]), what

    def episode_spec(self, resolved: ResolvedTask) -> EpisodeSpec:
        """How an episode of this policy runs on ``resolved`` (its env, this policy's network)."""
        return replace(resolved.episode_spec, policy=self.spec)

    def evaluate(
        self,
        env_id: Optional[str] = None,
        episodes: Optional[int] = None,
        seed: Optional[int] = None,
        *,
        task: Optional[Task] = None,
    ) -> PolicyEvaluation:
        """One real episode per start state, in this process, through the
        episode runner the run used (`agents.tasks.run_episodes`). Defaults:
        the policy's own task and the run's held-out start states, all of
        them (20 for the built-in tasks): the mean is the report's
        ``heldout_return``. ``env_id``: another registered task or gymnasium
        id with the same spaces; ``task``: a `agents.tasks.Task` (one that is
        not registered); ``seed``: the held-out states of a run of that seed.
        Raises `PolicyError` for an env the policy does not fit and
        `agents.tasks.EnvFailure` for one that fails."""
        resolved = self.resolve(env_id, task)
        states, what = self.start_states(resolved, episodes, seed)
        result = run_episodes(self.episode_spec(resolved), self.params, states)
        used = self.heldout_seed if seed is None else int(seed)
        return PolicyEvaluation(resolved.env_id, used, what, [float(r) for r in result["returns"]])

    def record_video(
        self,
        path: PathLike,
        env_id: Optional[str] = None,
        seed: Optional[int] = None,
        *,
        task: Optional[Task] = None,
    ) -> tuple[int, float]:
        """One episode (the first start state `evaluate` would run) rendered to
        ``path`` (imageio: ``.gif`` always, ``.mp4`` with imageio-ffmpeg);
        returns (frames, the episode's return). `PolicyError` in one line where
        the env cannot render ``rgb_array`` frames here (no pygame for the classic
        envs, no OpenGL context for MuJoCo) or the file cannot be written."""
        from .policy_video import VideoUnavailable, record_episode

        resolved = self.resolve(env_id, task)
        states, _ = self.start_states(resolved, 1, seed)
        try:
            return record_episode(self.episode_spec(resolved), self.params, states, resolved, path)
        except VideoUnavailable as exc:
            raise PolicyError(str(exc)) from None

    # -- the file -----------------------------------------------------------------------------
    def document(self) -> dict[str, Any]:
        """The policy file's content, digest included."""
        body: dict[str, Any] = {
            "format": POLICY_FORMAT,
            "version": POLICY_VERSION,
            "policy": {
                "family": self.spec.name,
                "obs_dim": self.spec.obs_dim,
                "act_dim": self.spec.act_dim,
                "hidden": self.spec.hidden,
                "n_params": self.spec.n_params,
                "obs_scale": [float(v) for v in self.spec.obs_scale],
                "action_low": [float(v) for v in self.spec.action_low],
                "action_high": [float(v) for v in self.spec.action_high],
                "network": NETWORK,
            },
            "observation_normaliser": NORMALISER,
            "params": [float(v) for v in self.params],
            "task": {"env_id": self.env_id, "episode_steps": int(self.episode_steps), "target": self.target},
            "run": _plain(self.run),
            "returns": _plain(self.returns),
            "heldout_states": {
                "seed": int(self.heldout_seed),
                "rule": HELDOUT_RULE,
                "states": [[float(v) for v in row] for row in self.heldout_states],
            },
        }
        return {**body, "digest": digest(body)}

    def save(self, path: PathLike) -> Path:
        """Write the policy file to ``path`` atomically (what a run writes; `load_policy` reads it)."""
        from genesis_fp16.base.storage import atomic_write_bytes

        text = json.dumps(self.document(), indent=1, allow_nan=False) + "\n"
        return atomic_write_bytes(path, text.encode("utf-8"))


def digest(body: dict[str, Any]) -> str:
    """``sha256:<hex>`` of ``body`` (the file without its digest) as canonical JSON (sorted keys, no spaces)."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=True)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def load_policy(path: PathLike) -> EvolvedPolicy:
    """The policy file ``path`` (`EvolvedPolicy.save`, what every run writes),
    read as untrusted input: a regular file of at most 16 MiB of strict JSON,
    its format and version known, its digest matching its content, every field
    checked. Anything else raises `PolicyError` in one line naming the file."""
    path = Path(path)
    try:
        data = untrusted.read_json(path, "policy file", _FIX, max_bytes=POLICY_MAX_BYTES, max_depth=POLICY_MAX_DEPTH)
    except FileNotFoundError:
        raise PolicyError(f"policy file {path}: no such file; {_FIX}") from None
    except untrusted.UntrustedFileError as exc:
        raise PolicyError(str(exc)) from None
    where = f"policy file {path}"
    if not isinstance(data, dict) or data.get("format") != POLICY_FORMAT:
        raise PolicyError(f"{where} is not a genesis-fp16 policy file (expected format {POLICY_FORMAT!r}); {_FIX}")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= POLICY_VERSION:
        raise PolicyError(
            f"{where} has format version {version!r}; this genesis-fp16 reads version {POLICY_VERSION}: upgrade "
            "genesis-fp16 to read a newer one"
        )
    body = {k: v for k, v in data.items() if k != "digest"}
    if data.get("digest") != digest(body):
        raise PolicyError(
            f"{where} does not match its digest: it was changed after it was written (edited by hand or damaged); "
            f"{_FIX}"
        )
    try:
        return _from_document(data, path)
    except _Bad as exc:
        raise PolicyError(f"{where}: {exc}; {_FIX}") from None


# -- reading the document ---------------------------------------------------------------------


class _Bad(ValueError):
    """A field of a policy document that is not what this code writes."""


def _get(obj: Any, key: str, where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise _Bad(f"{where}.{key} is missing")
    return obj[key]


def _int(value: Any, name: str, least: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise _Bad(f"{name} = {_shown(value)}: expected a whole number >= {least}")
    return value


def _numbers(value: Any, name: str, n: Optional[int] = None) -> list[float]:
    if not isinstance(value, list) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value
    ):
        raise _Bad(f"{name}: expected a list of finite numbers")
    if n is not None and len(value) != n:
        raise _Bad(f"{name} has {len(value)} values, expected {n}")
    return [float(v) for v in value]


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _from_document(data: dict[str, Any], path: Path) -> EvolvedPolicy:
    pol = _get(data, "policy", "policy file")
    obs_dim = _int(_get(pol, "obs_dim", "policy"), "policy.obs_dim", 1)
    act_dim = _int(_get(pol, "act_dim", "policy"), "policy.act_dim", 1)
    hidden = _int(_get(pol, "hidden", "policy"), "policy.hidden", 0)
    family = _get(pol, "family", "policy")
    try:
        if not isinstance(family, str) or parse_policy(family) != hidden:
            raise ValueError
    except ValueError:
        raise _Bad(f"policy.family = {_shown(family)} does not match policy.hidden = {hidden}") from None
    low = _numbers(_get(pol, "action_low", "policy"), "policy.action_low", act_dim)
    high = _numbers(_get(pol, "action_high", "policy"), "policy.action_high", act_dim)
    if not all(lo <= hi for lo, hi in zip(low, high)):
        raise _Bad("policy.action_low is above policy.action_high")
    spec = PolicySpec(
        obs_dim=obs_dim,
        act_dim=act_dim,
        hidden=hidden,
        obs_scale=tuple(_numbers(_get(pol, "obs_scale", "policy"), "policy.obs_scale", obs_dim)),
        action_low=tuple(low),
        action_high=tuple(high),
    )
    params = _numbers(_get(data, "params", "policy file"), "params", spec.n_params)
    task = _get(data, "task", "policy file")
    env_id = _get(task, "env_id", "task")
    if not isinstance(env_id, str) or not env_id:
        raise _Bad("task.env_id: expected the task's name")
    target = _get(task, "target", "task")
    if target is not None:
        _numbers([target], "task.target")
    held = _get(data, "heldout_states", "policy file")
    seed = _int(_get(held, "seed", "heldout_states"), "heldout_states.seed", 0)
    rows = _get(held, "states", "heldout_states")
    if not isinstance(rows, list) or not rows:
        raise _Bad("heldout_states.states: expected a list of start states")
    states = [_numbers(r, f"heldout_states.states[{i}]") for i, r in enumerate(rows)]
    if len({len(r) for r in states}) != 1 or not states[0]:
        raise _Bad("heldout_states.states: expected rows of one length")
    run, returns = data.get("run", {}), data.get("returns", {})
    if not isinstance(run, dict) or not isinstance(returns, dict):
        raise _Bad("run and returns: expected objects")
    return EvolvedPolicy(
        spec=spec,
        params=np.asarray(params, dtype=np.float64),
        env_id=env_id,
        episode_steps=_int(_get(task, "episode_steps", "task"), "task.episode_steps", 1),
        target=None if target is None else float(target),
        run=run,
        returns=returns,
        heldout_seed=seed,
        heldout_states=np.asarray(states, dtype=np.float64),
        path=path,
    )


def _plain(value: Any) -> Any:
    """``value`` as JSON's types (numpy numbers as Python's; a non-finite float as None)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_plain(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    return value


def _spaces(spec: PolicySpec) -> str:
    bounds = ", ".join(f"[{lo:g}, {hi:g}]" for lo, hi in zip(spec.action_low, spec.action_high))
    return f"{spec.obs_dim} observations -> {spec.act_dim} action(s) in {bounds}"


def policy_from_run(
    resolved: ResolvedTask,
    params: Sequence[float],
    *,
    run: dict[str, Any],
    returns: dict[str, Any],
    heldout_seed: int,
    heldout_states: Union[np.ndarray, Sequence[Sequence[float]]],
) -> EvolvedPolicy:
    """A run's answer as an `EvolvedPolicy` (what `agents.se_darwin_agent` writes)."""
    return EvolvedPolicy(
        spec=resolved.policy,
        params=np.asarray(params, dtype=np.float64),
        env_id=resolved.env_id,
        episode_steps=resolved.episode_steps,
        target=resolved.target,
        run={**run, "written": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
        returns=returns,
        heldout_seed=heldout_seed,
        heldout_states=np.asarray(heldout_states, dtype=np.float64),
    )

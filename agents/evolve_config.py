"""The evolution loop's options, its candidates, and the config a resumed run keeps.

Every option is one field of `EvolveConfig`; `genesis-fp16 evolve`'s flags are
made from these fields (their docstrings are the flags' help, ``OPTION``
metadata says the flag's name and panel): an option is written once."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Optional, Union

import numpy as np

from genesis_fp16.base.vocabulary import PrecisionMode
from genesis_fp16.precision.request import PrecisionRequest

from .evaluation import BACKENDS
from .manifest_fields import (
    MANIFEST_CHANGES,
    MANIFEST_VERSION,
    Manifest,
    RESUME_FIELDS,
    UNRESUMABLE,
    ManifestFieldError,
    RunError,
    check_fields,
    is_int,
    is_number,
    is_numbers,
)
from .tasks import ResolvedTask, Task, TaskError, get_task
from .tasks.task import DEFAULT_DISCOUNT, DEFAULT_REFINE_STEPS, DEFAULT_SIGMA0, is_discount, is_step_size

TASK_DEFAULTS = {"refine_steps": DEFAULT_REFINE_STEPS, "discount": DEFAULT_DISCOUNT, "sigma0": DEFAULT_SIGMA0}
"""The options a task may carry (`Task.refine_steps`, `Task.discount`, `Task.sigma0`), each with the loop's default:
`EvolveConfig.resolve` takes the flag's value, else the task's, else this."""

# what needs the optional packages, in a missing extra's error
EVOLVE = "genesis-fp16 evolve"

ADVANCED = "Advanced"
"""The help panel of the rarely used options."""
ABLATIONS = "Ablations"
"""The help panel of the switches that take a part of the loop out."""
RARE_PANELS = (ABLATIONS, ADVANCED)
"""Panels `genesis-fp16 evolve --help` leaves out (one screen); ``--help-all`` shows them."""
RESUMABLE = ("budget", "budget_steps", "workers", "backend")
"""Options a resumed run may change; every other one must equal the run's."""


def option(
    default: Any,
    *,
    flag: Optional[str] = None,
    panel: Optional[str] = None,
    cli: bool = True,
    least: Optional[float] = None,
    most: Optional[float] = None,
    why: str = "",
) -> Any:
    """A config field and how `genesis-fp16 evolve` offers it: ``flag`` (default:
    the field's name with dashes), ``panel`` (None: the main one), ``cli`` False:
    not a flag, ``least`` and ``most``: the smallest and largest value it takes
    (``most`` bounds what the option sizes in memory), ``why``: the reason for
    ``most``, in the error that refuses a larger value."""
    return field(
        default=default, metadata={"flag": flag, "panel": panel, "cli": cli, "least": least, "most": most, "why": why}
    )


SEED_MAX = 2**32 - 1
"""The largest seed (32 bits, as most seeding APIs take). Every random stream of a run is seeded by
`genesis_fp16.base.seeds.stream_seed` (seed, the stream's name, its indices: 63 bits, what NumPy and torch take), and
the
env reset seeds of its start states lie in a block that stream picks (`agents.tasks.task.reset_seed_base`: below
2^53, exact in the float64 rows a start state is); neither depends on how large the seed is, so this bound is the
seeding APIs' custom, not an overflow's."""
COVARIANCE_LIMIT_BYTES = 1 << 30
"""The most CMA-ES's covariance matrix (n_params² float64s; pycma holds about three such matrices) may take: 1 GiB,
11,585 policy parameters. A larger policy is refused before anything is allocated."""


def range_text(least: Optional[float], most: Optional[float]) -> str:
    """``1..64``, ``>= 1`` or ``<= 64``: an option's range as its help and its errors show it."""

    def num(v: float) -> str:
        return str(int(v)) if float(v).is_integer() else f"{v:g}"

    if least is not None and most is not None:
        return f"{num(least)}..{num(most)}"
    return f">= {num(least)}" if least is not None else f"<= {num(most)}" if most is not None else ""


def covariance_bytes(n_params: int) -> int:
    """The bytes of CMA-ES's covariance matrix for ``n_params`` policy parameters (n_params² float64s)."""
    return int(n_params) ** 2 * 8


def _bytes_text(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.2f} {unit}".replace(".00 ", " ")
        n /= 1024
    return f"{n:.2f} PiB"  # pragma: no cover


def ledger_agent(kind: str, task_id: str) -> str:
    """The ledger agent of a task's learned part: ``<kind>.<task id>`` (``world_model.Pendulum-v1``,
    ``critic.Pendulum-v1``), any character outside letters, digits, ``.``, ``_`` and ``-`` made ``_``
    (the name is also a checkpoint file name)."""
    return kind + "." + re.sub(r"[^A-Za-z0-9._-]", "_", task_id)


def world_model_agent(task_id: str) -> str:
    return ledger_agent("world_model", task_id)


@dataclass
class EvolveConfig:
    """Options of the evolution loop; `genesis-fp16 evolve`'s flags are made
    from these fields. `resolve()` checks them and fills in what the task
    decides; a bad value raises `ValueError` naming it."""

    env_id: str = option("Pendulum-v1", flag="env")
    """The task: a registered name (`genesis-fp16 evolve --list-tasks`) or any gymnasium id with Box spaces."""
    budget: int = option(
        200, least=1, most=100_000, why="the run keeps every candidate it runs, in memory and in its manifest"
    )
    """Real episodes the run may spend (candidates' episodes, verifications and confirmations)."""
    budget_steps: Optional[int] = option(None, least=1)
    """Real env steps the run may spend, beside `budget`; None: no limit."""
    seed: int = option(
        0, least=0, most=SEED_MAX, why="the seeds of the start states, CMA-ES and torch are made from it"
    )
    """Seeds the start states, CMA-ES, the refinement, the world model and the critic."""
    target: Optional[float] = option(None)
    """Mean return on the training start states that counts as solved; None: the task's, else the env spec's
    `reward_threshold`."""
    policy: Optional[str] = option(None)
    """The policy family, `linear` or `mlp:H`; None: the task's."""
    use_world_model: bool = option(True, flag="world-model", panel=ABLATIONS)
    """Train the world model on every real transition; its short rollouts from real states train the critic and, with
    `refine_horizon` > 0, the refinement looks through it. False: the ablation without a model."""
    use_critic: bool = option(True, flag="critic", panel=ABLATIONS)
    """Train the twin-Q critic and refine by its gradient. False: the ablation without a critic (refinement through the
    model's `refine_horizon` steps alone, where there is a model)."""
    refined: int = option(4, least=0, most=1023, why="fewer than the CMA-ES population, itself at most 1024")
    """The most refined candidates run beside each CMA-ES population, fewer (down to none) while they do not win (0: no
    refinement, the loop is a one-episode CMA-ES: the floor)."""
    precision: Optional[PrecisionRequest] = option(None)
    """The world model's precision (`auto`, `fp32`, `bf16`, ...); None: the settings and its profile decide."""
    critic_precision: Optional[PrecisionRequest] = option(None)
    """The critic's precision; None: the settings and its profile decide."""
    workers: int = option(2, least=1, most=1024, why="each one is a process, or a Ray task, running episodes")
    """Processes (or Ray tasks at a time) running real episodes."""
    backend: str = option("process")
    """Where real episodes run: `process` (a local pool) or `ray` (the connected Ray cluster)."""
    episode_steps: Optional[int] = option(
        None, panel=ADVANCED, least=1, most=1_000_000, why="an episode's transitions are held in memory"
    )
    """Steps per real episode; None: the task's, else the env spec's `max_episode_steps`."""
    popsize: Optional[int] = option(
        None, panel=ADVANCED, least=2, most=1024, why="each candidate's parameters are held in memory"
    )
    """CMA-ES's population of its own samples (the refined candidates run beside it); None: pycma's default
    4 + 3 ln(policy parameters), the floor's tuned population."""
    sigma0: Optional[float] = option(None, panel=ADVANCED)
    """CMA-ES's initial step size, in normalised coordinates; None: the task's (`Task.sigma0`), else 0.5."""
    refine_steps: Optional[int] = option(None, panel=ADVANCED, least=1)
    """Actor-gradient steps of the longest refined copy (the others stop at 1/4, 1/16, ... of it) and of the actor
    rounds together, at most (see `learn_per_step`); None: the task's (`Task.refine_steps`), else 800."""
    discount: Optional[float] = option(None, panel=ADVANCED)
    """The learners' discount per step: the critic's TD target and the actor's objective; None: the task's
    (`Task.discount`), else 0.99."""
    refine_horizon: int = option(
        0, panel=ADVANCED, least=0, most=100, why="the gradient runs back through every model step, each kept in memory"
    )
    """World-model steps the refinement looks through before the critic's value (MVE / SVG(H)); 0: the critic alone."""
    critic_updates: float = option(2.0, panel=ADVANCED)
    """Critic updates per new real transition (the update-to-data ratio), each on a batch of real and model
    transitions."""
    actor_rounds: int = option(8, panel=ADVANCED, least=0)
    """Rounds per generation in which the critic values an actor and the actor ascends the critic in turn (policy
    iteration from the generation's best candidate); the actor joins the next population. 0: the critic values the
    mean."""
    model_rollouts: int = option(
        256, panel=ADVANCED, least=0, most=65_536, why="one batch, through every ensemble member"
    )
    """Short model rollouts per generation, branched from real replay states, that train the critic beside the real
    data."""
    rollout_horizon: int = option(
        5, panel=ADVANCED, least=1, most=100, why="every model step of every rollout is kept as critic data"
    )
    """Model steps per branched rollout (short: the model's error compounds with the horizon)."""
    wm_steps: int = option(800, panel=ADVANCED, least=1)
    """World-model optimizer steps per generation, at most (see `learn_per_step`)."""
    learn_per_step: float = option(2.0, panel=ADVANCED)
    """World-model and actor-gradient steps a generation per real env step it ran, up to `wm_steps` and
    `refine_steps` (a generation of short episodes trains as much as it brought: the critic's `critic_updates`
    for the other two learners); 0: always `wm_steps` and `refine_steps`."""
    ensemble: int = option(
        5,
        panel=ADVANCED,
        least=1,
        most=64,
        why="each member is a network trained, with its optimizer state, every generation",
    )
    """Members of the world model's probabilistic ensemble."""
    eval_timeout_s: float = option(120.0, panel=ADVANCED)
    """Seconds one evaluation may take; a slower one is charged its episodes and scored -inf."""
    eval_memory_mb: Optional[int] = option(
        2048, panel=ADVANCED, least=1, most=1 << 20, why="1 TiB: the address-space limit must fit the OS's"
    )
    """Address space in MiB an evaluation worker may add; None: no limit."""
    agent: str = option("se_darwin", cli=False)
    """The name the loop logs under and files its replay data under (`<agent>:<run_id>`)."""
    wm_agent: Optional[str] = option(None, cli=False)
    """The world model's ledger agent (profile, stage, guard, checkpoint); None: `world_model.<task id>`."""
    critic_agent: Optional[str] = option(None, cli=False)
    """The critic's ledger agent; None: `critic.<task id>`."""

    def resolve(self, task: Union[Task, ResolvedTask, None] = None) -> tuple["EvolveConfig", ResolvedTask]:
        """The task (``task``, else the one ``env_id`` names), checked, and this
        config with its target, policy, episode length and agents filled in
        from it. Raises ValueError (TaskError) saying what to fix. A
        `ResolvedTask` (the CLI resolves before any output, to refuse a bad env
        in one line) is taken as it is: resolving opens the env, once is enough;
        its target, policy and episode length must be this config's where it sets them."""
        self.validate()
        if isinstance(task, ResolvedTask):
            resolved = task
            clash = [
                f"{name}={mine!r} (the resolved task's is {theirs!r})"
                for name, mine, theirs in (
                    ("target", self.target, resolved.target),
                    ("policy", self.policy, resolved.policy.name),
                    ("episode_steps", self.episode_steps, resolved.episode_steps),
                )
                if mine is not None and mine != theirs
            ]
            if clash:
                raise TaskError(
                    f"{resolved.env_id}: {'; '.join(clash)}; expected the options the task was resolved with"
                )
        else:
            resolved = (task or get_task(self.env_id)).resolve(
                target=self.target, policy=self.policy, episode_steps=self.episode_steps
            )
        check_policy_size(resolved)
        cfg = replace(
            self,
            env_id=resolved.env_id,
            target=resolved.target,
            policy=resolved.policy.name,
            episode_steps=resolved.episode_steps,
            # the flag's, else the task's (a measurement chose it), else the loop's default
            **{
                name: next(v for v in (getattr(self, name), getattr(resolved.task, name), default) if v is not None)
                for name, default in TASK_DEFAULTS.items()
            },
            wm_agent=self.wm_agent or ledger_agent("world_model", resolved.env_id),
            critic_agent=self.critic_agent or ledger_agent("critic", resolved.env_id),
        )
        steps = resolved.episode_steps
        if cfg.budget_steps is not None and cfg.budget_steps < steps:
            raise TaskError(
                f"budget_steps={cfg.budget_steps}: expected at least one episode's worth ({steps} real env steps on "
                f"{cfg.env_id})"
            )
        popsize = cfg.population(resolved.n_params)
        if cfg.refined >= popsize:
            raise TaskError(
                f"refined={cfg.refined}: expected fewer than the CMA-ES population ({popsize}), whose better half "
                "stays "
                "its own samples' best"
            )
        return cfg, resolved

    def __post_init__(self) -> None:
        # the precisions asked for are parsed here, where the user speaks (a flag's text, a manifest's), into the one
        # typed request that travels unchanged to the decision; text that is no precision is left for `validate`
        for name in ("precision", "critic_precision"):
            value = getattr(self, name)
            if isinstance(value, str) and not isinstance(value, PrecisionRequest):
                try:
                    setattr(self, name, PrecisionRequest.parse(value))
                except ValueError:
                    pass

    def population(self, n_params: int) -> int:
        """The CMA-ES population of a run with ``n_params`` policy parameters (see `popsize`)."""
        if self.popsize is not None:
            return self.popsize
        return 4 + int(3 * math.log(n_params))

    def per_generation(self, cap: int, new_steps: Optional[int]) -> int:
        """The steps a learner trains in a generation that ran ``new_steps`` real env steps: `learn_per_step` of
        them each, up to ``cap`` (its `wm_steps` or `refine_steps`), at least 1; ``cap`` with `learn_per_step` 0 or
        ``new_steps`` None (not recorded: a generation record from before the option)."""
        if self.learn_per_step == 0 or new_steps is None:
            return cap
        return min(cap, max(1, math.ceil(self.learn_per_step * new_steps)))

    def validate(self) -> None:
        """Raise `ValueError` listing every option out of range (all at once)."""
        problems = []
        for f in fields(self):
            meta, value = f.metadata, getattr(self, f.name)
            least, most = meta.get("least"), meta.get("most")
            flag = "--" + (meta.get("flag") or f.name).replace("_", "-")
            if value is None or (least is None and most is None):
                continue
            if str(f.type) in ("int", "Optional[int]") and (isinstance(value, bool) or not isinstance(value, int)):
                problems.append(f"{f.name}={value!r} ({flag}): expected a whole number in {range_text(least, most)}")
            elif least is not None and value < least:
                problems.append(
                    f"{f.name}={value} ({flag}): expected {range_text(least, most)}; pass {flag} "
                    f"{range_text(least, None)[3:]} or more"
                )
            elif most is not None and value > most:
                why = f" ({meta['why']})" if meta.get("why") else ""
                problems.append(
                    f"{f.name}={value} ({flag}): expected {range_text(least, most)}{why}; pass {flag} "
                    f"{range_text(None, most)[3:]} or less"
                )
        for name in ("precision", "critic_precision"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, PrecisionRequest):  # not parsed in __post_init__
                problems.append(f"{name}={value!r}: expected one of {', '.join(m.value for m in PrecisionMode)}")
        if self.target is not None and not math.isfinite(self.target):
            problems.append(f"target={self.target}: expected a finite number (a mean return that counts as solved)")
        if self.backend not in BACKENDS:
            problems.append(f"backend={self.backend!r}: expected one of {', '.join(BACKENDS)}")
        if self.sigma0 is not None and not is_step_size(self.sigma0):
            problems.append(f"sigma0={self.sigma0!r}: expected a finite number > 0 (--sigma0, e.g. 0.5)")
        if not (math.isfinite(self.eval_timeout_s) and self.eval_timeout_s > 0):
            problems.append(f"eval_timeout_s={self.eval_timeout_s}: expected a finite number > 0")
        for name in ("critic_updates", "learn_per_step"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                problems.append(f"{name}={getattr(self, name)}: expected a finite number >= 0")
        if self.discount is not None and not is_discount(self.discount):
            problems.append(f"discount={self.discount!r} (--discount): expected a number in [0, 1), e.g. 0.99")
        if self.refined and not (self.use_critic or (self.use_world_model and self.refine_horizon > 0)):
            problems.append(
                f"refined={self.refined}: refinement needs the critic, or the world model with refine_horizon >= 1; "
                "set refined=0 for plain CMA-ES"
            )
        if problems:
            raise ValueError("invalid evolve options: " + "; ".join(problems))


def check_policy_size(resolved: ResolvedTask) -> None:
    """Refuse, before anything is allocated, a policy whose CMA-ES covariance
    (n_params² float64s) would exceed `COVARIANCE_LIMIT_BYTES`; the error names
    the parameter count, the size, the limit and the widest policy that fits."""
    spec, n = resolved.policy, resolved.n_params
    need = covariance_bytes(n)
    if need <= COVARIANCE_LIMIT_BYTES:
        return
    most = math.isqrt(COVARIANCE_LIMIT_BYTES // 8)
    widest = (most - spec.act_dim) // (spec.obs_dim + spec.act_dim + 1)  # n_params = H (obs + act + 1) + act
    linear = spec.obs_dim * spec.act_dim + spec.act_dim
    fits = (
        f"--policy mlp:{widest} at most"
        if widest >= 1
        else "--policy linear"
        if linear <= most
        else "none of the policy families fits this task's spaces"
    )
    raise TaskError(
        f"policy {spec.name} (--policy) on {resolved.env_id}: {n:,} parameters ({spec.obs_dim} observations -> "
        f"{spec.act_dim} actions); "
        f"CMA-ES's covariance matrix would take {_bytes_text(need)} (n_params^2 x 8 bytes), over the limit of "
        f"{_bytes_text(COVARIANCE_LIMIT_BYTES)} ({most:,} parameters); expected a smaller policy: {fits}"
    )


def config_docs() -> dict[str, str]:
    """Each `EvolveConfig` field's docstring (the string under it in the class body): the flags' help and the docs'
    option table."""
    import ast
    import inspect

    body = ast.parse(inspect.getsource(EvolveConfig)).body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, after in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = after.value.value
    return docs


def options_table() -> str:
    """The options as docs/EVOLUTION.md shows them (a markdown table: option, flag, default, meaning), made from the
    fields."""
    docs, rows = config_docs(), ["| option | flag | default | meaning |", "|---|---|---|---|"]
    for f in fields(EvolveConfig):
        meta = f.metadata
        name = (meta.get("flag") or f.name).replace("_", "-")
        flag = (
            "(Python only)"
            if not meta.get("cli", True)
            else (f"`--{name}` / `--no-{name}`" if f.type == "bool" else f"`--{name}`")
        )
        rows.append(f"| `{f.name}` | {flag} | `{f.default}` | {' '.join(docs.get(f.name, '').split())} |")
    return "\n".join(rows)


@dataclass
class Candidate:
    id: str
    params: np.ndarray
    operator: str
    generation: int
    real_return: Optional[float] = None  # mean over the training start states it was run on
    real_episodes: int = 0
    full: bool = False  # evaluated on every training start state
    accepted: bool = False  # its returns so far put the training mean at the target (`agents.verify`'s sequential test)
    starts: list[int] = field(default_factory=list)  # indices into the training start states, in the order run
    returns: list[float] = field(default_factory=list)  # its real return on each of them
    confirmed: Optional[bool] = None  # met the target and was run on the validation start states: did it hold?
    joined: Optional[bool] = None  # a refined candidate (an extra): did it join CMA-ES's update (`agents.cma_search`)?
    validation_return: Optional[float] = None  # mean over the validation start states
    cut: bool = False  # its episode ran into the step budget's end: its data is kept, its return not judged
    steps: int = 0  # env steps of its first episode (what it cost; `agents.extras.refined_count` compares them)

    @property
    def refined(self) -> bool:
        """Whether this is a refined candidate (an extra beside CMA-ES's own samples)."""
        return self.operator.startswith("refined")

    def start_returns(self) -> dict[int, float]:
        """Training start index -> real return, for the start states it was run on."""
        return dict(zip(self.starts, self.returns))

    def meets(self, target: float) -> bool:
        """Whether this candidate's mean return over the training start states is at least ``target``: all of them ran,
        or
        the sequential test accepted it on fewer."""
        return (self.full or self.accepted) and self.real_return is not None and self.real_return >= target

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "params": [float(v) for v in self.params]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Candidate":
        """The candidate `as_dict` wrote; `agents.runs.ManifestFieldError` (a `RunError`) names a field that is not
        what it writes."""
        check_candidate(data)
        return cls(**{**data, "params": np.asarray(data["params"], dtype=float)})


def _optional_number(v: Any) -> bool:
    return v is None or is_number(v, finite=False)


_CANDIDATE_CHECKS: dict[str, tuple[Any, str]] = {
    "id": (lambda v: isinstance(v, str), "a string"),
    "params": (lambda v: is_numbers(v) and len(v) > 0, "a non-empty list of finite numbers (the policy parameters)"),
    "operator": (lambda v: isinstance(v, str), "a string (cma, refined:..., actor)"),
    "generation": (lambda v: is_int(v, 0), "a whole number >= 0"),
    "real_return": (_optional_number, "null or a number (the mean return)"),
    "real_episodes": (lambda v: is_int(v, 0), "a whole number >= 0"),
    "full": (lambda v: isinstance(v, bool), "true or false"),
    "accepted": (lambda v: isinstance(v, bool), "true or false"),
    "starts": (
        lambda v: isinstance(v, list) and all(is_int(i, 0) for i in v),
        "a list of whole numbers >= 0 (training start indices)",
    ),
    "returns": (lambda v: is_numbers(v, finite=False), "a list of numbers, one per start"),
    "confirmed": (lambda v: v is None or isinstance(v, bool), "null, true or false"),
    "joined": (lambda v: v is None or isinstance(v, bool), "null, true or false"),
    "validation_return": (_optional_number, "null or a number"),
    "cut": (lambda v: isinstance(v, bool), "true or false"),
    "steps": (lambda v: is_int(v, 0), "a whole number >= 0 (env steps of its first episode)"),
}


def check_candidate(data: Any, *, n_params: Optional[int] = None) -> None:
    """Raise `agents.runs.ManifestFieldError` for the first field of a candidate record (`Candidate.as_dict`) that is
    unknown, missing or not of its type; ``n_params``: the length its params must have."""
    check_fields(
        data,
        _CANDIDATE_CHECKS,
        required=("id", "params", "operator", "generation"),
        known_only=True,
        what="an object (a candidate)",
    )
    if n_params is not None and len(data["params"]) != n_params:
        raise ManifestFieldError(
            "params", data["params"], f"{n_params} numbers, one per policy parameter (as search.x0)"
        )
    if len(data.get("returns", [])) != len(data.get("starts", [])):
        raise ManifestFieldError(
            "returns", data.get("returns"), f"one return per start ({len(data.get('starts', []))} starts)"
        )


def check_saved_config(saved: Any) -> None:
    """Raise `agents.runs.ManifestFieldError` for the first option of a saved config (`EvolveConfig` as a dict) whose
    type or range is not what `EvolveConfig` takes. Unknown options are `resumed_config`'s to refuse."""
    kinds: dict[str, tuple[Any, str]] = {
        "int": (lambda v: is_int(v), "a whole number"),
        "float": (lambda v: is_number(v, finite=False), "a number"),
        "str": (lambda v: isinstance(v, str), "a string"),
        "bool": (lambda v: isinstance(v, bool), "true or false"),
        "PrecisionRequest": (lambda v: isinstance(v, str), "a precision's name (text)"),  # kept as its text
    }
    checks: dict[str, tuple[Any, str]] = {}
    for f in fields(EvolveConfig):
        optional = str(f.type).startswith("Optional[")
        ok, text = kinds[str(f.type).removeprefix("Optional[").removesuffix("]")]
        least, most = f.metadata.get("least"), f.metadata.get("most")
        if least is not None or most is not None:
            text = f"a whole number in {range_text(least, most)}"
            ok = (lambda lo, hi: lambda v: is_int(v) and (lo is None or v >= lo) and (hi is None or v <= hi))(
                least, most
            )
        if optional:
            ok, text = (lambda inner: lambda v: v is None or inner(v))(ok), f"null or {text}"
        checks[f.name] = (ok, text)
    check_fields(saved, checks, what="an object (the run's options)")


CONFIG_FIELDS = {f.name for f in fields(EvolveConfig)}


def resumed_config(
    manifest: dict[str, Any],
    *,
    budget: Optional[int],
    workers: Optional[int],
    options: dict[str, Any],
    backend: Optional[str] = None,
    budget_steps: Optional[int] = None,
) -> EvolveConfig:
    """The run's own config, with the budgets, workers and backend the caller may change. A field a resume needs that
    is missing, or a saved option out of range, is a `RunError` naming the manifest file and the field."""
    where = (manifest.path if isinstance(manifest, Manifest) else None) or f"run {manifest.get('run_id')!r}'s manifest"
    run_id = manifest.get("run_id")
    if int(manifest.get("version") or 0) < MANIFEST_VERSION:
        raise RunError(
            f"run {run_id!r}: its manifest is version {manifest.get('version')!r}, written before "
            f"{MANIFEST_CHANGES[MANIFEST_VERSION]} (version {MANIFEST_VERSION}); this version cannot continue it. "
            "Resume it with the version that "
            "started it, or start a new run"
        )
    for name in RESUME_FIELDS:
        if name not in manifest:
            raise RunError(
                f"{where}: field {name}: missing; expected what this version writes in every manifest; {UNRESUMABLE}"
            )
    saved = dict(manifest["config"])
    # a run started before `learn_per_step` trained its learners the whole `wm_steps` / `refine_steps` a generation
    saved.setdefault("learn_per_step", 0.0)
    saved.setdefault("discount", DEFAULT_DISCOUNT)  # and before `discount`, at 0.99 on every task
    unknown = sorted(set(saved) - CONFIG_FIELDS)
    if unknown:
        raise RunError(
            f"run {run_id!r}: its manifest has options this version does not know ({', '.join(unknown)}); resume it "
            "with the version that started it"
        )
    try:  # the run's own options, before the caller's changes (the agent checks those)
        EvolveConfig(**saved).validate()
    except ValueError as exc:
        raise RunError(f"{where}: field config: {exc}; {UNRESUMABLE}") from None
    mismatched = [f"{k}={v!r} (the run has {saved.get(k)!r})" for k, v in options.items() if saved.get(k) != v]
    if mismatched:
        raise RunError(
            f"run {run_id!r} was started with other options: {'; '.join(mismatched)}. A resumed run keeps its own "
            "options "
            "(only --budget, --budget-steps, --workers and --backend may change); resume it without these, or start a "
            "new run"
        )
    if budget is not None:
        spent = int(manifest["real_episodes"])
        if budget < spent:
            raise RunError(
                f"budget={budget}: run {run_id!r} has already spent {spent} real episodes; expected a budget of at "
                f"least {spent}"
            )
        saved["budget"] = budget
    if budget_steps is not None:
        spent_steps = int(manifest.get("env_steps") or 0)
        if budget_steps < spent_steps:
            raise RunError(
                f"budget_steps={budget_steps}: run {run_id!r} has already spent {spent_steps} real env steps; "
                "expected at least that"
            )
        saved["budget_steps"] = budget_steps
    if workers is not None:
        saved["workers"] = workers
    if backend is not None:
        saved["backend"] = backend
    return EvolveConfig(**saved)

"""The evolution loop's options, its candidates, and the config a resumed run keeps."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Optional

import numpy as np

from genesis_fp16.precision import parse_mode
from genesis_fp16.settings import PrecisionMode

from .evaluation import BACKENDS
from .runs import MANIFEST_VERSION, RunError
from .tasks import ResolvedTask, Task, TaskError, get_task

# what needs the optional packages, in a missing extra's error
EVOLVE = "genesis-fp16 evolve"

DEFAULT_HORIZON = 200
"""Imagined steps per rollout when `EvolveConfig.horizon` is None, on tasks whose episodes are longer (the rest of the
episode is extrapolated from the last quarter's mean reward). Chosen by measurement (docs/EVOLUTION.md, "The imagined
horizon"): on Swimmer-v5 and InvertedPendulum-v5 a model trained on a run's data ranks its candidates as well at 200 steps
as at 1000, and a run costs a quarter to a fifth of the CPU (the loop's held-out returns on Swimmer-v5 are mixed across
seeds). Pendulum-v1's 200-step episodes are imagined whole, as before."""


def world_model_agent(task_id: str) -> str:
    """The ledger agent of a task's world model: ``world_model.<task id>``, with
    any character outside letters, digits, ``.``, ``_`` and ``-`` made ``_``
    (the name is also a checkpoint file name)."""
    return "world_model." + re.sub(r"[^A-Za-z0-9._-]", "_", task_id)


def default_horizon(episode_steps: int) -> int:
    """The imagined horizon of a run that does not set one: `DEFAULT_HORIZON`, or the episode where it is shorter."""
    return min(int(episode_steps), DEFAULT_HORIZON)


@dataclass
class EvolveConfig:
    """Options of the evolution loop; `genesis-fp16 evolve`'s flags map onto
    these (`--budget` onto `budget`, ...). `resolve()` checks them and fills
    in what the task decides; a bad value raises `ValueError` naming it."""

    env_id: str = "Pendulum-v1"
    """The task: a registered name (`genesis-fp16 evolve --list-tasks`) or any gymnasium id."""
    budget: int = 200
    """Real episodes the run may spend; at least one full evaluation (the task's training start states)."""
    budget_steps: Optional[int] = None
    """Real env steps the run may spend, beside `budget`; None: no limit. The loop stops when the next evaluation could
    exceed either (an episode may run `episode_steps` steps); at least one full evaluation's worth."""
    seed: int = 0
    """Seeds the start states, the candidates, the operators and the world model."""
    precision: Optional[str] = None
    """The world model's precision (`auto`, `fp32`, `bf16`, ...); None: the settings and the `wm_agent` profile decide."""
    use_world_model: bool = True
    """False: the baseline without a model; candidates are proposed blind and shuffled instead of ranked."""
    target: Optional[float] = None
    """Mean return on the training start states that counts as solved; None: the task's, else the env spec's `reward_threshold`."""
    init_candidates: int = 8
    """Generation 0: random policies, one real episode each (so at most `budget`)."""
    eval_top_k: int = 3
    """Candidates per generation, best imagined first, that get real episodes (raced: see `racing`)."""
    racing: bool = True
    """Race real evaluations: a candidate runs on 2, 4, 8, ... training start states and stops once it can no longer beat
    the best fully evaluated candidate nor reach the target (`agents.racing`). False: every candidate runs on all of them."""
    imagine_starts: int = 8
    """Start states the search imagines from per generation: training start states first (a fresh subset each generation
    when there are more of them), then states only the model sees."""
    kappa: float = 1.0
    """Pessimism of the search: a candidate's imagined score is the particles' mean return minus `kappa` times their spread."""
    particles: Optional[int] = None
    """Imagined rollouts per candidate and start state; None: the world model's default (one per elite member of its default ensemble)."""
    horizon: Optional[int] = None
    """Imagined steps per rollout; None: `DEFAULT_HORIZON` (200), or the episode length where that is shorter. A horizon
    shorter than the episode is extended to the episode by the last quarter's mean imagined reward (`resolve()` fills it in)."""
    wm_steps: int = 800
    """World-model optimizer steps per generation."""
    ensemble: int = 5
    """Members of the world model's probabilistic ensemble; 1: one network with a deterministic head (the comparison)."""
    popsize: int = 16
    """CMA-ES population of the searches inside the model (refinement and revision)."""
    refine_iters: int = 30
    """CMA-ES iterations of refinement, the search around the best candidate."""
    refine_sigma: float = 0.3
    """Initial CMA-ES step size of refinement (a Gaussian step's size without a model)."""
    revision_iters: int = 40
    """CMA-ES iterations of revision, the fresh start while no fully evaluated candidate meets the target."""
    revision_sigma: float = 1.0
    """Initial CMA-ES step size of revision."""
    revision_samples: int = 64
    """Random policies revision ranks by imagined return before its search starts from the best."""
    recombinations: int = 3
    """Blends of the two best fully evaluated candidates per generation."""
    trust_spearman: Optional[float] = 0.3
    """The model's proposals get real episodes while the Spearman correlation of imagined against real returns over the
    last `trust_window` audited candidates is at least this; below it, and before any audit, a generation is a probe
    generation: CMA-ES on one-episode probes (`agents.probe_search`). None: the model's proposals always get them (the
    loop before probe search; a resumed run that predates it keeps that)."""
    trust_window: int = 12
    """Audited candidates (the latest) whose rank correlation decides `trust_spearman`."""
    probe_sigma: float = 0.5
    """Initial CMA-ES step size of the probe search, in normalised coordinates (the tuned CMA-ES yardstick's sigma0)."""
    probe_popsize: Optional[int] = None
    """Probes per probe generation; None: pycma's default population, 4 + 3 ln(policy parameters)."""
    probe_screen: int = 4
    """Pre-selection in probe generations: while the model's rank correlation is positive, CMA-ES samples this many
    populations and the model's imagined scores pick the one that gets real episodes; 1: no screening."""
    workers: int = 2
    """Processes (or Ray tasks at a time) running real episodes."""
    backend: str = "process"
    """Where real episodes run: `process` (a local pool) or `ray` (the connected Ray cluster)."""
    eval_timeout_s: float = 120.0
    """Seconds one candidate's evaluation may take; a slower one is charged its episodes and scored -inf."""
    eval_memory_mb: Optional[int] = 2048
    """Address space in MiB an evaluation worker may add; None: no limit."""
    agent: str = "se_darwin"
    """The name the loop logs under and files its replay data under (`<agent>:<run_id>`)."""
    wm_agent: Optional[str] = None
    """The name the world model trains under: its profile, rollout-ledger entry, guard and checkpoint file. None:
    `world_model.<task id>` (e.g. `world_model.Pendulum-v1`), so one task's rollback leaves the others' world models alone."""
    policy: Optional[str] = None
    """The policy shape, `linear` or `mlp:H`; None: the task's."""
    episode_steps: Optional[int] = None
    """Steps per real episode; None: the task's, else the env spec's `max_episode_steps`."""

    def resolve(self, task: Optional[Task] = None) -> tuple["EvolveConfig", ResolvedTask]:
        """The task (``task``, else the one ``env_id`` names), checked, and this
        config with its target, policy, episode length and horizon filled in
        from it. Raises ValueError (TaskError) saying what to fix."""
        self.validate()
        resolved = (task or get_task(self.env_id)).resolve(target=self.target, policy=self.policy, episode_steps=self.episode_steps)
        cfg = replace(
            self, env_id=resolved.env_id, target=resolved.target, policy=resolved.policy.name, episode_steps=resolved.episode_steps,
            horizon=self.horizon or default_horizon(resolved.episode_steps), wm_agent=self.wm_agent or world_model_agent(resolved.env_id),
        )
        n_train = len(resolved.start_states(cfg.seed).train)
        if cfg.budget < n_train:
            raise TaskError(f"budget={cfg.budget}: expected at least {n_train} real episodes (one full evaluation on {cfg.env_id}'s training start states)")
        steps = resolved.episode_steps
        if cfg.budget_steps is not None and cfg.budget_steps < max(n_train, cfg.init_candidates) * steps:
            raise TaskError(
                f"budget_steps={cfg.budget_steps}: expected at least {max(n_train, cfg.init_candidates) * steps} real env steps "
                f"(generation 0's {cfg.init_candidates} episodes and one full evaluation on {n_train} training start states, "
                f"each episode up to {steps} steps)"
            )
        if cfg.horizon is not None and cfg.horizon > steps:
            raise TaskError(
                f"horizon={cfg.horizon}: expected at most the episode length ({steps} steps); leave it None for "
                f"min({DEFAULT_HORIZON}, the episode length)"
            )
        return cfg, resolved

    def validate(self) -> None:
        """Raise `ValueError` listing every option out of range (all at once)."""
        problems = []
        if self.budget < 1:
            problems.append(f"budget={self.budget}: expected at least one real episode")
        if self.init_candidates > self.budget:
            problems.append(
                f"init_candidates={self.init_candidates}: generation 0 spends one real episode per initial candidate; "
                f"expected at most the budget ({self.budget})"
            )
        if self.precision is not None:
            try:
                parse_mode(self.precision)
            except ValueError:
                problems.append(f"precision={self.precision!r}: expected one of {', '.join(m.value for m in PrecisionMode)}")
        if self.target is not None and not math.isfinite(self.target):
            problems.append(f"target={self.target}: expected a finite number (a mean return that counts as solved)")
        if self.backend not in BACKENDS:
            problems.append(f"backend={self.backend!r}: expected one of {', '.join(BACKENDS)}")
        if not (math.isfinite(self.kappa) and self.kappa >= 0):
            problems.append(f"kappa={self.kappa}: expected a finite number >= 0 (0: the particles' mean alone)")
        if self.trust_spearman is not None and not (math.isfinite(self.trust_spearman) and -1.0 <= self.trust_spearman <= 1.0):
            problems.append(f"trust_spearman={self.trust_spearman}: expected a rank correlation in [-1, 1], or None (always trust the model)")
        if self.trust_window < 3:
            problems.append(f"trust_window={self.trust_window}: expected at least 3 audited candidates (fewer have no rank correlation)")
        if not (math.isfinite(self.probe_sigma) and self.probe_sigma > 0):
            problems.append(f"probe_sigma={self.probe_sigma}: expected a finite number > 0 (CMA-ES's initial step size)")
        if self.probe_popsize is not None and self.probe_popsize < 2:
            problems.append(f"probe_popsize={self.probe_popsize}: expected at least 2, or None (pycma's default)")
        counts = {"init_candidates": self.init_candidates, "eval_top_k": self.eval_top_k, "popsize": self.popsize,
                  "workers": self.workers, "horizon": self.horizon, "episode_steps": self.episode_steps, "budget_steps": self.budget_steps,
                  "imagine_starts": self.imagine_starts, "particles": self.particles, "ensemble": self.ensemble, "probe_screen": self.probe_screen}
        problems += [f"{name}={value}: expected >= 1" for name, value in counts.items() if value is not None and value < 1]
        if problems:
            raise ValueError("invalid evolve options: " + "; ".join(problems))


@dataclass
class Candidate:
    id: str
    params: np.ndarray
    operator: str
    generation: int
    imagined: Optional[float] = None  # the search's score
    real_return: Optional[float] = None  # mean over the training start states it was run on
    real_episodes: int = 0
    full: bool = False  # evaluated on every training start state
    starts: list[int] = field(default_factory=list)  # indices into the training start states, in the order run
    returns: list[float] = field(default_factory=list)  # its real return on each of them
    confirmed: Optional[bool] = None  # met the target and was run on the validation start states: did it hold?
    validation_return: Optional[float] = None  # mean over the validation start states

    def start_returns(self) -> dict[int, float]:
        """Training start index -> real return, for the start states it was run on."""
        return dict(zip(self.starts, self.returns))

    def meets(self, target: float) -> bool:
        """Whether this candidate is fully evaluated with a mean return of at least ``target``."""
        return self.full and self.real_return is not None and self.real_return >= target

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "params": [float(v) for v in self.params]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Candidate":
        return cls(**{**data, "params": np.asarray(data["params"], dtype=float)})


CONFIG_FIELDS = {f.name for f in fields(EvolveConfig)}


def resumed_config(
    manifest: dict[str, Any], *, budget: Optional[int], workers: Optional[int], options: dict[str, Any], backend: Optional[str] = None,
    budget_steps: Optional[int] = None,
) -> EvolveConfig:
    """The run's own config, with the budgets, workers and backend the caller may change."""
    run_id, saved = manifest["run_id"], dict(manifest["config"])
    if int(manifest.get("version") or 0) < MANIFEST_VERSION:
        raise RunError(
            f"run {run_id!r}: its manifest is version {manifest.get('version')!r}, written before raced evaluations and the search in "
            f"normalised coordinates (version {MANIFEST_VERSION}); this version cannot continue it. Resume it with the version that "
            "started it, or start a new run"
        )
    unknown = sorted(set(saved) - CONFIG_FIELDS)
    if unknown:
        raise RunError(f"run {run_id!r}: its manifest has options this version does not know ({', '.join(unknown)}); resume it with the version that started it")
    saved.setdefault("trust_spearman", None)  # a run started before probe search goes on without it
    saved.setdefault("probe_screen", 1)  # or before the model screened the probes
    mismatched = [f"{k}={v!r} (the run has {saved.get(k)!r})" for k, v in options.items() if saved.get(k) != v]
    if mismatched:
        raise RunError(
            f"run {run_id!r} was started with other options: {'; '.join(mismatched)}. A resumed run keeps its own options "
            "(only --budget, --budget-steps, --workers and --backend may change); resume it without these, or start a new run"
        )
    if budget is not None:
        spent = int(manifest["real_episodes"])
        if budget < spent:
            raise RunError(f"budget={budget}: run {run_id!r} has already spent {spent} real episodes; expected a budget of at least {spent}")
        saved["budget"] = budget
    if budget_steps is not None:
        spent_steps = int(manifest.get("env_steps") or 0)
        if budget_steps < spent_steps:
            raise RunError(f"budget_steps={budget_steps}: run {run_id!r} has already spent {spent_steps} real env steps; expected at least that")
        saved["budget_steps"] = budget_steps
    if workers is not None:
        saved["workers"] = workers
    if backend is not None:
        saved["backend"] = backend
    return EvolveConfig(**saved)

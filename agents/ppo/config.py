"""PPO configuration: a dataclass with a docstring per field (CleanRL style), loaded from YAML
(``configs/base.yaml``) and ``--set key=value`` overrides; every value is validated here, and a bad
one raises `ConfigError` naming the key, the value and what is allowed."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from genesis_fp16.base.extras import require
from genesis_fp16.precision.request import parse_mode
from genesis_fp16.base.settings import PrecisionMode


class ConfigError(ValueError):
    """An invalid PPO config value: names the key, the value and what is allowed."""


# the modes the PPO update runs in: FP32, or autocast to FP16 (with the gradient scaler) or BF16
PRECISIONS = (PrecisionMode.FP32, PrecisionMode.FP16, PrecisionMode.BF16, PrecisionMode.AUTO)
# keys that went, and what says the same now
REMOVED_KEYS = {
    "use_amp": "optimizations.precision (fp32, fp16, bf16 or auto)",
    "amp_dtype": "optimizations.precision (fp16 or bf16)",
}
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
VEC_ENV_MODES = ("auto", "sync", "async")
REMOVED_VEC_ENVS = {
    "envpool": "it never beat in-process envs (docs/PPO.md)",
    "mujoco": "the lean MuJoCo step now comes with cpu_fast_path on in-process envs",
}


@dataclass
class Optimizations:
    """The training-speed flags, ``training.optimizations`` in configs/base.yaml."""

    vec_env: str = "auto"
    """auto | sync | async. sync: in-process envs; async: one subprocess per env (gymnasium's AsyncVectorEnv);
    auto times one env step against a subprocess round trip at start-up and picks the faster (docs/PPO.md)."""
    use_subproc_vec_env: bool = False
    """true asks for subprocess (async) envs without measuring when vec_env is auto."""
    force_dummy_vec_env: bool = False
    """true forces in-process (sync) envs whatever vec_env says (conflicts with vec_env: async)."""
    precision: str = "fp32"
    """fp32 | fp16 | bf16 | auto: the precision of the PPO update through FP16Trainer (fp16 and bf16
    autocast; fp16 adds the gradient scaler; auto measures the update on copies of the network
    on a minibatch of its shapes before the trainer is built, genesis_fp16.precision.measure). Rollout inference stays
    FP32."""
    use_torch_compile: bool = False
    """torch.compile the policy/value network; a failure falls back to eager with a logged reason."""
    compile_mode: str = "default"
    """default | reduce-overhead | max-autotune, passed to torch.compile."""
    use_pinned_memory: bool = False
    """Rollout buffers in page-locked host memory and non-blocking copies to the GPU (only applies on CUDA)."""
    num_workers: int = 1
    """Torch CPU threads for inference and update (torch.set_num_threads); 0 keeps torch's default."""
    batch_inference: bool = True
    """One forward pass for all envs per step; false runs one forward per env."""
    inference_batch_size: int = 0
    """With batch_inference, envs per forward pass (0 = all envs in one pass)."""
    action_repeat: int = 1
    """Repeat each chosen action this many env steps, summing the rewards (stops at episode end)."""
    cpu_fast_path: bool = True
    """On the CPU without torch.compile: the same computation in fewer operations (NumPy tanh, the forward and
    the loss as single autograd nodes, the actor-only rollout step, the lean MuJoCo step; agents.ppo.fast)."""

    def validate(self) -> None:
        if self.vec_env in REMOVED_VEC_ENVS:
            raise ConfigError(
                f"training.optimizations.vec_env={self.vec_env!r} was removed: {REMOVED_VEC_ENVS[self.vec_env]}; "
                f"expected one of {', '.join(VEC_ENV_MODES)}"
            )
        _check_types(self, "training.optimizations.", {"action_repeat": 1})
        _choice("training.optimizations.vec_env", self.vec_env, VEC_ENV_MODES)
        self.precision = _precision("training.optimizations.precision", self.precision).value
        _choice("training.optimizations.compile_mode", self.compile_mode, COMPILE_MODES)
        if self.force_dummy_vec_env and self.vec_env == "async":
            raise ConfigError(
                "training.optimizations.force_dummy_vec_env=true conflicts with vec_env='async': "
                "set one of them (force_dummy_vec_env forces in-process envs)"
            )


@dataclass
class PPOConfig:
    """PPO hyperparameters (defaults: CartPole-v1 settings that reach a return of 500 within 100k steps,
    docs/PPO.md)."""

    env_id: str = "CartPole-v1"
    """gymnasium environment id (CartPole-v1, Pendulum-v1, HalfCheetah-v5, ...)."""
    seed: int = 1
    """Seed for torch, numpy and the environments."""
    total_steps: int = 100_000
    """Environment steps to train for (counted after action repeat: each repeated step counts)."""
    num_envs: int = 8
    """Parallel environments in the vector env."""
    num_steps: int = 128
    """Steps per env per rollout (rollout size = num_envs * num_steps)."""
    update_epochs: int = 4
    """Passes over each rollout."""
    minibatch_size: int = 256
    """Samples per gradient step."""
    learning_rate: float = 3e-3
    """Adam learning rate at the start (3e-3: CartPole reaches 500 within 100k steps, docs/PPO.md)."""
    anneal_lr: bool = True
    """Anneal the learning rate linearly to 0 over training."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    clip_coef: float = 0.2
    """PPO ratio clip."""
    clip_vloss: bool = False
    """Clip the value loss as in the PPO paper's code (off: with unnormalised returns it slows the critic)."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value loss coefficient: the loss adds ``vf_coef`` times the MSE of the value head, as SB3's ``vf_coef``
    (CleanRL's is
    on half the MSE)."""
    max_grad_norm: float = 0.5
    """Gradient clipping norm (applied by FP16Trainer after unscaling)."""
    norm_adv: bool = True
    """Normalise advantages per minibatch."""
    target_kl: Optional[float] = None
    """Stop the epoch loop early when the approximate KL exceeds this (None: never)."""
    hidden_size: int = 64
    """Width of the two tanh hidden layers (actor and critic, separate, like SB3's default MlpPolicy)."""
    normalize_obs: bool = False
    """Running observation normalisation (gymnasium NormalizeObservation) - useful for MuJoCo."""
    normalize_reward: bool = True
    """Running return normalisation (SB3's VecNormalize): the critic's gradient cannot starve the actor's
    (docs/PPO.md)."""
    device: str = "auto"
    """auto (cuda when available) | cpu | cuda | cuda:N."""
    eval_episodes: int = 20
    """Deterministic evaluation episodes at the end."""
    optimizations: Optimizations = field(default_factory=Optimizations)
    """The training-speed flags."""

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def num_iterations(self) -> int:
        per = self.batch_size * self.optimizations.action_repeat
        return max(1, self.total_steps // per)

    @property
    def steps_to_run(self) -> int:
        """The environment steps training runs: whole rollouts only, at least one."""
        return self.num_iterations * self.batch_size * self.optimizations.action_repeat

    def steps_note(self) -> Optional[str]:
        """One line when `steps_to_run` is not ``total_steps``: what was
        asked, what runs and why; ``None`` when they agree."""
        if self.steps_to_run == self.total_steps:
            return None
        repeat = self.optimizations.action_repeat
        rollout = f"{self.num_envs} envs x {self.num_steps} steps" + (
            f" x action_repeat {repeat}" if repeat > 1 else ""
        )
        per = self.batch_size * repeat
        way = "down" if self.steps_to_run < self.total_steps else "up"
        return (
            f"asked for {self.total_steps:,} env steps, runs {self.steps_to_run:,} = {self.num_iterations} rollout(s) "
            "of "
            f"{rollout}: PPO updates on whole rollouts, so the total is rounded {way} to a multiple of {per:,} "
            "(ask for such a multiple, or change num_envs/num_steps, to train exactly what you ask)"
        )

    def validate(self) -> "PPOConfig":
        _check_types(
            self,
            "training.",
            {
                "num_envs": 1,
                "num_steps": 1,
                "update_epochs": 1,
                "minibatch_size": 1,
                "total_steps": 1,
                "hidden_size": 1,
            },
        )
        for name in ("learning_rate", "clip_coef", "max_grad_norm", "target_kl"):
            value = getattr(self, name)
            if value is not None and not 0 < value < float("inf"):
                raise ConfigError(f"training.{name}={value!r}: expected a finite number > 0")
        for name, top in (("gamma", 1.0), ("gae_lambda", 1.0), ("ent_coef", float("inf")), ("vf_coef", float("inf"))):
            value = getattr(self, name)
            if not (0.0 <= value <= top and value < float("inf")):
                raise ConfigError(
                    f"training.{name}={value!r}: expected a finite number >= 0" + (" and <= 1" if top == 1.0 else "")
                )
        if self.minibatch_size > self.batch_size:
            raise ConfigError(
                f"training.minibatch_size={self.minibatch_size}: expected <= num_envs*num_steps={self.batch_size}"
            )
        if self.norm_adv and self.minibatch_size < 2:
            raise ConfigError(
                f"training.minibatch_size={self.minibatch_size}: expected >= 2 with norm_adv=true "
                "(the advantage standard deviation of one sample is undefined: every update would be NaN)"
            )
        if not (self.device in ("auto", "cpu") or re.fullmatch(r"cuda(:\d+)?", self.device)):
            raise ConfigError(f"training.device={self.device!r}: expected auto, cpu, cuda or cuda:N")
        if not self.env_id:
            raise ConfigError(f"training.env_id={self.env_id!r}: expected a gymnasium environment id")
        self.optimizations.validate()
        return self


def _check_types(obj: Any, prefix: str, minimum: dict[str, int]) -> None:
    """Every field of the type its default has (a float field takes an int; an Optional one None), ints >= ``minimum``
    (default 0)."""
    for f in dataclasses.fields(obj):
        value, kind = getattr(obj, f.name), f.type
        if value is None and kind.startswith("Optional"):
            continue
        if kind == "bool" and not isinstance(value, bool):
            raise ConfigError(f"{prefix}{f.name}={value!r}: expected true or false")
        if kind == "int" and (isinstance(value, bool) or not isinstance(value, int) or value < minimum.get(f.name, 0)):
            raise ConfigError(f"{prefix}{f.name}={value!r}: expected an integer >= {minimum.get(f.name, 0)}")
        if kind in ("float", "Optional[float]") and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or value != value
        ):
            raise ConfigError(f"{prefix}{f.name}={value!r}: expected a number")
        if kind == "str" and not isinstance(value, str):
            raise ConfigError(f"{prefix}{f.name}={value!r}: expected a string")


def _choice(key: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r}: expected one of {', '.join(allowed)}")


def _precision(key: str, value: Any) -> PrecisionMode:
    try:
        mode = parse_mode(value)
    except ValueError:
        mode = None
    if mode not in PRECISIONS:
        raise ConfigError(f"{key}={value!r}: expected one of {', '.join(m.value for m in PRECISIONS)}")
    return mode


_TRAINING_FIELDS = {f.name for f in dataclasses.fields(PPOConfig)} - {"optimizations"}
_OPT_FIELDS = {f.name for f in dataclasses.fields(Optimizations)}


def _apply(cfg: PPOConfig, key: str, value: Any, *, from_string: bool = False) -> None:
    """Set ``key`` (``training.`` optional, ``optimizations.`` optional for its fields); a ``--set`` string is read
    as YAML (1e-3, true, null), a YAML 1.1 string like 3e-4 (no dot) as a float where a float is expected."""
    parts = key.split(".")[1:] if key.startswith("training.") else key.split(".")
    if from_string:
        yaml = require("yaml", "the PPO config")
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{key}={value!r}: not a valid value ({exc})") from None
    if parts[-1] in REMOVED_KEYS and parts[:-1] in ([], ["optimizations"]):
        raise ConfigError(f"{key}={value!r}: this key was removed; use training.{REMOVED_KEYS[parts[-1]]}")
    if parts[-1] in _OPT_FIELDS and parts[:-1] in ([], ["optimizations"]):
        target, name = cfg.optimizations, parts[-1]
    elif len(parts) == 1 and parts[0] in _TRAINING_FIELDS:
        target, name = cfg, parts[0]
    else:
        allowed = sorted(_TRAINING_FIELDS) + [f"optimizations.{n}" for n in sorted(_OPT_FIELDS)]
        raise ConfigError(f"unknown config key {key!r}: expected training.<one of {', '.join(allowed)}>")
    current = getattr(target, name)
    if isinstance(value, str) and (isinstance(current, float) or current is None):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    setattr(target, name, value)


def _flatten(prefix: str, data: Any) -> list[tuple[str, Any]]:
    if not isinstance(data, dict):
        return [(prefix, data)]
    return [item for k, v in data.items() for item in _flatten(f"{prefix}.{k}", v)]


def load_config(
    path: Optional[Union[str, Path]] = None, overrides: Optional[list[str]] = None, **fields: Any
) -> PPOConfig:
    """Defaults < YAML file (``training:`` section) < ``key=value`` overrides < keyword fields."""
    cfg = PPOConfig()
    if path is not None:
        yaml = require("yaml", "the PPO config")
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("training", {}), dict):
            raise ConfigError(f"config file {path}: expected a mapping with a 'training:' section")
        for key, value in _flatten("training", data.get("training") or {}):
            _apply(cfg, key, value)
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. --set optimizations.precision=bf16")
        key, raw = item.split("=", 1)
        _apply(cfg, key.strip(), raw.strip(), from_string=True)
    for key, value in fields.items():
        if value is not None:
            _apply(cfg, key, value)
    return cfg.validate()


def as_dict(cfg: PPOConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)

"""What a PPO run returns and reports: `TrainResult` and its JSON form, the
optimization summary, and the ``torch.compile`` wrapper whose state it reports."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np
import torch

from genesis_fp16.base.telemetry import get_logger


@dataclass
class TrainResult:
    env_id: str
    seed: int
    env_steps: int
    wall_s: float
    env_steps_per_s: float
    time_split_s: dict[str, float]
    episode_returns: list[float]
    eval_return: Optional[float]
    eval_returns: list[float]
    optimizations: dict[str, Any]
    trainer_stats: dict[str, Any]
    iterations: int
    history: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The JSON form: the fields (``trainer_stats`` as ``trainer``), the episode returns as the mean of the last 20
        and a count."""
        out = dataclasses.asdict(self)
        returns, out["trainer"] = out.pop("episode_returns"), out.pop("trainer_stats")
        out.update(train_return_last20=float(np.mean(returns[-20:])) if returns else None, episodes=len(returns))
        return out


class CompiledFallback:
    """Calls ``torch.compile(fn)``; if compiling or running it raises, logs the reason once and runs ``fn`` eagerly
    from then on."""

    def __init__(self, fn: Callable[..., Any], mode: str, name: str) -> None:
        self.eager, self.name, self.mode = fn, name, mode
        self.failed_reason: Optional[str] = None
        try:
            self.compiled: Optional[Callable[..., Any]] = torch.compile(fn, mode=mode)
        except Exception as exc:  # noqa: BLE001 - any failure means: run eagerly
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        self.compiled = None
        text = str(exc).strip()
        self.failed_reason = f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
        get_logger("agents.ppo").warning(
            "ppo.compile_fallback", function=self.name, mode=self.mode, reason=self.failed_reason
        )

    @property
    def active(self) -> bool:
        return self.compiled is not None

    def __call__(self, *args: Any) -> Any:
        if self.compiled is not None:
            try:
                return self.compiled(*args)
            except Exception as exc:  # noqa: BLE001
                self._fail(exc)
        return self.eager(*args)


def optimization_summary(ppo: Any) -> list[tuple[str, str]]:
    """One (name, state) line per optimization of a `PPO`, printed at start."""
    o, cfg, vec, trainer = ppo.cfg.optimizations, ppo.cfg, ppo.vec_choice, ppo.trainer
    compiled = ppo.forward if isinstance(ppo.forward, CompiledFallback) else None
    if trainer.precision.name != "fp32":
        amp = f"on: {trainer.precision.name} autocast" + (", gradient scaler" if trainer.scaler.is_enabled() else "")
    else:
        amp = "off" if o.precision == "fp32" else f"off ({ppo.guard.training.decision.line()})"
    if compiled is None:
        compile_state = "off"
    elif compiled.active:
        compile_state = "on" + (f" (mode {compiled.mode})" if compiled.mode != "default" else "")
    else:
        compile_state = f"fallback to eager ({compiled.name}: {compiled.failed_reason})"
    if ppo.fast is not None:
        fast = "on: " + ", ".join(ppo.fast.pieces)
    else:
        fast = "off" + ("" if not o.cpu_fast_path else " (applies on the CPU without torch.compile)")
    pinned = (
        "on (pinned buffers, non_blocking copies)"
        if ppo.pin
        else ("off (CPU device: nothing to copy)" if o.use_pinned_memory else "off")
    )
    return [
        (
            "vectorized envs",
            f"{vec.mode if vec else type(ppo.envs).__name__} x{cfg.num_envs} ({vec.reason if vec else 'given'})",
        ),
        ("AMP", amp),
        ("torch.compile", compile_state),
        ("CPU fast path", fast),
        ("pinned memory", pinned),
        (
            "num_workers (torch threads)",
            f"{torch.get_num_threads()}" + (" (set)" if o.num_workers else " (torch default)"),
        ),
        (
            "batched inference",
            f"on, {o.inference_batch_size or cfg.num_envs} envs per forward"
            if o.batch_inference
            else "off (one forward per env)",
        ),
        ("action repeat", f"{o.action_repeat}" + (" (off)" if o.action_repeat == 1 else " (rewards summed)")),
    ]


def resolved_optimizations(ppo: Any) -> dict[str, Any]:
    """The configured optimizations and what each resolved to (a result's ``optimizations``)."""
    o = dataclasses.asdict(ppo.cfg)["optimizations"]
    o["resolved"] = dict(optimization_summary(ppo))
    o["vec_env_resolved"] = ppo.vec_choice.mode if ppo.vec_choice else None
    o["precision_requested"], o["precision"] = o["precision"], ppo.trainer.precision.name
    o["compile_active"] = isinstance(ppo.forward, CompiledFallback) and ppo.forward.active
    o["fast_path_pieces"] = list(ppo.fast.pieces) if ppo.fast is not None else []
    o["pinned_active"] = ppo.pin
    return o

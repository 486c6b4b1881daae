"""A measured ``auto``: a plain function over (model, optimizer, batch, loss),
and the host-level cache of what it measured.

`measure_auto` trains copies of the model and optimizer for a few steps in
each precision the device runs and returns the `Calibration`
(`genesis_fp16.calibration`: interleaved rounds, the lower bound of each
speed-up against the margin); the model, its optimizer, their gradients and
every RNG are left as they were. `measured_auto` is the cached path: the
host cache's calibration for this workload if there is one, else a
measurement, written to the cache. Its result feeds
`genesis_fp16.decision.decide_precision`; no trainer measures by itself.

The cache (`genesis_fp16.calibration_cache.PrecisionCache`) is one JSON file
per user (the setting ``precision_cache``, default
``~/.cache/genesis-fp16/precision.json``), shared by every state dir: a second
run in a fresh state dir reuses the first one's decision, so the same seed
gives the same run on a quiet machine and a loaded one. It is untrusted
input: an entry is used only when its key and workload are this workload's
and its verdict follows from its own figures; a file that is not a regular
file of our format reads as absent, with one warning, and is never
overwritten. Writers merge under a lock (temp file, fsync, rename); two
processes measuring the same new workload at once both measure, and the
last write of that entry wins. ``genesis-fp16 doctor --recalibrate`` empties it.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable, Optional, Union

import torch

from . import calibration as cal
from .calibration_cache import PrecisionCache
from .config import FP16TrainingConfig
from .decision import PrecisionDecision, Source
from .settings import PrecisionMode, Settings, load_settings
from .telemetry import get_logger

LossFn = Callable[[torch.nn.Module, Any], torch.Tensor]


def _copy_trainer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, config: FP16TrainingConfig,
                  device: torch.device, mode: PrecisionMode, name: str, trainer_cls: Callable[..., Any]) -> Any:
    try:
        model, optimizer = copy.deepcopy((model, optimizer))  # one memo: the copy's optimizer holds the copy's parameters
    except Exception as exc:
        raise cal.CalibrationUnavailable(f"the model or its optimizer cannot be copied ({type(exc).__name__}: {exc})") from None
    optimizer.zero_grad(set_to_none=True)
    config = dataclasses.replace(config, precision=mode.value, enabled=True, device=str(device))
    decision = PrecisionDecision(mode, Source.EXPLICIT, "a calibration copy", mode, str(device))
    return trainer_cls(model, optimizer, config, name=f"{name}.calibration.{mode.value}", decision=decision)


def measure_auto(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Any, loss_fn: LossFn, *,
    trainer_cls: Callable[..., Any], device: Union[str, torch.device, None] = None, config: Optional[FP16TrainingConfig] = None,
    name: str = "auto",
) -> cal.Calibration:
    """Measure now what ``auto`` picks for this workload, on copies trained by
    ``trainer_cls`` (`FP16Trainer`: passed in, since the trainer measures a
    deferred ``auto`` through this module and it cannot import the trainer): the
    model, its optimizer, their gradients and the RNGs are left as they were;
    no cache is read or written. Raises `CalibrationUnavailable` where the
    workload cannot be measured (a model that cannot be copied, a loss that
    trains another model than the one it is given, a step that fails)."""
    config = config or FP16TrainingConfig()
    device = torch.device(device) if device is not None else next((p.device for p in model.parameters()), torch.device("cpu"))
    described = cal.workload(model, optimizer, batch, device)
    key = cal.workload_key(described)
    real = list(model.parameters())
    grads = [None if p.grad is None else p.grad.detach().clone() for p in real]
    clock = cal.clock(device)
    started = clock()

    def runner(trainer: Any) -> Callable[[int], None]:
        def run(n: int) -> None:
            for _ in range(n):
                trainer.backward_and_step(trainer.training_step(batch, loss_fn))
        return run

    failure: Optional[BaseException] = None
    copies: dict[PrecisionMode, Any] = {}
    try:
        with cal.preserved_rng(device):
            copies = {m: _copy_trainer(model, optimizer, config, device, m, name, trainer_cls) for m in cal.candidates(device)}
            seconds, losses, failed, rounds = cal.measure(
                {m: runner(t) for m, t in copies.items()},
                {m: (lambda t=t: cal.final_loss(t.model, batch, loss_fn)) for m, t in copies.items()},
                device,
            )
    except cal.CalibrationUnavailable:
        raise
    except Exception as exc:  # a real fault of the loss shows again in the real step that follows, unmeasured
        failure = exc
    finally:
        touched = any((p.grad is not None) != (g is not None) or (g is not None and not torch.equal(p.grad, g)) for p, g in zip(real, grads))
        for p, g in zip(real, grads):
            p.grad = g
    if touched:
        raise cal.CalibrationUnavailable("the loss function trains another model than the one it is given")
    if failure is not None:
        raise cal.CalibrationUnavailable(f"a calibration step failed ({type(failure).__name__}: {failure})")
    steps = max(t.training_steps for t in copies.values())
    return cal.measured(key, described, seconds, losses, clock() - started, steps, failed, rounds)


@dataclasses.dataclass(frozen=True)
class Measurement:
    """What `measured_auto` found: a calibration (None: it could not measure, ``why`` says why), and whether it came from the cache."""

    calibration: Optional[cal.Calibration]
    cached: bool = False
    why: str = ""


def cached_calibration(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Any,
                       device: Union[str, torch.device], settings: Optional[Settings] = None) -> Optional[cal.Calibration]:
    """The host cache's calibration of this workload, or None (nothing is measured)."""
    described = cal.workload(model, optimizer, batch, device)
    found = PrecisionCache.from_settings(settings).get(cal.workload_key(described), described)
    if found is None or PrecisionMode(found.precision) not in cal.candidates(device):
        return None
    return found


def measured_auto(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Any, loss_fn: LossFn, *, trainer_cls: Callable[..., Any],
    device: Union[str, torch.device, None] = None, settings: Optional[Settings] = None,
    config: Optional[FP16TrainingConfig] = None, name: str = "auto",
) -> Measurement:
    """The host cache's calibration of this workload, else `measure_auto`
    written to the cache. Never raises for a workload that cannot be
    measured: the `Measurement` says why, and the decision falls back to the rule."""
    settings = settings or load_settings(check_names=False)
    device = torch.device(device) if device is not None else next((p.device for p in model.parameters()), torch.device("cpu"))
    found = cached_calibration(model, optimizer, batch, device, settings)
    if found is not None:
        return Measurement(found, cached=True)
    try:
        result = measure_auto(model, optimizer, batch, loss_fn, trainer_cls=trainer_cls, device=device, config=config, name=name)
    except cal.CalibrationUnavailable as exc:
        return Measurement(None, why=str(exc))
    try:
        PrecisionCache.from_settings(settings).put(result)
    except OSError as exc:  # the decision stands for this run; the next one measures again
        get_logger("genesis_fp16.autotune").warning("precision.calibration_not_saved", key=result.key, reason=str(exc))
    return Measurement(result)

"""A measured ``auto``: a plain function over (model, optimizer, batch, loss),
and the host-level cache of what it measured.

`measure_auto` trains copies of the model and optimizer for a few steps in
each precision the device runs and returns the `Calibration`
(`genesis_fp16.precision.calibration`: interleaved rounds, the lower bound of each
speed-up against the margin); the model, its optimizer, their gradients and
every RNG are left as they were. `measured_auto` is the cached path: the
host cache's calibration for this workload if there is one, else a
measurement, written to the cache. Its result feeds
`genesis_fp16.precision.decision.decide`; no trainer measures by itself (the
copies are trained by a trainer the caller hands in: this module imports none).

The cache (`genesis_fp16.precision.cache.PrecisionCache`) is one JSON file
per user (the setting ``precision_cache``, default
``~/.cache/genesis-fp16/precision.json``), shared by every state dir: a second
run in a fresh state dir reuses the first one's decision, so the same seed
gives the same run on a quiet machine and a loaded one. A decision measured
under a 1-minute load average above the number of CPUs is not kept: it
decides its own run, and the next run measures again. It is untrusted
input: an entry is used only when its key and workload are this workload's
and its verdict follows from its own figures; a file that is not a regular
file of our format reads as absent, with one warning, and is never
overwritten. Writers merge under a lock (temp file, fsync, rename); two
processes measuring the same new workload at once both measure, and the
last write of that entry wins. ``genesis-fp16 doctor --recalibrate`` empties it.
"""

from __future__ import annotations

import copy
import itertools
import dataclasses
import math
from typing import Any, Callable, ContextManager, Iterable, Optional, Protocol, Union

import torch

from genesis_fp16.base.settings import PrecisionMode, Settings, load_settings
from genesis_fp16.base.telemetry import get_logger
from genesis_fp16.precision import calibration as cal
from genesis_fp16.precision.cache import PrecisionCache

LossFn = Callable[[torch.nn.Module, Any], torch.Tensor]
LOSS_CALLS_PER_PRECISION = cal.WARMUP_STEPS + 1 + cal.ROUNDS * cal.STEPS_PER_ROUND + 1
"""The loss's calls per precision measured: the warm-up, the probe step, the timed rounds and the final loss check
(a precision out at the probe stops after 2); on a CPU that runs FP32, BF16 and FP16, at most 1 + 3 x 18 = 55."""


class CalibrationTrainer(Protocol):
    """What the measurement needs of a trainer of one precision over a copy of the model: the path its steps will
    run, a training window where one can run (on CUDA its captured steps), else the per-step path."""

    model: torch.nn.Module
    training_steps: int

    def training_step(self, batch: Any, compute_loss_fn: LossFn) -> torch.Tensor: ...

    def backward_and_step(self, loss: torch.Tensor) -> bool: ...

    def autocast(self) -> ContextManager[Any]: ...

    def window_blocker(self) -> Optional[str]: ...

    @property
    def window_warmup_steps(self) -> int: ...

    def train_window(self, batches: Iterable[Any], compute_loss_fn: LossFn) -> Any: ...


CopyTrainer = Callable[[torch.nn.Module, torch.optim.Optimizer, PrecisionMode], CalibrationTrainer]
"""``copy_trainer(model, optimizer, mode)``: a trainer of ``mode`` over copies the measurement made (the training
part gives one: `genesis_fp16.training.trainer.calibration_copies`; the measurement imports no trainer)."""


def _copies(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, mode: PrecisionMode, copy_trainer: CopyTrainer
) -> CalibrationTrainer:
    try:
        model, optimizer = copy.deepcopy(
            (model, optimizer)
        )  # one memo: the copy's optimizer holds the copy's parameters
    except Exception as exc:
        raise cal.CalibrationUnavailable(
            f"the model or its optimizer cannot be copied ({type(exc).__name__}: {exc})"
        ) from None
    optimizer.zero_grad(set_to_none=True)
    return copy_trainer(model, optimizer, mode)


def measure_auto(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Any,
    loss_fn: LossFn,
    *,
    copy_trainer: CopyTrainer,
    device: Union[str, torch.device, None] = None,
) -> cal.Calibration:
    """Measure now what ``auto`` picks for this workload, on copies trained by
    ``copy_trainer`` (a trainer of each precision, from the training part).
    The caller's world is left as a named precision would leave it: the model's
    weights, buffers (running statistics), gradients and modes, its optimizer,
    and the global RNGs (torch's, NumPy's, Python's ``random``); no cache is
    read or written. The loss is called `LOSS_CALLS_PER_PRECISION` times per
    precision the device runs, and once more first (`_probe`). Raises
    `CalibrationUnavailable` where the workload cannot or should not be
    measured: an empty batch, a loss that is not finite on it, a model that
    cannot be copied, a loss that trains another model than the one it is
    given, a step that fails."""
    device = (
        torch.device(device)
        if device is not None
        else next((p.device for p in model.parameters()), torch.device("cpu"))
    )
    empty = cal.unmeasurable_batch(batch)
    if empty is not None:
        raise cal.CalibrationUnavailable(empty)
    described = cal.workload(model, optimizer, batch, device)
    key = cal.workload_key(described)
    clock = cal.clock(device)
    started = clock()

    def runner(trainer: CalibrationTrainer) -> Callable[[int], None]:
        first = [True]

        def run(n: int) -> None:
            if trainer.window_blocker() is None:  # what the learners run: a window (on CUDA, captured steps)
                if first[0]:  # the untimed warm-up call: its capture too, out of the timed rounds
                    n, first[0] = max(n, trainer.window_warmup_steps), False
                trainer.train_window(itertools.repeat(batch, n), loss_fn)
                return
            for _ in range(n):
                trainer.backward_and_step(trainer.training_step(batch, loss_fn))

        return run

    copies: dict[PrecisionMode, Any] = {}
    with cal.preserved_rng(device), cal.preserved_module(model):
        copies = {m: _copies(model, optimizer, m, copy_trainer) for m in cal.candidates(device)}
        _probe(model, copies[PrecisionMode.FP32], batch, loss_fn)
        try:
            seconds, losses, failed, rounds = cal.measure(
                {m: runner(t) for m, t in copies.items()},
                {m: (lambda t=t: cal.final_loss(t.model, batch, loss_fn)) for m, t in copies.items()},
                device,
            )
        except Exception as exc:  # a real fault of the loss shows again in the real step that follows, unmeasured
            raise cal.CalibrationUnavailable(f"a calibration step failed ({type(exc).__name__}: {exc})") from None
    fp32_loss = losses.get(PrecisionMode.FP32.value, math.nan)
    if not math.isfinite(fp32_loss):
        raise cal.CalibrationUnavailable(f"FP32's own loss is not finite after the calibration steps ({fp32_loss})")
    steps = max(t.training_steps for t in copies.values())
    return cal.measured(key, described, seconds, losses, clock() - started, steps, failed, rounds)


def _probe(model: torch.nn.Module, fp32: Any, batch: Any, loss_fn: LossFn) -> None:
    """One loss of the FP32 copy on ``batch``, before any timed step: not measured (`CalibrationUnavailable`) when
    it is not finite (a NaN batch decides nothing, and is never cached) or when it reaches ``model`` itself (a loss
    that closes over the caller's model would train that model, not the copy it is given)."""
    real = [p for p in model.parameters() if p.requires_grad]
    buffers = [b.detach().clone() for b in model.buffers()]
    try:
        with fp32.autocast():
            loss = loss_fn(fp32.model, batch)
        reached = (
            any(g is not None for g in torch.autograd.grad(loss.sum(), real, allow_unused=True))
            if real and loss.requires_grad
            else False
        )
    except Exception as exc:
        raise cal.CalibrationUnavailable(
            f"the loss failed on a copy of the model ({type(exc).__name__}: {exc})"
        ) from None
    if reached or any(not torch.equal(b, kept) for b, kept in zip(model.buffers(), buffers)):
        raise cal.CalibrationUnavailable("the loss function trains another model than the one it is given")
    value = float(loss.detach().float().reshape(-1)[0]) if loss.numel() else math.nan
    if not math.isfinite(value):
        raise cal.CalibrationUnavailable(
            f"the loss on the first batch is not finite ({value}) in FP32: nothing to measure"
        )


@dataclasses.dataclass(frozen=True)
class Measurement:
    """What `measured_auto` found: a calibration (None: it could not measure, ``why`` says why), and whether it came
    from the cache."""

    calibration: Optional[cal.Calibration]
    cached: bool = False
    why: str = ""


def cached_calibration(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Any,
    device: Union[str, torch.device],
    settings: Optional[Settings] = None,
) -> Optional[cal.Calibration]:
    """The host cache's calibration of this workload, or None (nothing is measured)."""
    described = cal.workload(model, optimizer, batch, device)
    found = PrecisionCache.from_settings(settings).get(cal.workload_key(described), described)
    if found is None or PrecisionMode(found.precision) not in cal.candidates(device):
        return None
    return found


def measured_auto(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Any,
    loss_fn: LossFn,
    *,
    copy_trainer: CopyTrainer,
    device: Union[str, torch.device, None] = None,
    settings: Optional[Settings] = None,
) -> Measurement:
    """The host cache's calibration of this workload, else `measure_auto`
    written to the cache. Never raises for a workload that cannot be
    measured: the `Measurement` says why, and the decision falls back to the rule."""
    settings = settings or load_settings(check_names=False)
    device = (
        torch.device(device)
        if device is not None
        else next((p.device for p in model.parameters()), torch.device("cpu"))
    )
    found = cached_calibration(model, optimizer, batch, device, settings)
    if found is not None:
        return Measurement(found, cached=True)
    try:
        result = measure_auto(model, optimizer, batch, loss_fn, copy_trainer=copy_trainer, device=device)
    except cal.CalibrationUnavailable as exc:
        return Measurement(None, why=str(exc))
    busy = cal.loaded(result.load)
    if busy is not None:  # the decision stands for this run; a quiet one measures it again and keeps that
        result = dataclasses.replace(
            result, reason=f"{result.reason}; not kept in the host cache ({busy}): the next run measures again"
        )
        get_logger("genesis_fp16.precision.measure").info(
            "precision.calibration_not_cached", key=result.key, reason=busy
        )
        return Measurement(result)
    try:
        PrecisionCache.from_settings(settings).put(result)
    except OSError as exc:  # the decision stands for this run; the next one measures again
        get_logger("genesis_fp16.precision.measure").warning(
            "precision.calibration_not_saved", key=result.key, reason=str(exc)
        )
    return Measurement(result)

"""``precision=auto`` by measurement: time each precision on the workload itself.

No flag rule is right for every model: on one AMX CPU BF16 trains a 64-unit
MLP at 0.70x FP32 and a 1024-unit one at 2.96x; on an AVX512-BF16 CPU
without AMX the same rule would keep FP32 for a model that trains 1.99x
faster in BF16 (issue "auto decides by measuring"). This module is the
statistics of that measurement: `measure` times each precision the device
runs (`candidates`) on copies (`genesis_fp16.precision.measure.measure_auto` builds
them), warm-up excluded, the precisions interleaved round by round;
`loss_ratio` checks each against FP32 with the canary's rule; `decide` picks
the fastest that passes when the *lower bound* of its speed-up
(`lower_bound`: the slowest of `ROUNDS` paired rounds) is at least
`SPEED_MARGIN` (else FP32), so that a speed-up near the margin does not flip
the decision from one run to the next (issue 37).

A workload is keyed by `workload` (parameter shapes and dtypes, optimizer,
batch shapes, device and its name, the CPU flags that matter, torch
version, torch threads); the decision is kept in the host-level cache
(`genesis_fp16.precision.cache.PrecisionCache`) and reused until the key changes.
`genesis-fp16 doctor` lists the decisions; ``doctor --recalibrate`` clears them.

A record read back is untrusted input (issue 44): `calibration_record.parse_record` checks
every field's type and range, that its key is the hash of its workload (and,
given one, that the workload is this one), and takes the verdict again from
its own figures with `decide`, today's rule: a verdict that does not follow
from them (an edited file) makes the record absent, never used. Each record
says when it was measured, by which process (host, pid, command) and under
what load (`os.getloadavg`), and its reason says so (`provenance`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import socket
import statistics
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterator, Optional, Union

import torch

from genesis_fp16.precision import capability
from genesis_fp16.precision.capability import Support
from genesis_fp16.precision.quality import CANARY_LOSS_RATIO, loss_ratio, passes  # noqa: F401  (what a record's check is)
from genesis_fp16.base.settings import PrecisionMode

RECORD_VERSION = 3
"""Of the key and the record: a new version ignores (and replaces) older decisions. 3: each record
says when, by which process and under what load it was measured (`provenance`); a record of 2 is absent."""
CANDIDATE_ORDER = (PrecisionMode.FP32, PrecisionMode.BF16, PrecisionMode.FP16)
"""What ``auto`` may pick (never tf32 or fp16-true: those are asked for by name)."""
WARMUP_STEPS = 1
"""Untimed optimizer steps per precision first (allocator, autocast caches, lazy init)."""
PROBE_SLOWER = 2.0
"""One timed step each first: a precision this many times slower than FP32 there is out (it cannot
win); it is not timed further and its loss is not checked (its record says so with no loss ratio)."""
ROUNDS = 5
"""Timed rounds of the precisions still in; each times every one in turn, so drift in the machine's
load hits all alike. Five, so that the slowest round's speed-up is a 97% lower bound of the median
one (`lower_bound`)."""
STEPS_PER_ROUND = 3
"""Optimizer steps per precision and round; a precision's time is its median round's, per step."""
SPEED_MARGIN = 1.05
"""A reduced precision is picked only when the lower bound of its speed-up (`lower_bound`) is at
least this: within 5% the measurement cannot tell them apart, and FP32 is the safer of two equals."""
CPU_FLAGS_OF_INTEREST = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile", "f16c")

INF_TEXT = "inf"


class CalibrationUnavailable(RuntimeError):
    """The workload cannot be measured (e.g. its loss ignores the model it is given)."""


def candidates(device: Union[str, torch.device]) -> list[PrecisionMode]:
    """The precisions ``auto`` times on ``device``: FP32 and each of BF16 and
    FP16 the device runs at all (slowly included: measuring is the point)."""
    return [m for m in CANDIDATE_ORDER if capability.device_support(device, m) != Support.NONE]


def device_name(device: Union[str, torch.device]) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        return capability.cpu_name()
    return device.type


def batch_signature(batch: Any) -> Any:
    """The shapes and dtypes of ``batch`` (tensors, nested in tuples, lists and dicts); other values by type."""
    if isinstance(batch, torch.Tensor):
        return [list(batch.shape), str(batch.dtype).removeprefix("torch.")]
    if isinstance(batch, (tuple, list)):
        return [batch_signature(item) for item in batch]
    if isinstance(batch, Mapping):
        return {str(k): batch_signature(v) for k, v in sorted(batch.items(), key=lambda kv: str(kv[0]))}
    return type(batch).__name__


def workload(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Any, device: Union[str, torch.device]
) -> dict[str, Any]:
    """What the decision depends on, as plain data; `workload_key` hashes it."""
    device = torch.device(device)
    shapes = [[list(p.shape), str(p.dtype).removeprefix("torch.")] for p in model.parameters()]
    digest = hashlib.sha256(json.dumps(shapes).encode()).hexdigest()[:16]
    flags = sorted(f for f in capability.cpu_flags() if f in CPU_FLAGS_OF_INTEREST)
    return {
        "version": RECORD_VERSION,
        "model": type(model).__name__,
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "tensors": len(shapes),
        "signature": digest,
        "optimizer": type(optimizer).__name__,
        "batch": batch_signature(batch),
        "device": device.type,
        "device_name": device_name(device),
        "cpu_flags": flags,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def workload_key(described: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:20]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_step(mode: PrecisionMode, run: Callable[[], None], steps: int, device: Union[str, torch.device]) -> float:
    """Seconds per optimizer step of ``run()`` (``steps`` of them) for ``mode``
    on ``device``'s clock (`clock`: a CPU clock on a CPU, which other processes'
    load does not move; on CUDA the wall time between two synchronisations).
    Tests patch this to inject timings."""
    device = torch.device(device)
    read = clock(device)
    _sync(device)
    start = read()
    run()
    _sync(device)
    return (read() - start) / steps


def measure(
    runs: Mapping[PrecisionMode, Callable[[int], None]],
    losses: Mapping[PrecisionMode, Callable[[], float]],
    device: Union[str, torch.device],
) -> tuple[dict[str, float], dict[str, float], dict[str, str], dict[str, list[float]]]:
    """Time ``runs[mode](n)`` (n optimizer steps of that precision's copy):
    `WARMUP_STEPS` untimed, one probe step (a precision `PROBE_SLOWER` times
    slower than FP32 is out), then `ROUNDS` interleaved rounds of
    `STEPS_PER_ROUND` for the others. Returns (seconds per step, final loss,
    failed, rounds) per precision: the losses of those still in only, all after the
    same steps; ``failed`` names each reduced precision whose steps raised
    (e.g. oneDNN has no FP16 LSTM kernel on a CPU) with the error: it is out;
    ``rounds`` the seconds per step of each timed round, in order (for
    `lower_bound`). FP32's own error is raised."""
    fp32 = PrecisionMode.FP32
    failed: dict[str, str] = {}
    probe: dict[PrecisionMode, float] = {}

    def attempt(mode: PrecisionMode, step: Callable[[], float]) -> Optional[float]:
        if mode == fp32:
            return step()
        try:
            return step()
        except Exception as exc:  # this precision cannot run the workload here: it is out, with the reason
            text = str(exc).strip()
            failed[mode.value] = f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:300]
            return None

    for mode, run in runs.items():
        seconds = attempt(mode, lambda r=run, m=mode: (r(WARMUP_STEPS), time_step(m, lambda: r(1), 1, device))[1])
        if seconds is not None:
            probe[mode] = seconds
    still_in = [m for m in probe if m == fp32 or probe[m] <= PROBE_SLOWER * probe[fp32]]
    rounds: dict[PrecisionMode, list[float]] = {m: [] for m in still_in}
    for _ in range(ROUNDS):
        for m in [m for m in still_in if m.value not in failed]:
            seconds = attempt(m, lambda m=m: time_step(m, lambda: runs[m](STEPS_PER_ROUND), STEPS_PER_ROUND, device))
            if seconds is not None:
                rounds[m].append(seconds)
    timed = {
        m.value: statistics.median(rounds[m]) if rounds.get(m) else probe[m] for m in probe if m.value not in failed
    }
    per_round = {m.value: list(rounds[m]) for m in still_in if m.value not in failed and rounds.get(m)}
    return timed, {m.value: losses[m]() for m in still_in if m.value not in failed}, failed, per_round


def speeds(seconds: Mapping[str, float]) -> dict[str, float]:
    """Each precision's speed against FP32's: FP32's seconds per step over its own."""
    fp32 = seconds[PrecisionMode.FP32.value]
    return {m: fp32 / s if s > 0 else math.inf for m, s in seconds.items()}


def lower_bound(rounds: Mapping[str, list[float]]) -> dict[str, float]:
    """Each precision's speed-up against FP32 at its worst round: the rounds
    are interleaved, so round ``i`` of a precision and round ``i`` of FP32 ran
    under the same load and their ratio is one paired sample; the smallest of
    `ROUNDS` samples lies below their median with probability ``1 - 0.5**ROUNDS``
    (97% for 5), with no assumption on how the load is distributed (an order
    statistic; a bootstrap of 5 samples would claim more than they hold).
    A precision with fewer rounds than FP32 pairs only what it has; one
    without rounds (out at the probe) is absent."""
    fp32 = rounds.get(PrecisionMode.FP32.value) or []
    out: dict[str, float] = {}
    for m, times in rounds.items():
        pairs = [f / t if t > 0 else math.inf for f, t in zip(fp32, times)]
        if pairs:
            out[m] = min(pairs)
    return out


def decide(
    seconds: Mapping[str, float],
    ratios: Mapping[str, float],
    *,
    limit: float = CANARY_LOSS_RATIO,
    margin: float = SPEED_MARGIN,
    errors: Optional[Mapping[str, str]] = None,
    low: Optional[Mapping[str, float]] = None,
) -> tuple[str, str, dict[str, bool]]:
    """(precision, reason, passed): among the precisions whose loss ratio is
    at most ``limit`` and whose speed-up's lower bound (``low``, `lower_bound`;
    the median speed-up where ``low`` has none) is at least ``margin``, the
    fastest by median; else FP32. A precision without a ratio (out on speed at
    the probe) does not pass; ``errors`` (precisions that could not run, with
    why) go into the reason."""
    fp32 = PrecisionMode.FP32.value
    passed = {m: m == fp32 or passes(ratios.get(m), limit) for m in seconds}
    speed = speeds(seconds)
    bound = {m: (low or {}).get(m, speed[m]) for m in seconds}
    figures = ", ".join(f"{m} {speed[m]:.2f}x (at worst {bound[m]:.2f}x)" for m in seconds if m != fp32)
    reduced = [m for m in seconds if m != fp32 and passed[m]]
    failing = [
        f"{m} (loss {ratios[m]:.3g}x fp32, over {limit})"
        for m in seconds
        if m != fp32 and m in ratios and not passed[m]
    ]
    failed_text = f"; failed the FP32 check: {', '.join(failing)}" if failing else ""
    failed_text += "".join(f"; {m} could not run ({why})" for m, why in (errors or {}).items())
    if not reduced:
        return fp32, f"measured here: {figures or 'only fp32 runs'} fp32{failed_text}: fp32", passed
    clear = [m for m in reduced if bound[m] >= margin]
    if clear:
        best = min(clear, key=lambda m: seconds[m])
        return best, f"measured here: {figures} fp32{failed_text}: {best} is the fastest that passes", passed
    return (
        fp32,
        f"measured here: {figures} fp32{failed_text}: none at least {margin:.2f}x fp32 in every round, so fp32",
        passed,
    )


def this_process() -> dict[str, Any]:
    """Who measures: this host's name, this process's id and its command (the
    program and its subcommand, e.g. ``genesis-fp16 evolve``; no options, no paths)."""
    argv = list(sys.argv) or [""]
    program = os.path.basename(argv[0]) or "python"
    if program == "__main__.py":  # python -m <package>
        program = os.path.basename(os.path.dirname(argv[0])) or program
    words = [program] + [a for a in argv[1:2] if a and not a.startswith("-") and "/" not in a and os.sep not in a]
    return {"host": socket.gethostname()[:255], "pid": os.getpid(), "command": " ".join(words)[:120]}


def current_load() -> dict[str, Any]:
    """The load the measurement ran under: ``os.getloadavg()`` (1, 5 and 15
    minutes; None where the OS has none) and the number of CPUs."""
    try:
        average: Optional[list[float]] = [round(float(v), 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        average = None
    return {"average": average, "cpus": os.cpu_count()}


def provenance(at: str, measured_by: Mapping[str, Any], load: Mapping[str, Any]) -> str:
    """When, by which process and under what load a record was measured, in words."""
    who = (
        f"pid {measured_by.get('pid')} ({measured_by.get('command') or 'unknown command'}) on host "
        f"{measured_by.get('host') or 'unknown'}"
    )
    average, cpus = load.get("average"), load.get("cpus")
    if average:
        under = (
            "load average "
            + "/".join(f"{v:.2f}" for v in average)
            + " (1/5/15 min)"
            + (f" on {cpus} CPUs" if cpus else "")
        )
    else:
        under = "load unknown"
    return f"measured {at} by {who}, {under}"


def verdict(
    seconds: Mapping[str, float],
    loss_ratios: Mapping[str, Optional[float]],
    failed: Mapping[str, str],
    low: Mapping[str, float],
    at: str,
    measured_by: Mapping[str, Any],
    load: Mapping[str, Any],
) -> tuple[str, str, dict[str, bool]]:
    """(precision, reason, passed) by `decide` from a record's own figures: what
    `measured` decides and what `calibration_record.parse_record` checks a record read back against."""
    ratios = {m: r for m, r in loss_ratios.items() if r is not None}
    precision, reason, passed = decide(seconds, ratios, errors=failed, low=low)
    return precision, f"{provenance(at, measured_by, load)}: {reason.removeprefix('measured here: ')}", passed


@dataclass(frozen=True)
class Calibration:
    """One workload's measurement and the decision taken from it."""

    key: str
    workload: dict[str, Any]
    precision: str
    """The verdict: what ``auto`` trains this workload in."""
    reason: str
    seconds: dict[str, float]
    """Median seconds per optimizer step, per precision timed."""
    speed: dict[str, float]
    """FP32's seconds over each precision's (above 1: faster than FP32)."""
    speed_low: dict[str, float]
    """The lower bound of each speed-up (`lower_bound`: the worst paired round); what `decide` compares with the
    margin."""
    loss_ratio: dict[str, Optional[float]]
    """Each precision's loss after the calibration steps against FP32's (`loss_ratio`; inf when
    not finite); None for one out on speed at the probe (not checked)."""
    passed: dict[str, bool]
    failed: dict[str, str]
    """Each precision whose steps raised on this workload, with the error (it was out)."""
    cost_s: float
    """What the calibration took, on the same clock (the copies' steps included, the warm-up too)."""
    steps: int
    """Optimizer steps per precision (warm-up included)."""
    at: str
    """When it was measured (UTC, ISO 8601)."""
    measured_by: dict[str, Any] = field(default_factory=dict)
    """Which process measured it: ``host``, ``pid``, ``command`` (`this_process`)."""
    load: dict[str, Any] = field(default_factory=dict)
    """The load it was measured under: ``average`` (1/5/15 min, or None) and ``cpus`` (`current_load`)."""
    version: int = RECORD_VERSION

    def provenance(self) -> str:
        """When, by which process and under what load this was measured, in words."""
        return provenance(self.at, self.measured_by, self.load)

    def as_record(self) -> dict[str, Any]:
        """Plain JSON data (a non-finite number as the string ``inf``)."""
        record = asdict(self)
        for name in ("seconds", "speed", "speed_low", "loss_ratio"):
            record[name] = {
                m: (INF_TEXT if v is not None and not math.isfinite(v) else v) for m, v in record[name].items()
            }
        return record


def measured(
    key: str,
    described: dict[str, Any],
    seconds: dict[str, float],
    losses: dict[str, float],
    cost_s: float,
    steps: int,
    failed: Optional[dict[str, str]] = None,
    rounds: Optional[Mapping[str, list[float]]] = None,
) -> Calibration:
    """The `Calibration` of a measurement (`measure`): per-step seconds, final
    losses for the precisions not out on speed, and each round's seconds;
    stamped with the time, this process (`this_process`) and the load (`current_load`)."""
    fp32 = PrecisionMode.FP32.value
    ratios = {m: loss_ratio(loss, losses[fp32]) for m, loss in losses.items()}
    low = lower_bound(rounds or {})
    speed = speeds(seconds)
    speed_low = {m: low.get(m, speed[m]) for m in seconds}
    loss_ratios = {m: ratios.get(m) for m in seconds}
    at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    by, load = this_process(), current_load()
    precision, reason, passed = verdict(seconds, loss_ratios, failed or {}, speed_low, at, by, load)
    return Calibration(
        key=key,
        workload=described,
        precision=precision,
        reason=reason,
        seconds=dict(seconds),
        speed=speed,
        speed_low=speed_low,
        loss_ratio=loss_ratios,
        passed=passed,
        failed=dict(failed or {}),
        cost_s=float(cost_s),
        steps=int(steps),
        at=at,
        measured_by=by,
        load=load,
    )


def clock(device: Union[str, torch.device]) -> Callable[[], float]:
    """The clock `time_step` reads on ``device``: on CUDA the wall time between two synchronisations; on a CPU a CPU
    clock, which other processes' load does not move: the calling thread's own (``time.thread_time``) when torch runs
    one intra-op thread (the learners do), else this process's (``time.process_time``: every torch thread's work)."""
    if torch.device(device).type == "cuda":
        return time.perf_counter
    return time.thread_time if torch.get_num_threads() == 1 else time.process_time


def loaded(load: Mapping[str, Any]) -> Optional[str]:
    """Why a measurement under ``load`` (`current_load`) is not kept for later runs: a 1-minute load average above
    the number of CPUs (None: it is not loaded so)."""
    average, cpus = load.get("average"), load.get("cpus")
    if not average or not cpus or average[0] <= cpus:
        return None
    return f"measured under a load average of {average[0]:.2f} on {cpus} CPUs"


@contextlib.contextmanager
def preserved_rng(device: Union[str, torch.device]) -> Iterator[None]:
    """The global RNGs a loss may draw from as they were afterwards: torch's CPU RNG (and ``device``'s, on CUDA),
    NumPy's global ``np.random`` and Python's ``random``: the calibration draws nothing from the run's streams."""
    import random

    import numpy as np

    device = torch.device(device)
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


@contextlib.contextmanager
def preserved_module(model: torch.nn.Module) -> Iterator[None]:
    """``model``'s parameters, buffers (a BatchNorm's running statistics), gradients and train/eval modes as they
    were afterwards, whatever a loss that closes over it did to them during the calibration."""
    tensors = {name: t.detach().clone() for name, t in (*model.named_parameters(), *model.named_buffers())}
    grads = {name: None if p.grad is None else p.grad.detach().clone() for name, p in model.named_parameters()}
    modes = [m.training for m in model.modules()]
    try:
        yield
    finally:
        with torch.no_grad():
            for name, t in (*model.named_parameters(), *model.named_buffers()):
                kept = tensors.get(name)
                if kept is not None and (t.shape != kept.shape or not torch.equal(t, kept)):
                    t.copy_(kept)
        for name, p in model.named_parameters():
            p.grad = grads.get(name)
        for m, training in zip(model.modules(), modes):
            m.training = training


def unmeasurable_batch(batch: Any) -> Optional[str]:
    """Why ``batch`` is not a batch to measure on (None: it is): empty (a tensor with no elements in it)."""
    if isinstance(batch, torch.Tensor):
        return f"the batch is empty (a tensor of shape {list(batch.shape)})" if batch.numel() == 0 else None
    if isinstance(batch, (tuple, list)):
        return next((why for item in batch if (why := unmeasurable_batch(item))), None)
    if isinstance(batch, Mapping):
        return next((why for item in batch.values() if (why := unmeasurable_batch(item))), None)
    return None


def final_loss(model: torch.nn.Module, batch: Any, loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor]) -> float:
    """The loss of a calibration copy on the calibration batch, in FP32 (no autocast), in eval mode."""
    model.eval()
    with torch.no_grad():
        loss = loss_fn(model, batch)
    value = float(loss.detach().float().reshape(-1)[0]) if loss.numel() else math.nan
    return value

"""The benchmark: one precision matrix, measured within one run.

For each size, every precision first trains a fresh copy of the same student
for a fixed number of steps through :class:`FP16Trainer` (validation loss,
overflow rate, peak memory). The same model and optimizer are then timed two
ways, alternated within each repeat: through our trainer ("ours") and through
:class:`RawLoop`, a hand-written torch loop doing the same work. Precisions are
rotated inside a repeat and raw/ours swap order every repeat, so load on a
shared machine lands on all of them; every ratio is a median over repeats of
numbers taken side by side.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import gc
import math
import os
import platform
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, ContextManager, Iterator, Optional

import torch

from .. import __version__
from ..precision import cpu_flags, resolve_precision
from ..trainer import FP16Trainer, FP16TrainingConfig
from .models import QUICK_STEPS, SIZES, SizeSpec, Task, validation_loss

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
INTERESTING_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile", "amx_int8", "f16c")

RAW_LOOP_WORK = (
    "torch.autocast (same dtype; none for fp32) -> loss.float() -> finite-loss check "
    "(bool(isfinite(loss).all()), skip if not) -> GradScaler(enabled=fp16).scale(loss).backward() -> "
    "unscale_ -> clip_grad_norm_(max_grad_norm) -> scaler.step -> scaler.update -> zero_grad(set_to_none=True)"
)

Progress = Callable[[str], None]


@dataclass
class BenchOptions:
    """What to measure.

    sizes / precisions: the matrix (see ``models.SIZES`` and ``PRECISIONS``).
    repeats: timed raw/ours pairs per cell; the median is reported.
    quick: CI smoke budget (few steps, short chunks).
    compile: torch.compile the model (a failure is logged and the cell runs eager).
    cuda_graphs: on CUDA, capture forward+backward of the small sizes in CUDA graphs.
    chunk_s: target seconds per timed chunk (steps per chunk are calibrated to it).
    warmup_steps: untimed steps before calibration, per loop.
    threads: torch intra-op threads (None: torch's default, one per core).
    """

    sizes: list[SizeSpec] = field(default_factory=lambda: [SIZES["S"], SIZES["M"], SIZES["L"], SIZES["LSTM"]])
    precisions: list[str] = field(default_factory=lambda: list(PRECISIONS))
    repeats: int = 11
    quick: bool = False
    compile: bool = False
    cuda_graphs: bool = True
    device: Optional[str] = None
    seed: int = 0
    chunk_s: float = 0.25
    warmup_steps: int = 3
    threads: Optional[int] = None
    command: str = ""

    def __post_init__(self) -> None:
        self.precisions = parse_precisions(self.precisions)
        if not (isinstance(self.repeats, int) and self.repeats >= 1):
            raise ValueError(f"repeats={self.repeats!r}: expected an integer >= 1")
        if self.threads is not None and not (isinstance(self.threads, int) and self.threads >= 1):
            raise ValueError(f"threads={self.threads!r}: expected an integer >= 1")
        if not self.chunk_s > 0:
            raise ValueError(f"chunk_s={self.chunk_s!r}: expected seconds > 0")

    def quality_steps(self, spec: SizeSpec) -> int:
        return QUICK_STEPS[spec.name] if self.quick else spec.quality_steps


def parse_precisions(values: Any) -> list[str]:
    if isinstance(values, str):
        values = values.split(",")
    names = [str(v).strip().lower() for v in values if str(v).strip()]
    unknown = [n for n in names if n not in PRECISIONS]
    if unknown or not names:
        raise ValueError(
            f"--precisions: unknown precision(s) {', '.join(unknown) or '(none given)'}; expected some of {', '.join(PRECISIONS)}"
        )
    return list(dict.fromkeys(names))


def pick_device(requested: Optional[str]) -> torch.device:
    if requested:
        device = torch.device(requested)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"--device {requested}: CUDA is not available on this machine; use cpu")
        return device
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def not_applicable_reason(precision: str, device: torch.device) -> Optional[str]:
    """Why ``precision`` is not measured on ``device`` (None: it is measured)."""
    if precision == "tf32" and device.type != "cuda":
        return "TF32 is a CUDA tensor-core mode; not applicable on this device"
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return "this CUDA device does not support BF16"
    return None


# -- device stamp ---------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _cpu_name(flags: list[str]) -> str:
    """CPU model, cores and the reduced-precision features that matter here."""
    features = [name for flag, name in (("avx512_bf16", "AVX512-BF16"), ("amx_bf16", "AMX-BF16"), ("avx512_fp16", "AVX512-FP16")) if flag in flags]
    return f"{_cpu_model()}, {os.cpu_count()} cores" + (f" ({', '.join(features)})" if features else "")


def _git_commit() -> Optional[str]:
    import subprocess

    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def device_header(options: BenchOptions, device: torch.device) -> dict[str, Any]:
    flags = sorted(f for f in cpu_flags() if f in INTERESTING_FLAGS)
    cuda_name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {
        "tool": "genesis-fp16 bench",
        "genesis_fp16_version": __version__,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": options.command or " ".join(sys.argv),
        "device": str(device),
        "device_name": cuda_name or _cpu_name(flags),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_flags": flags,
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_commit": _git_commit(),
        "load_avg_start": list(os.getloadavg()),
        "quick": options.quick,
        "repeats": options.repeats,
        "seed": options.seed,
        "compile": options.compile,
        "cuda_graphs": options.cuda_graphs and device.type == "cuda",
        "chunk_s": options.chunk_s,
        "trainer_config": dataclasses.asdict(_trainer_config("fp32", device)),
        "raw_loop": RAW_LOOP_WORK,
        "timing": "median over repeats; raw and ours alternated within each repeat; gc disabled inside a timed chunk",
        "peak_mem": (
            "torch.cuda.max_memory_allocated increase during the quality run"
            if device.type == "cuda"
            else "peak resident-memory (RSS) increase during the quality run, sampled every 1 ms with psutil after malloc_trim"
        ),
    }


# -- the two loops ----------------------------------------------------------------


def _trainer_config(precision: str, device: torch.device) -> FP16TrainingConfig:
    return FP16TrainingConfig(
        enabled=True,
        precision="fp32" if precision == "tf32" else precision,
        on_unsupported="error",  # the bench measures what was asked or says why not
        device=str(device),
    )


class RawLoop:
    """What a careful hand-written mixed-precision loop does per step: PyTorch's
    AMP recipe (autocast, GradScaler, unscale before clipping) plus the
    finite-loss guard any serious training script has. This is "the same work"
    our trainer does; what ours adds on top (counters, events, ``model.train()``
    per step, scale bookkeeping) is the overhead measured."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, config: FP16TrainingConfig, precision: Any) -> None:
        self.model = model
        self.optimizer = optimizer
        self.max_grad_norm = config.max_grad_norm
        self.device_type = precision.device.type
        self.dtype = None if precision.name == "fp32" else precision.compute_dtype
        self.scaler = torch.amp.GradScaler(
            self.device_type,
            init_scale=config.loss_scale,
            growth_factor=config.growth_factor,
            backoff_factor=config.backoff_factor,
            growth_interval=config.growth_interval,
            enabled=precision.uses_scaler,
        )
        model.train()

    def step(self, batch: Any, loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor]) -> bool:
        ctx = torch.autocast(self.device_type, dtype=self.dtype) if self.dtype is not None else contextlib.nullcontext()
        with ctx:
            loss = loss_fn(self.model, batch)
        if not bool(torch.isfinite(loss.detach()).all()):
            self.optimizer.zero_grad(set_to_none=True)
            return False
        self.scaler.scale(loss).backward()
        if self.max_grad_norm is not None:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return True


# -- measurement helpers ------------------------------------------------------------


@contextlib.contextmanager
def tf32_mode(device: torch.device, enabled: bool) -> Iterator[None]:
    """On CUDA: TF32 matmuls on (the tf32 row) or off (strict FP32 for every
    other row). Elsewhere: nothing."""
    if device.type != "cuda":
        yield
        return
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        old = (matmul.fp32_precision, torch.backends.cudnn.fp32_precision)
        matmul.fp32_precision = "tf32" if enabled else "ieee"
        torch.backends.cudnn.fp32_precision = "tf32" if enabled else "ieee"
        try:
            yield
        finally:
            matmul.fp32_precision, torch.backends.cudnn.fp32_precision = old
    else:  # older torch
        old = (matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
        try:
            yield
        finally:
            matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _malloc_trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakMemory:
    """Peak memory increase over a block: CUDA ``max_memory_allocated``; on the
    CPU the resident set size, sampled every ``interval`` seconds in a thread."""

    def __init__(self, device: torch.device, interval: float = 0.001) -> None:
        self.device = device
        self.interval = interval
        self.peak_mb = 0.0
        self._stop = threading.Event()

    def __enter__(self) -> "PeakMemory":
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        else:
            import psutil

            _malloc_trim()
            self._proc = psutil.Process()
            self._base = self._proc.memory_info().rss
            self._peak = self._base
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            rss = self._proc.memory_info().rss
            if rss > self._peak:
                self._peak = rss
            time.sleep(self.interval)

    def __exit__(self, *exc: Any) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            self._stop.set()
            self._thread.join()
            peak = max(self._peak, self._proc.memory_info().rss)
        self.peak_mb = max(0.0, (peak - self._base) / 2**20)


def time_chunk(step: Callable[[int], Any], steps: int, device: torch.device) -> float:
    gc.collect()
    gc.disable()
    try:
        _sync(device)
        start = time.perf_counter()
        for i in range(steps):
            step(i)
        _sync(device)
        return time.perf_counter() - start
    finally:
        gc.enable()


def should_graph(spec: SizeSpec, device: torch.device, enabled: bool) -> bool:
    """CUDA-graph capture is tried only on CUDA, for the small sizes where
    launch overhead dominates, and when asked."""
    return enabled and device.type == "cuda" and spec.graphable


def graph_model(model: torch.nn.Module, sample: torch.Tensor, precision: Any) -> torch.nn.Module:
    """Capture forward and backward of ``model`` in CUDA graphs
    (``torch.cuda.make_graphed_callables``). Autocast must run with its weight
    cache off during capture (PyTorch CUDA-graphs docs); the loss, scaler and
    optimizer stay eager, so our trainer and the raw loop are unchanged."""
    ctx = (
        torch.autocast(precision.device.type, dtype=precision.compute_dtype, cache_enabled=False)
        if precision.name != "fp32"
        else contextlib.nullcontext()
    )
    with ctx:
        return torch.cuda.make_graphed_callables(model, (sample,))


# -- one cell of the matrix -----------------------------------------------------------


@dataclass
class CellFlags:
    """What the priming pass learned about a (size, precision) cell."""

    compile: bool = False
    mkldnn_off: bool = False
    notes: list[str] = field(default_factory=list)


@dataclass
class Cell:
    spec: SizeSpec
    precision: str
    device: torch.device
    model: torch.nn.Module  # the eager module (validation reads it)
    train_model: torch.nn.Module  # what both loops call: compiled/graphed or the module itself
    optimizer: torch.optim.Optimizer
    trainer: FP16Trainer
    raw: RawLoop
    task: Task
    flags: CellFlags
    graphed: bool = False
    steps: int = 1  # steps per timed chunk
    raw_times: list[float] = field(default_factory=list)
    ours_times: list[float] = field(default_factory=list)
    quality: dict[str, Any] = field(default_factory=dict)

    def context(self) -> ContextManager[Any]:
        stack = contextlib.ExitStack()
        stack.enter_context(tf32_mode(self.device, self.precision == "tf32"))
        if self.flags.mkldnn_off:
            stack.enter_context(warnings.catch_warnings())
            warnings.filterwarnings("ignore", message="TF32 acceleration on top of oneDNN")
            stack.enter_context(torch.backends.mkldnn.flags(enabled=False))
        return stack

    def raw_step(self, i: int) -> bool:
        return self.raw.step(self.task.train[i % len(self.task.train)], self.task.loss_fn)

    def ours_step(self, i: int) -> bool:
        loss = self.trainer.training_step(self.task.train[i % len(self.task.train)], self.task.loss_fn)
        return self.trainer.backward_and_step(loss)


def build_cell(
    spec: SizeSpec, precision: str, task: Task, options: BenchOptions, device: torch.device, flags: CellFlags, log: Any
) -> Cell:
    """A fresh student at the seed's initial weights, its optimizer, our
    trainer and the raw loop, both driving the same model and optimizer."""
    model = task.make_model(options.seed, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=spec.lr)
    config = _trainer_config(precision, device)
    mode = resolve_precision(config.requested_precision, device, config.on_unsupported, config.scaler_options())
    train_model: torch.nn.Module = model
    graphed = False
    # torch.compile brings its own CUDA-graph mode (mode="reduce-overhead"); never both
    if not flags.compile and should_graph(spec, device, options.cuda_graphs):
        try:
            with tf32_mode(device, precision == "tf32"):
                train_model = graph_model(model, task.train[0][0], mode)
            graphed = True
        except Exception as exc:  # logged and kept in the row's notes, never hidden
            reason = f"{type(exc).__name__}: {exc}"
            flags.notes.append(f"CUDA graphs failed ({reason}); ran without")
            log.warning("bench.cuda_graphs_failed", size=spec.name, precision=precision, reason=reason)
    if flags.compile:
        train_model = torch.compile(train_model)
    trainer = FP16Trainer(train_model, optimizer, config, name=f"bench-{spec.name}-{precision}")
    raw = RawLoop(train_model, optimizer, config, trainer.precision)
    return Cell(spec, precision, device, model, train_model, optimizer, trainer, raw, task, flags, graphed)


def _first_line(exc: BaseException) -> str:
    """The exception's type and first sentence (oneDNN appends a paragraph of advice)."""
    text = str(exc).strip()
    first = text.splitlines()[0].split(". ")[0] if text else ""
    return f"{type(exc).__name__}: {first}"


def prime_cell(spec: SizeSpec, precision: str, task: Task, options: BenchOptions, device: torch.device, log: Any) -> CellFlags:
    """Run a few steps of a throwaway copy of the cell, where lazy failures
    surface, and decide how the real cell runs: a torch.compile failure falls
    back to eager; oneDNN lacking a kernel for the precision (FP16 LSTM on CPU)
    falls back to ATen with mkldnn disabled. Each fallback is logged and noted.
    It also warms allocator, kernel and compile caches so the first measured
    cell is not charged for them."""
    flags = CellFlags(compile=options.compile)
    for _attempt in range(3):
        cell = build_cell(spec, precision, task, options, device, flags, log)
        try:
            with cell.context():
                for i in range(max(1, options.warmup_steps)):
                    cell.ours_step(i)
                    cell.raw_step(i)
            return flags
        except Exception as exc:
            reason = _first_line(exc)
            if flags.compile:
                flags.compile = False
                flags.notes.append(f"torch.compile failed ({reason}); ran eager")
                log.warning("bench.compile_failed", size=spec.name, precision=precision, reason=reason)
            elif device.type == "cpu" and not flags.mkldnn_off and "primitive" in str(exc).lower():
                flags.mkldnn_off = True
                flags.notes.append(f"oneDNN has no {precision} kernel here ({reason}); ran with torch.backends.mkldnn disabled")
                log.warning("bench.onednn_fallback", size=spec.name, precision=precision, reason=reason)
            else:
                raise
    raise RuntimeError(f"{spec.name}/{precision}: the first training steps keep failing")


def run_quality(cell: Cell, steps: int) -> None:
    """Train from the seed's initial weights for ``steps`` optimizer steps
    through our trainer; record validation loss, overflow rate and peak memory."""
    with cell.context():
        with PeakMemory(cell.device) as mem:
            for i in range(steps):
                cell.ours_step(i)
        stats = cell.trainer.get_stats()
        val_loss = validation_loss(cell.model, cell.task)
    cell.quality = {
        "val_loss": val_loss,
        "overflow_rate": stats["overflow_rate"],
        "skipped_steps": stats["skipped_steps"],
        "quality_steps": stats["training_steps"],
        "peak_mem_mb": mem.peak_mb,
        "precision_run": stats["precision"],
    }


def calibrate(cell: Cell, chunk_s: float, warmup_steps: int) -> None:
    """Warm both loops, then choose steps per chunk so a chunk lasts about
    ``chunk_s``: the probe runs raw steps for a quarter of that (at least two),
    so one slow step on a shared machine does not decide the chunk length."""
    with cell.context():
        for i in range(warmup_steps):
            cell.raw_step(i)
            cell.ours_step(i)
        _sync(cell.device)
        start = time.perf_counter()
        n = 0
        while n < 2 or (time.perf_counter() - start < chunk_s / 4 and n < 1000):
            cell.raw_step(n)
            n += 1
        _sync(cell.device)
        per_step = max((time.perf_counter() - start) / n, 1e-6)
    cell.steps = int(min(5000, max(3, math.ceil(chunk_s / per_step))))


def time_pair(cell: Cell, ours_first: bool) -> None:
    order = ("ours", "raw") if ours_first else ("raw", "ours")
    with cell.context():
        for which in order:
            if which == "raw":
                cell.raw_times.append(time_chunk(cell.raw_step, cell.steps, cell.device))
            else:
                cell.ours_times.append(time_chunk(cell.ours_step, cell.steps, cell.device))

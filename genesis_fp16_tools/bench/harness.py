"""The benchmark's cells: one (size, precision) pair, measured within one run.

For each size, every precision (and on CUDA every mode: the training window
eager, and its step captured as a CUDA graph) first trains a fresh copy of the
same student for a fixed number of steps through `FP16Trainer`'s training
windows, the path users run (validation loss, overflow rate, peak memory).
The same model and optimizer are then timed two ways, alternated within each
repeat: through our trainer's windows ("ours") and through `RawLoop`, a
hand-written torch loop doing the same work one step at a time.
Precisions are rotated inside a repeat and raw/ours swap order every repeat,
so load on a shared machine lands on all of them; every ratio is a median
over repeats of numbers taken side by side.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, ContextManager

import torch

from genesis_fp16.precision.decision import decide
from genesis_fp16.precision.modes import MODES
from genesis_fp16.training.capture import WARMUP as CAPTURE_WARMUP
from genesis_fp16.training.trainer import WINDOW_STEPS, FP16Trainer, fused_adam
from genesis_fp16_tools.bench import measure
from genesis_fp16_tools.bench.loops import RawLoop, trainer_config
from genesis_fp16_tools.bench.measure import PeakMemory, time_block, time_chunk
from genesis_fp16_tools.bench.models import SizeSpec, Task, validation_loss
from genesis_fp16_tools.bench.options import BenchOptions


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
    mode: str = "eager"
    """How the trainer runs its window's steps: "eager", or "captured" (one CUDA graph per step, CUDA only)."""
    steps: int = 1  # steps per timed chunk
    raw_times: list[float] = field(default_factory=list)
    ours_times: list[float] = field(default_factory=list)
    quality: dict[str, Any] = field(default_factory=dict)

    def context(self) -> ContextManager[Any]:
        stack = contextlib.ExitStack()
        if self.flags.mkldnn_off:
            stack.enter_context(warnings.catch_warnings())
            warnings.filterwarnings("ignore", message="TF32 acceleration on top of oneDNN")
            stack.enter_context(torch.backends.mkldnn.flags(enabled=False))
        return stack

    def raw_step(self, i: int) -> bool:
        return self.raw.step(self.task.train[i % len(self.task.train)], self.task.loss_fn)

    def ours_steps(self, steps: int, start: int = 0) -> list[bool]:
        """``steps`` steps through the trainer's training windows (`WINDOW_STEPS` a window, as the learners run)."""
        train, stepped = self.task.train, []
        for first in range(start, start + steps, WINDOW_STEPS):
            batches = (train[i % len(train)] for i in range(first, min(first + WINDOW_STEPS, start + steps)))
            stepped += self.trainer.train_window(batches, self.task.loss_fn).stepped
        return stepped

    @property
    def graphed(self) -> bool:
        """Whether the trainer's steps ran captured (a captured cell whose capture was refused did not)."""
        graphs = self.trainer.step_graphs
        return graphs is not None and graphs.replays > 0


def build_cell(
    spec: SizeSpec,
    precision: str,
    task: Task,
    options: BenchOptions,
    device: torch.device,
    flags: CellFlags,
    log: Any,
    mode: str = "eager",
) -> Cell:
    """A fresh student at the initial weights ``options.seed`` draws, its fused Adam (a window skips a step on the
    device with it), our trainer (its window's steps captured where ``mode`` is "captured") and the raw loop, both
    driving the same model and optimizer."""
    model = task.make_model(options.seed, device)
    optimizer = fused_adam(model.parameters(), spec.lr, device)
    config = trainer_config(precision, device)
    config.capture = mode == "captured"
    # the bench decides through the one decision, as every trainer does; the raw loop runs the decided plugin
    plugin = MODES[decide(config.request, device).mode](device, config.precision_config)
    train_model: torch.nn.Module = torch.compile(model) if flags.compile else model
    trainer = FP16Trainer(train_model, optimizer, config, name=f"bench-{spec.name}-{precision}-{mode}")
    raw = RawLoop(train_model, optimizer, config, plugin)
    return Cell(spec, precision, device, model, train_model, optimizer, trainer, raw, task, flags, mode)


def _first_line(exc: BaseException) -> str:
    """The exception's type and first sentence (oneDNN appends a paragraph of advice)."""
    text = str(exc).strip()
    first = text.splitlines()[0].split(". ")[0] if text else ""
    return f"{type(exc).__name__}: {first}"


def prime_cell(
    spec: SizeSpec,
    precision: str,
    task: Task,
    options: BenchOptions,
    device: torch.device,
    log: Any,
    mode: str = "eager",
) -> CellFlags:
    """Run a few steps of a throwaway copy of the cell, where lazy failures
    surface, and decide how the real cell runs: a torch.compile failure falls
    back to eager; oneDNN lacking a kernel for the precision (FP16 LSTM on CPU)
    falls back to ATen with mkldnn disabled. Each fallback is logged and noted.
    It also warms allocator, kernel and compile caches so the first measured
    cell is not charged for them."""
    flags = CellFlags(compile=options.compile)
    for _attempt in range(3):
        cell = build_cell(spec, precision, task, options, device, flags, log, mode)
        try:
            with cell.context():
                for i in range(max(1, options.warmup_steps)):
                    cell.raw_step(i)
                cell.ours_steps(max(1, options.warmup_steps) + CAPTURE_WARMUP + 1)
            return flags
        except Exception as exc:
            reason = _first_line(exc)
            if flags.compile:
                flags.compile = False
                flags.notes.append(f"torch.compile failed ({reason}); ran eager")
                log.warning("bench.compile_failed", size=spec.name, precision=precision, reason=reason)
            elif device.type == "cpu" and not flags.mkldnn_off and "primitive" in str(exc).lower():
                flags.mkldnn_off = True
                flags.notes.append(
                    f"oneDNN has no {precision} kernel here ({reason}); ran with torch.backends.mkldnn disabled"
                )
                log.warning("bench.onednn_fallback", size=spec.name, precision=precision, reason=reason)
            else:
                raise
    raise RuntimeError(f"{spec.name}/{precision}: the first training steps keep failing")


def run_quality(cell: Cell, steps: int) -> None:
    """Train from the initial weights ``options.seed`` draws for ``steps`` optimizer steps
    through our trainer; record validation loss, overflow rate and peak memory."""
    with cell.context():
        with PeakMemory(cell.device) as mem:
            cell.ours_steps(steps)
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
        cell.ours_steps(warmup_steps + CAPTURE_WARMUP + 1)  # a captured cell is captured before it is timed
        measure.sync_device(cell.device)
        start = time.perf_counter()
        n = 0
        while n < 2 or (time.perf_counter() - start < chunk_s / 4 and n < 1000):
            cell.raw_step(n)
            n += 1
        measure.sync_device(cell.device)
        per_step = max((time.perf_counter() - start) / n, 1e-6)
    cell.steps = int(min(5000, max(3, math.ceil(chunk_s / per_step))))


def time_pair(cell: Cell, ours_first: bool, clock: str = "wall") -> None:
    order = ("ours", "raw") if ours_first else ("raw", "ours")
    with cell.context():
        for which in order:
            if which == "raw":
                cell.raw_times.append(time_chunk(cell.raw_step, cell.steps, cell.device, clock))
            else:
                cell.ours_times.append(time_block(lambda: cell.ours_steps(cell.steps), cell.device, clock))

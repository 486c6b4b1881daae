"""Measurement helpers: timed chunks, peak memory, CUDA-graph capture."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import threading
import time
from typing import Any, Callable, Iterator

import torch

from genesis_fp16.precision.plugins import Precision
from genesis_fp16_tools.bench.models import SizeSpec


def sync_device(device: torch.device) -> None:
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


CLOCK_FNS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.thread_time}


def time_chunk(step: Callable[[int], Any], steps: int, device: torch.device, clock: str = "wall") -> float:
    """Seconds ``steps`` calls of ``step`` take by ``clock`` (``wall`` or ``cpu``: this thread's CPU time)."""
    now = CLOCK_FNS[clock]
    gc.collect()
    gc.disable()
    try:
        sync_device(device)
        start = now()
        for i in range(steps):
            step(i)
        sync_device(device)
        return now() - start
    finally:
        gc.enable()


def should_graph(spec: SizeSpec, device: torch.device, enabled: bool) -> bool:
    """CUDA-graph capture is tried only on CUDA, for the small sizes where
    launch overhead dominates, and when asked."""
    return enabled and device.type == "cuda" and spec.graphable


@contextlib.contextmanager
def _autocast_weight_cache_off() -> Iterator[None]:
    previous = torch.is_autocast_cache_enabled()
    torch.set_autocast_cache_enabled(False)
    try:
        yield
    finally:
        torch.set_autocast_cache_enabled(previous)


def graph_model(model: torch.nn.Module, sample: torch.Tensor, precision: Precision) -> torch.nn.Module:
    """Capture forward and backward of ``model`` in CUDA graphs
    (``torch.cuda.make_graphed_callables``) under the precision's contexts.
    Autocast must run with its weight cache off during capture (PyTorch
    CUDA-graphs docs); the loss, scaler and optimizer stay eager, so our
    trainer and the raw loop are unchanged."""
    # the cache switch goes inside forward_context: entering autocast sets it
    with precision.math_context(), precision.forward_context(), _autocast_weight_cache_off():
        return torch.cuda.make_graphed_callables(model, (sample,))

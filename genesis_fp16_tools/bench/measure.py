"""Measurement helpers: timed chunks, peak memory."""

from __future__ import annotations

import ctypes
import gc
import threading
import time
from typing import Any, Callable

import torch


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


def time_block(run: Callable[[], Any], device: torch.device, clock: str = "wall") -> float:
    """Seconds one call of ``run`` takes by ``clock``, the device synchronised before and after."""
    return time_chunk(lambda _i: run(), 1, device, clock)


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

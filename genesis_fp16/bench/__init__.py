"""Benchmark harness: ``genesis-fp16 bench``.

Measures, per size and precision, throughput through our trainer and through a
hand-written torch loop doing the same work, validation loss after a fixed
number of steps, overflow rate and peak memory; writes a device-stamped JSON,
CSV and plot. See docs/PERFORMANCE.md.
"""

from .loops import RawLoop
from .models import SIZES, SizeSpec, parse_sizes
from .options import PRECISIONS, BenchOptions
from .runner import run_benchmark

__all__ = ["PRECISIONS", "SIZES", "BenchOptions", "RawLoop", "SizeSpec", "parse_sizes", "run_benchmark"]

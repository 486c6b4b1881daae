"""Benchmark harness: ``genesis-fp16 bench``.

Measures, per size and precision, throughput through our trainer and through a
hand-written torch loop doing the same work, how far each step runs from the
device's arithmetic limit (FLOPs per step against the precision's peak),
validation loss after a fixed number of steps, overflow rate and peak memory;
writes a device-stamped JSON, CSV and plot. See docs/PERFORMANCE.md.
"""

from __future__ import annotations

from genesis_fp16.base.lazy import lazy_exports

# imported on first use (PEP 562): `genesis-fp16 --help` loads `.cli`, which must not import torch
_LAZY = {
    "RawLoop": ".loops",
    "SIZES": ".models",
    "SizeSpec": ".models",
    "default_sizes": ".models",
    "parse_sizes": ".models",
    "flops_per_step": ".limits",
    "PRECISIONS": ".options",
    "BenchOptions": ".options",
    "run_benchmark": ".runner",
}

__all__ = [
    "PRECISIONS",
    "SIZES",
    "BenchOptions",
    "RawLoop",
    "SizeSpec",
    "default_sizes",
    "flops_per_step",
    "parse_sizes",
    "run_benchmark",
]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)

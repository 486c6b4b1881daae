"""torch's CPU intra-op threads for one piece of work, then back as they were.

The agents and the world model train small models (hidden 64, batch 256):
their kernels are too short for a thread pool to pay, and on a shared machine
extra threads wait on each other. ``Settings.torch_threads``
(``GENESIS_FP16_TORCH_THREADS``) says how many the agents and the world model's
training apply; 0 keeps torch's own default (one per core). The figure behind
the default is in docs/EMBEDDING.md (``scripts/bench_torch_threads.py``).

``torch.set_num_threads`` is process-wide: while the block runs, other torch
work in the process sees the same count.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

_LOCK = threading.Lock()
_DEPTH = 0
_OUTER: int = 0


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block with ``count`` torch CPU threads (0: leave them as they are).

    Nested or concurrent blocks (the agent's run around the world model's
    training thread) share one outer value: the count in force before the
    first block is restored when the last one ends."""
    global _DEPTH, _OUTER
    if count < 0:
        raise ValueError(f"torch threads: {count}: expected 0 (torch's default) or a positive count")
    if count == 0:
        yield
        return
    with _LOCK:
        if _DEPTH == 0:
            _OUTER = torch.get_num_threads()
        _DEPTH += 1
        torch.set_num_threads(count)
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0:
                torch.set_num_threads(_OUTER)

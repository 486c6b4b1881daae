"""Limits for evaluation worker processes.

Kept apart from ``agents.evaluation`` on purpose: a spawned worker imports the
module of its initializer, and this one needs only the standard library (no
torch), so a fresh worker starts in a fraction of a second.
"""

from __future__ import annotations

from typing import Optional


def _vm_size_bytes() -> Optional[int]:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def limit_worker_memory(headroom_mb: Optional[int]) -> None:
    """Pool initializer: cap this process's address space at what it holds now
    plus ``headroom_mb`` (None: no cap). The baseline is measured, not guessed,
    because the libraries' thread pools reserve address space per core."""
    if not headroom_mb:
        return
    try:
        import resource
    except ImportError:  # not POSIX: the timeout still applies
        return
    base = _vm_size_bytes()
    if base is None:  # no /proc (not Linux): no measured baseline to add the headroom to
        return
    limit = base + int(headroom_mb) * 1024 * 1024
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))

"""The device stamp every result carries: hardware, software, command, settings."""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
from datetime import datetime, timezone
from typing import Any, Optional

import torch

from genesis_fp16 import __version__
from genesis_fp16.precision.capability import cpu_flags, cpu_name
from genesis_fp16_tools.bench.loops import RAW_LOOP_WORK, trainer_config
from genesis_fp16_tools.bench.options import BenchOptions, modes_for

INTERESTING_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile", "amx_int8", "f16c")


def _cpu_name(flags: list[str]) -> str:
    """CPU model, cores and the reduced-precision features that matter here."""
    features = [
        name
        for flag, name in (("avx512_bf16", "AVX512-BF16"), ("amx_bf16", "AMX-BF16"), ("avx512_fp16", "AVX512-FP16"))
        if flag in flags
    ]
    return f"{cpu_name()}, {os.cpu_count()} cores" + (f" ({', '.join(features)})" if features else "")


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
        "cpu_model": cpu_name(),
        "cpu_count": os.cpu_count(),
        "cpu_flags": flags,
        "torch_threads": torch.get_num_threads(),
        "clock": options.clock,
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
        "modes": modes_for(options, device),
        "chunk_s": options.chunk_s,
        "trainer_config": dataclasses.asdict(trainer_config("fp32", device)),
        "raw_loop": RAW_LOOP_WORK,
        "timing": "median over repeats; raw and ours alternated within each repeat; gc disabled inside a timed chunk",
        "peak_mem": (
            "torch.cuda.max_memory_allocated increase during the quality run"
            if device.type == "cuda"
            else "peak resident-memory (RSS) increase during the quality run, sampled every 1 ms with psutil after "
            "malloc_trim"
        ),
    }

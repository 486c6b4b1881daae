"""The training window's time over the raw loop's (`genesis_fp16_tools.bench.loops.RawLoop`) on the CPU, by the
thread's CPU time, one torch thread, garbage collection off: ``--pairs`` interleaved pairs of ``--steps`` steps
(raw then window, window then raw, in turn), the median ratio. ``--device-path`` runs the window as a GPU's (the
fused kernel's ``found_inf``, nothing read back: ``FP16Trainer.host_is_device = False``) instead of the CPU's (the
host reads the flag and skips the step):

    python scripts/window_overhead.py --size S --precision fp32
    python scripts/window_overhead.py --size S --precision fp32 --device-path
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="S", help="a bench size: S, M, L, LSTM (default S)")
    parser.add_argument("--precision", default="fp32", help="fp32, bf16 or fp16 (default fp32)")
    parser.add_argument("--pairs", type=int, default=31, help="interleaved pairs (default 31)")
    parser.add_argument("--steps", type=int, default=160, help="steps per timed run (default 160)")
    parser.add_argument("--device-path", action="store_true", help="run the window as a GPU's")
    args = parser.parse_args(argv)

    from genesis_fp16.base.telemetry import get_logger
    from genesis_fp16.precision.capability import cpu_flags
    from genesis_fp16_tools.bench import harness
    from genesis_fp16_tools.bench.models import SIZES, make_task
    from genesis_fp16_tools.bench.options import BenchOptions
    from genesis_fp16_tools.bench.stamp import INTERESTING_FLAGS

    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    spec = SIZES[args.size.upper()]
    task = make_task(spec, 0, cpu)
    cell = harness.build_cell(spec, args.precision, task, BenchOptions(), cpu, harness.CellFlags(), get_logger("x"))
    cell.trainer.host_is_device = not args.device_path
    for i in range(16):
        cell.raw_step(i)
    cell.ours_steps(32)
    raw, ours = [], []
    gc.disable()
    try:
        for pair in range(args.pairs):
            for which in ("raw", "ours") if pair % 2 else ("ours", "raw"):
                started = time.thread_time()
                if which == "raw":
                    for i in range(args.steps):
                        cell.raw_step(i)
                    raw.append(time.thread_time() - started)
                else:
                    cell.ours_steps(args.steps)
                    ours.append(time.thread_time() - started)
    finally:
        gc.enable()
    ratio = statistics.median(o / r for o, r in zip(ours, raw))
    flags = " ".join(sorted(f for f in cpu_flags() if f in INTERESTING_FLAGS))
    path = "the GPU's path" if args.device_path else "the CPU's path"
    print(
        f"{spec.name} {args.precision}, {path}: raw {statistics.median(raw) / args.steps * 1e6:.1f} us/step, "
        f"window {statistics.median(ours) / args.steps * 1e6:.1f} us/step, median ratio {ratio:.4f} "
        f"({args.pairs} pairs of {args.steps} steps; torch {torch.__version__}; CPU flags {flags})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

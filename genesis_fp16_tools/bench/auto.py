"""What ``auto`` picks for each bench size, beside the bench's own fastest.

For every size the bench times, `auto_row` runs ``auto``'s calibration
(`genesis_fp16.precision.measure.measure_auto`: copies, no cache) on a fresh model of that size
and its first batch, and compares the pick with the rows the bench measured
over many more steps: the fastest of the precisions ``auto`` may pick that
passes the FP32 check (the canary's loss-ratio rule on the bench's validation
loss), and how fast ``auto``'s pick ran against it (the issue's goal: within 5%),
among the rows of the mode the learners run (captured on CUDA, eager elsewhere).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from genesis_fp16.precision import calibration as cal
from genesis_fp16.precision.measure import measure_auto
from genesis_fp16.training.trainer import calibration_copies, fused_adam
from genesis_fp16_tools.bench.loops import trainer_config
from genesis_fp16_tools.bench.models import SizeSpec, Task
from genesis_fp16_tools.bench.options import BenchOptions

GOAL = 0.95
"""auto's pick runs at least this fraction of the fastest passing precision's samples/s."""


def auto_row(
    spec: SizeSpec, task: Task, options: BenchOptions, device: torch.device, rows: list[dict[str, Any]]
) -> dict[str, Any]:
    model = task.make_model(options.seed, device)
    optimizer = fused_adam(model.parameters(), spec.lr, device)  # as the cells: its copies run windows
    run_mode = "captured" if any(r.get("mode") == "captured" for r in rows) else "eager"
    rows = [r for r in rows if r.get("mode", "eager") == run_mode]  # the path auto's pick will run
    config = trainer_config("auto", device)
    try:
        result: Optional[cal.Calibration] = measure_auto(
            model,
            optimizer,
            task.train[0],
            task.loss_fn,
            device=device,
            copy_trainer=calibration_copies(config, device, f"bench-{spec.name}-auto"),
        )
        why = None
    except cal.CalibrationUnavailable as exc:
        result, why = None, str(exc)
    pickable = {m.value for m in cal.CANDIDATE_ORDER}
    fp32 = next((r for r in rows if r["precision"] == "fp32"), None)
    passing = [
        r
        for r in rows
        if r["precision"] in pickable
        and fp32 is not None
        and cal.passes(cal.loss_ratio(r["val_loss"], fp32["val_loss"]))
    ]
    fastest = max(passing, key=lambda r: r["samples_per_s"]) if passing else None
    picked = next((r for r in rows if result is not None and r["precision"] == result.precision), None)
    return {
        "size": spec.name,
        "mode": run_mode,
        "auto": result.precision if result is not None else None,
        "auto_reason": result.reason if result is not None else f"could not measure: {why}",
        "auto_speed": result.speed if result is not None else None,
        "calibration_s": result.cost_s if result is not None else None,
        "fastest": fastest["precision"] if fastest is not None else None,
        "auto_vs_fastest": picked["samples_per_s"] / fastest["samples_per_s"]
        if picked is not None and fastest is not None
        else None,
    }


def markdown(auto_rows: list[dict[str, Any]]) -> str:
    if not auto_rows:
        return ""
    lines = [
        "",
        "| size | auto picks | auto's calibration (speed vs fp32) | calibration s | fastest here (passing the fp32 "
        "check) | auto's pick vs fastest |",
        "|---|---|---|---:|---|---:|",
    ]
    for r in auto_rows:
        speed = (
            ", ".join(f"{m} {v:.2f}x" for m, v in (r["auto_speed"] or {}).items() if m != "fp32") or r["auto_reason"]
        )
        cost = f"{r['calibration_s']:.3f}" if r["calibration_s"] is not None else "-"
        versus = f"{r['auto_vs_fastest']:.2f}" if r["auto_vs_fastest"] is not None else "-"
        lines.append(f"| {r['size']} | {r['auto'] or '-'} | {speed} | {cost} | {r['fastest'] or '-'} | {versus} |")
    return "\n".join(lines) + "\n"

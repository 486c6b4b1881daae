"""Run the matrix and turn measurements into rows, a header and a summary."""

from __future__ import annotations

import os
import statistics
from typing import Any, Callable, Optional

import torch

from genesis_fp16.precision.modes import REDUCED_MODES
from genesis_fp16.base.telemetry import get_logger
from genesis_fp16_tools.bench.auto import GOAL, auto_row
from genesis_fp16_tools.bench.harness import Cell, build_cell, calibrate, prime_cell, run_quality, time_pair
from genesis_fp16_tools.bench.limits import FLOPS_FORMULA, PeakTable, limit_columns
from genesis_fp16_tools.bench.models import make_task
from genesis_fp16_tools.bench.options import (
    BenchOptions,
    check_clock,
    mode_not_applicable,
    modes_for,
    not_applicable_reason,
    pick_device,
)
from genesis_fp16_tools.bench.stamp import device_header

REDUCED = {m.value for m in REDUCED_MODES}

# (description, done, total) -> None
ProgressFn = Callable[[str, int, int], None]


def plan(options: BenchOptions, device: torch.device) -> tuple[list[tuple[Any, str, str]], list[dict[str, Any]]]:
    """The (size, precision, mode) cells to measure, and those not applicable here."""
    cells, skipped = [], []
    for spec in options.sizes:
        for precision in options.precisions:
            for mode in modes_for(options, device):
                reason = not_applicable_reason(precision, device) or mode_not_applicable(mode, device)
                if reason:
                    skipped.append({"size": spec.name, "precision": precision, "mode": mode, "reason": reason})
                else:
                    cells.append((spec, precision, mode))
    return cells, skipped


def run_benchmark(options: BenchOptions, progress: Optional[ProgressFn] = None) -> dict[str, Any]:
    """Measure every cell; returns ``{"header", "rows", "not_applicable", "failed", "summary"}``."""
    log = get_logger("genesis_fp16_tools.bench")
    device = pick_device(options.device)
    check_clock(options.clock, device)
    threads_before = torch.get_num_threads()
    if options.threads:
        torch.set_num_threads(options.threads)
    try:
        return _run(options, device, progress, log)
    finally:
        torch.set_num_threads(threads_before)


def _run(options: BenchOptions, device: torch.device, progress: Optional[ProgressFn], log: Any) -> dict[str, Any]:
    header = device_header(options, device)
    planned, not_applicable = plan(options, device)
    total = len(planned) * (2 + options.repeats)
    done = 0

    def tick(text: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(text, done, total)

    log.info(
        "bench.started",
        device=str(device),
        cells=len(planned),
        quick=options.quick,
        repeats=options.repeats,
        load_avg=header["load_avg_start"][0],
    )
    # each precision's arithmetic limit, before any cell is timed: looked up for a
    # known GPU, else a timed matmul (a few hundred ms per precision, once per run)
    peaks = PeakTable(device, budget_s=0.1 if options.quick else 0.3)
    for precision in dict.fromkeys(p for _, p, _ in planned):
        try:
            peaks.peak(precision)
        except Exception as exc:  # no limit is a gap in two columns, not a lost run
            log.warning("bench.peak_unmeasured", precision=precision, reason=f"{type(exc).__name__}: {exc}")
    header["limits"] = peaks.as_dict()
    header["flops_formula"] = FLOPS_FORMULA
    rows: list[dict[str, Any]] = []
    auto_rows: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    for spec in options.sizes:
        pairs = [(p, m) for s, p, m in planned if s is spec]
        if not pairs:
            continue
        task = make_task(spec, options.seed, device)
        cells: list[Cell] = []
        for precision, mode in pairs:
            name = f"{spec.name} {precision}" + ("" if mode == "eager" else f" {mode}")
            try:
                flags = prime_cell(spec, precision, task, options, device, log, mode)
                cell = build_cell(spec, precision, task, options, device, flags, log, mode)
                tick(f"{name}: training {options.quality_steps(spec)} steps")
                run_quality(cell, options.quality_steps(spec))
                calibrate(cell, options.chunk_s, options.warmup_steps)
                if mode == "captured" and not cell.graphed:  # said, not hidden: the row is the eager window's
                    cell.flags.notes.append("the step was not captured (trainer.window_uncaptured says why)")
                tick(f"{name}: warm-up")
                cells.append(cell)
            except Exception as exc:  # one broken cell must not lose the others; it is reported
                reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                failed.append({"size": spec.name, "precision": precision, "mode": mode, "reason": reason})
                log.error("bench.cell_failed", size=spec.name, precision=precision, mode=mode, reason=reason)
                done += 1 + options.repeats
        for r in range(options.repeats):
            # rotate the precision order and swap raw/ours every repeat
            for k in range(len(cells)):
                cell = cells[(k + r) % len(cells)]
                time_pair(cell, ours_first=bool(r % 2), clock=options.clock)
                tick(f"{spec.name} {cell.precision} {cell.mode}: repeat {r + 1}/{options.repeats}")
        size_rows = [_row(cell, peaks) for cell in cells]
        _relative_to_fp32(size_rows)
        for row in size_rows:
            log.info(
                "bench.row",
                **{
                    k: row[k]
                    for k in ("size", "precision", "mode", "samples_per_s", "overhead_vs_raw", "val_loss_delta_vs_fp32")
                },
            )
        rows.extend(size_rows)
        del cells
        if size_rows:
            auto_rows.append(auto_row(spec, task, options, device, size_rows))
            log.info("bench.auto", **{k: v for k, v in auto_rows[-1].items() if not isinstance(v, dict)})
    header["load_avg_end"] = list(os.getloadavg())
    result = {"header": header, "rows": rows, "auto": auto_rows, "not_applicable": not_applicable, "failed": failed}
    result["summary"] = summarize(result)
    log.info(
        "bench.finished",
        rows=len(rows),
        failed=len(failed),
        **{k: v for k, v in result["summary"].items() if not isinstance(v, (dict, list))},
    )
    return result


def _row(cell: Cell, peaks: Optional[PeakTable] = None) -> dict[str, Any]:
    spec = cell.spec
    ratios = [o / r for o, r in zip(cell.ours_times, cell.raw_times) if r > 0]
    ours = statistics.median(cell.ours_times)
    raw = statistics.median(cell.raw_times)
    q = cell.quality
    ms_per_step = 1000.0 * ours / cell.steps
    peak = peaks.known(cell.precision) if peaks is not None else None
    return {
        "size": spec.name,
        "model": spec.label,
        "hidden": spec.hidden,
        "batch": spec.batch,
        "precision": cell.precision,
        "mode": cell.mode,
        "precision_run": q["precision_run"],
        "samples_per_s": spec.batch * cell.steps / ours,
        "raw_samples_per_s": spec.batch * cell.steps / raw,
        "ms_per_step": ms_per_step,
        **limit_columns(spec, ms_per_step, peak),
        "overhead_vs_raw": statistics.median(ratios),
        "overhead_min": min(ratios),
        "overhead_max": max(ratios),
        "overhead_ratios": ratios,
        "speedup_vs_fp32": None,
        "peak_mem_mb": q["peak_mem_mb"],
        "peak_mem_vs_fp32": None,
        "val_loss": q["val_loss"],
        "val_loss_delta_vs_fp32": None,
        "overflow_rate": q["overflow_rate"],
        "skipped_steps": q["skipped_steps"],
        "quality_steps": q["quality_steps"],
        "steps_per_chunk": cell.steps,
        "repeats": len(ratios),
        "compiled": cell.flags.compile,
        "cuda_graphs": cell.graphed,
        "notes": "; ".join(cell.flags.notes),
    }


def _relative_to_fp32(rows: list[dict[str, Any]]) -> None:
    """Speed-up, loss delta and memory against the fp32 row of the same mode
    (an eager row against eager fp32, a captured one against captured fp32)."""
    for mode in dict.fromkeys(r.get("mode", "eager") for r in rows):
        _relative_to(
            next((r for r in rows if r["precision"] == "fp32" and r.get("mode", "eager") == mode), None),
            [r for r in rows if r.get("mode", "eager") == mode],
        )


def _relative_to(base: Optional[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    if base is None:
        return
    for row in rows:
        row["speedup_vs_fp32"] = row["samples_per_s"] / base["samples_per_s"]
        row["val_loss_delta_vs_fp32"] = (row["val_loss"] - base["val_loss"]) / base["val_loss"]
        if base["peak_mem_mb"] > 0:
            row["peak_mem_vs_fp32"] = row["peak_mem_mb"] / base["peak_mem_mb"]


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """The figures the acceptance criteria read, computed from the rows."""
    rows = result["rows"]
    device = result["header"]["device"]
    out: dict[str, Any] = {"device": device}
    if rows:
        out["max_overhead_vs_raw"] = max(r["overhead_vs_raw"] for r in rows)
        out["overhead_vs_raw_by_precision"] = overhead_by_precision(rows)
        deltas = [
            abs(r["val_loss_delta_vs_fp32"])
            for r in rows
            if r["val_loss_delta_vs_fp32"] is not None and r["precision"] in REDUCED
        ]
        if deltas:
            out["max_abs_val_loss_delta_reduced"] = max(deltas)
    speed = {_key(r): r["speedup_vs_fp32"] for r in rows if r["speedup_vs_fp32"] is not None}
    out["speedup_vs_fp32"] = speed
    checks = []

    def check(name: str, value: Optional[float], ok: Callable[[float], bool], goal: str) -> None:
        if value is not None:
            checks.append({"check": name, "value": value, "goal": goal, "passed": bool(ok(value))})

    if "max_overhead_vs_raw" in out:
        # on the CPU, where the eager window is what runs (on CUDA the captured step runs, and a captured row's
        # ratio to the eager raw loop is its speed-up, not its overhead)
        eager = [r["overhead_vs_raw"] for r in rows if r.get("mode", "eager") == "eager"]
        if eager and device.startswith("cpu"):
            check("overhead_vs_raw at every size", max(eager), lambda v: v <= 1.05, "<= 1.05")
            pooled = [e["pooled"] for k, e in out["overhead_vs_raw_by_precision"].items() if "/" not in k]
            check("overhead_vs_raw per precision (every size's repeats)", max(pooled), lambda v: v <= 1.03, "<= 1.03")
    if "max_abs_val_loss_delta_reduced" in out:
        check("val-loss delta bf16/fp16 vs fp32", out["max_abs_val_loss_delta_reduced"], lambda v: v <= 0.02, "<= 2%")
    if device.startswith("cpu"):
        check("bf16 speed-up at L (CPU)", speed.get("L/bf16"), lambda v: v >= 1.6, ">= 1.6x")
    else:
        gpu_checks(rows, check)
    versus = [a["auto_vs_fastest"] for a in result.get("auto", []) if a["auto_vs_fastest"] is not None]
    if versus:
        out["min_auto_vs_fastest"] = min(versus)
        check(
            "auto's pick vs the fastest passing precision, every size", min(versus), lambda v: v >= GOAL, f">= {GOAL}"
        )
    out["checks"] = checks
    return out


def gpu_checks(
    rows: list[dict[str, Any]], check: Callable[[str, Optional[float], Callable[[float], bool], str], None]
) -> None:
    """The GPU goals, on the rows of the mode the learners run there (captured where the run has it): BF16 >= 3x
    strict FP32 at L and >= 5x at XL, FP16 >= 2.5x at L, captured FP32 >= 3x eager FP32 at S and M, BF16 at XL
    within 2x of the arithmetic limit, peak memory of BF16 and FP16 <= 0.65x FP32's at XL."""
    mode = "captured" if any(r.get("mode") == "captured" for r in rows) else "eager"
    cell = {(r["size"], r["precision"], r.get("mode", "eager")): r for r in rows}

    def value(size: str, precision: str, column: str, row_mode: str = mode) -> Optional[float]:
        row = cell.get((size, precision, row_mode))
        return row.get(column) if row is not None else None

    for size, precision, goal in (("L", "bf16", 3.0), ("XL", "bf16", 5.0), ("L", "fp16", 2.5)):
        check(
            f"{precision} speed-up at {size} vs strict fp32 ({mode})",
            value(size, precision, "speedup_vs_fp32"),
            lambda v, g=goal: v >= g,
            f">= {goal:g}x",
        )
    for size in ("S", "M"):
        captured, eager = (
            value(size, "fp32", "samples_per_s", "captured"),
            value(size, "fp32", "samples_per_s", "eager"),
        )
        check(
            f"captured fp32 vs eager fp32 at {size}",
            captured / eager if captured and eager else None,
            lambda v: v >= 3.0,
            ">= 3x",
        )
    check(
        f"bf16 at XL off its arithmetic limit ({mode})", value("XL", "bf16", "x_off_limit"), lambda v: v <= 2.0, "<= 2x"
    )
    for precision in ("bf16", "fp16"):
        check(
            f"{precision} peak memory at XL vs fp32 ({mode})",
            value("XL", precision, "peak_mem_vs_fp32"),
            lambda v: v <= 0.65,
            "<= 0.65 (35% lower)",
        )


def _key(row: dict[str, Any]) -> str:
    """``size/precision``, and ``/mode`` for a row that is not eager."""
    mode = row.get("mode", "eager")
    return f"{row['size']}/{row['precision']}" + ("" if mode == "eager" else f"/{mode}")


def overhead_by_precision(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The trainer's overhead over the raw loop per precision (and mode): ``pooled``, the median of every size's
    per-repeat ratios (one figure per precision, which a shared host's bursts of load move less than any one
    size's median of a few repeats); the worst size's median ratio, which size that is, and every size's median."""
    out: dict[str, dict[str, Any]] = {}
    pooled: dict[str, list[float]] = {}
    for row in rows:
        mode = row.get("mode", "eager")
        key = row["precision"] + ("" if mode == "eager" else f"/{mode}")
        entry = out.setdefault(key, {"pooled": None, "max": None, "worst_size": None, "by_size": {}})
        entry["by_size"][row["size"]] = row["overhead_vs_raw"]
        pooled.setdefault(key, []).extend(row.get("overhead_ratios") or [row["overhead_vs_raw"]])
        if entry["max"] is None or row["overhead_vs_raw"] > entry["max"]:
            entry["max"], entry["worst_size"] = row["overhead_vs_raw"], row["size"]
    for key, ratios in pooled.items():
        out[key]["pooled"] = statistics.median(ratios)
    return out

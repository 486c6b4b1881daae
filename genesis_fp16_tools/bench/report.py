"""Write results: JSON (header + rows), CSV (each row stamped with the device),
a PNG plot and a Markdown table. Every file is written atomically.

Per row, beside the throughput, memory, loss and overhead: ``mode`` (how the
trainer ran the step: ``eager`` today; ``captured`` is kept for the trainer's
whole-step CUDA-graph capture), ``flops_per_step``, ``achieved_tflops``,
``peak_tflops`` and ``peak_source`` (the precision's limit on the device:
datasheet or measured matmul), ``limit_ms_per_step`` (FLOPs / peak) and
``x_off_limit`` (step time / limit time); see `limits`."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any, Union

from genesis_fp16.base.storage import atomic_write_bytes, atomic_write_text
from genesis_fp16.base.extras import MissingExtraError
from genesis_fp16_tools.bench.auto import markdown as auto_markdown

PathLike = Union[str, Path]

CSV_COLUMNS = [
    "size", "model", "precision", "mode", "precision_run", "samples_per_s", "raw_samples_per_s", "ms_per_step",
    "flops_per_step", "achieved_tflops", "peak_tflops", "limit_ms_per_step", "x_off_limit", "peak_source",
    "speedup_vs_fp32", "overhead_vs_raw", "overhead_min", "overhead_max", "peak_mem_mb", "peak_mem_vs_fp32",
    "val_loss", "val_loss_delta_vs_fp32", "overflow_rate", "skipped_steps", "quality_steps", "steps_per_chunk",
    "repeats", "compiled", "cuda_graphs", "notes",
]  # fmt: skip
STAMP_COLUMNS = ["device", "device_name", "cpu_flags", "torch_version", "date", "command"]
PLOTS_INSTALL = "pip install -e '.[plots]'"


def require_matplotlib() -> Any:
    """matplotlib (the ``plots`` extra), or `MissingExtraError`: one line naming the install command."""
    try:
        import matplotlib
    except ImportError as exc:
        raise MissingExtraError(
            f"the bench plot (--plot) needs matplotlib, which is not installed ({exc}); "
            f"install it with: {PLOTS_INSTALL} in a clone of this repository (the genesis-fp16[plots] extra)"
        ) from None
    return matplotlib


def write_json(path: PathLike, result: dict[str, Any]) -> Path:
    return atomic_write_text(path, json.dumps(result, indent=2, sort_keys=False, default=str) + "\n")


def write_csv(path: PathLike, result: dict[str, Any]) -> Path:
    """One line per measured row; the device stamp is repeated on every line so
    a row copied elsewhere still says where it came from. Cells that were not
    applicable or failed are rows with empty numbers and the reason in notes."""
    header = result["header"]
    stamp = {k: header.get(k) for k in STAMP_COLUMNS}
    stamp["cpu_flags"] = " ".join(header.get("cpu_flags") or [])
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS + STAMP_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in result["rows"]:
        writer.writerow({**{k: _fmt(row.get(k)) for k in CSV_COLUMNS}, **stamp})
    for kind in ("not_applicable", "failed"):
        for item in result.get(kind, []):
            writer.writerow(
                {"size": item["size"], "precision": item["precision"], "notes": f"{kind}: {item['reason']}", **stamp}
            )
    return atomic_write_text(path, buf.getvalue())


def _fmt(value: Any) -> Any:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else value


def _num(value: Any, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def markdown_table(result: dict[str, Any]) -> str:
    """The rows as a Markdown table, then what ``auto`` picked and the
    trainer's overhead per precision. ``x off limit`` is step time / the time
    the step's FLOPs take at the precision's peak (the JSON names the peak's source)."""
    lines = [
        "| size | model | precision | mode | samples/s | speed-up vs fp32 | overhead vs raw (min-max) | ms/step | "
        "limit ms | x off limit | peak mem MB | val loss | delta vs fp32 | overflow rate | notes |",
        "|---|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in result["rows"]:
        speed = _num(r.get("speedup_vs_fp32"), ".2f", "x")
        delta = "-" if r.get("val_loss_delta_vs_fp32") is None else f"{100 * r['val_loss_delta_vs_fp32']:+.3f}%"
        lines.append(
            f"| {r['size']} | {r['model']} | {r['precision']} | {r.get('mode', 'eager')} | {r['samples_per_s']:,.0f} "
            f"| {speed} | "
            f"{r['overhead_vs_raw']:.3f} ({r['overhead_min']:.3f}-{r['overhead_max']:.3f}) | "
            f"{_num(r.get('ms_per_step'), '.3g')} | {_num(r.get('limit_ms_per_step'), '.3g')} | "
            f"{_num(r.get('x_off_limit'), ',.1f', 'x')} | "
            f"{r['peak_mem_mb']:.1f} | {r['val_loss']:.5f} | {delta} | {r['overflow_rate']:.3f} | {r['notes'] or ''} |"
        )
    for kind in ("not_applicable", "failed"):
        for item in result.get(kind, []):
            lines.append(
                f"| {item['size']} | | {item['precision']} | | {kind.replace('_', ' ')} | | | | | | | | | | "
                f"{item['reason']} |"
            )
    return "\n".join(lines) + "\n" + overhead_markdown(result) + auto_markdown(result.get("auto", []))


def overhead_markdown(result: dict[str, Any]) -> str:
    """The trainer's overhead over the raw loop per precision: the median of every size's repeats (the figure the
    CPU's per-precision goal is read from), the worst size's median ratio and each size's."""
    by = (result.get("summary") or {}).get("overhead_vs_raw_by_precision") or {}
    if not by:
        return ""
    lines = [
        "",
        "| precision | overhead vs raw, every size's repeats | worst size | each size |",
        "|---|---:|---:|---|",
    ]
    for precision, entry in by.items():
        sizes = ", ".join(f"{size} {value:.3f}" for size, value in entry["by_size"].items())
        pooled = f"{entry['pooled']:.3f}" if entry.get("pooled") is not None else "-"
        lines.append(f"| {precision} | {pooled} | {entry['max']:.3f} ({entry['worst_size']}) | {sizes} |")
    return "\n".join(lines) + "\n"


def write_plot(path: PathLike, result: dict[str, Any]) -> Path:
    """Five panels. Top, per size: throughput (log scale), speed-up vs fp32,
    overhead vs raw. Bottom, against the model's FLOPs per step (log scale):
    each precision's speed-up over fp32, where the curve crosses 1.0 is the
    size from which that precision pays (the crossover), and how many times
    the step is off the precision's arithmetic limit."""
    matplotlib = require_matplotlib()

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r.get("mode", "eager") == "eager"] or result["rows"]
    sizes = list(dict.fromkeys(r["size"] for r in rows))
    precisions = list(dict.fromkeys(r["precision"] for r in rows))
    lookup = {(r["size"], r["precision"]): r for r in rows}
    fig = plt.figure(figsize=(13, 7.6))
    grid = fig.add_gridspec(2, 6)
    axes = [fig.add_subplot(grid[0, 0:2]), fig.add_subplot(grid[0, 2:4]), fig.add_subplot(grid[0, 4:6])]
    width = 0.8 / max(1, len(precisions))
    panels = [
        ("samples_per_s", "samples / s (ours)", True),
        ("speedup_vs_fp32", "speed-up vs fp32", False),
        ("overhead_vs_raw", "overhead vs raw loop (ours / raw time)", False),
    ]
    for ax, (key, title, log) in zip(axes, panels):
        for j, precision in enumerate(precisions):
            xs, ys = [], []
            for i, size in enumerate(sizes):
                value = lookup.get((size, precision), {}).get(key)
                if value is not None and math.isfinite(value):
                    xs.append(i + (j - (len(precisions) - 1) / 2) * width)
                    ys.append(value)
            ax.bar(xs, ys, width, label=precision)
        ax.set_xticks(range(len(sizes)), sizes)
        ax.set_title(title, fontsize=10)
        if log:
            ax.set_yscale("log")
        if key == "speedup_vs_fp32":
            ax.axhline(1.0, color="black", linewidth=0.8)
        if key == "overhead_vs_raw":
            ax.axhline(1.05, color="red", linewidth=0.8, linestyle="--", label="1.05 limit")
            values = [r[key] for r in rows]
            ax.set_ylim(min(0.9, min(values) - 0.02), max(1.1, max(values) + 0.02))
    axes[0].legend(fontsize=8)
    axes[2].legend(fontsize=8)
    crossover = fig.add_subplot(grid[1, 0:3])
    _against_flops(
        crossover, rows, precisions, "speedup_vs_fp32", "speed-up vs fp32 against FLOPs per step (the crossover)"
    )
    crossover.axhline(1.0, color="black", linewidth=0.8)
    off = fig.add_subplot(grid[1, 3:6])
    _against_flops(off, rows, precisions, "x_off_limit", "x off the arithmetic limit (step time / FLOPs at peak)")
    off.axhline(1.0, color="red", linewidth=0.8, linestyle="--", label="the limit")
    off.set_yscale("log")
    off.legend(fontsize=8)
    h = result["header"]
    load = f"load avg {h['load_avg_start'][0]:.1f}->{h.get('load_avg_end', [float('nan')])[0]:.1f}"
    fig.suptitle(f"{h['device_name']} | torch {h['torch_version']} | {h['date']} | {load}", fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())


def _against_flops(ax: Any, rows: list[dict[str, Any]], precisions: list[str], key: str, title: str) -> None:
    """One line per precision through the MLP sizes, ordered by FLOPs per step
    (one model family, so the line is its crossover); other models (the LSTM)
    are lone markers. Each point is labelled with its size."""
    for precision in precisions:
        points = [
            (r["flops_per_step"], r[key], r["size"], r.get("model", "").startswith("MLP"))
            for r in rows
            if r["precision"] == precision
            and r.get("flops_per_step")
            and r.get(key) is not None
            and math.isfinite(r[key])
        ]
        mlp = sorted(p for p in points if p[3])
        line = ax.plot([p[0] for p in mlp], [p[1] for p in mlp], marker="o", label=precision)[0]
        others = [p for p in points if not p[3]]
        ax.plot([p[0] for p in others], [p[1] for p in others], marker="s", linestyle="none", color=line.get_color())
        for x, y, size, _ in points:
            ax.annotate(size, (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("FLOPs per training step (matrix products; squares: LSTM)", fontsize=8)
    ax.set_title(title, fontsize=10)
    if key == "speedup_vs_fp32":
        ax.legend(fontsize=8)

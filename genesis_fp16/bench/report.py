"""Write results: JSON (header + rows), CSV (each row stamped with the device),
a PNG plot and a Markdown table. Every file is written atomically."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any, Union

from ..checkpoint import atomic_write_bytes, atomic_write_text
from ..extras import require
from .auto import markdown as auto_markdown

PathLike = Union[str, Path]

CSV_COLUMNS = [
    "size", "model", "precision", "precision_run", "samples_per_s", "raw_samples_per_s", "ms_per_step",
    "speedup_vs_fp32", "overhead_vs_raw", "overhead_min", "overhead_max", "peak_mem_mb", "peak_mem_vs_fp32",
    "val_loss", "val_loss_delta_vs_fp32", "overflow_rate", "skipped_steps", "quality_steps", "steps_per_chunk",
    "repeats", "compiled", "cuda_graphs", "notes",
]  # fmt: skip
STAMP_COLUMNS = ["device", "device_name", "cpu_flags", "torch_version", "date", "command"]


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
            writer.writerow({"size": item["size"], "precision": item["precision"], "notes": f"{kind}: {item['reason']}", **stamp})
    return atomic_write_text(path, buf.getvalue())


def _fmt(value: Any) -> Any:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else value


def markdown_table(result: dict[str, Any]) -> str:
    lines = [
        "| size | model | precision | samples/s | speed-up vs fp32 | overhead vs raw (min-max) | peak mem MB | val loss | delta vs fp32 | overflow rate | notes |",
        "|---|---|---|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    for r in result["rows"]:
        speed = f"{r['speedup_vs_fp32']:.2f}x" if r["speedup_vs_fp32"] is not None else "-"
        delta = f"{100 * r['val_loss_delta_vs_fp32']:+.3f}%" if r["val_loss_delta_vs_fp32"] is not None else "-"
        lines.append(
            f"| {r['size']} | {r['model']} | {r['precision']} | {r['samples_per_s']:,.0f} | {speed} | "
            f"{r['overhead_vs_raw']:.3f} ({r['overhead_min']:.3f}-{r['overhead_max']:.3f}) | {r['peak_mem_mb']:.1f} | "
            f"{r['val_loss']:.5f} | {delta} | {r['overflow_rate']:.3f} | {r['notes'] or ''} |"
        )
    for kind in ("not_applicable", "failed"):
        for item in result.get(kind, []):
            lines.append(f"| {item['size']} | | {item['precision']} | {kind.replace('_', ' ')} | | | | | | | {item['reason']} |")
    return "\n".join(lines) + "\n" + auto_markdown(result.get("auto", []))


def write_plot(path: PathLike, result: dict[str, Any]) -> Path:
    """Three panels: throughput (log scale), speed-up vs fp32, overhead vs raw."""
    matplotlib = require("matplotlib", "the bench plot (--plot)")

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    sizes = list(dict.fromkeys(r["size"] for r in rows))
    precisions = list(dict.fromkeys(r["precision"] for r in rows))
    lookup = {(r["size"], r["precision"]): r for r in rows}
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
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
    h = result["header"]
    load = f"load avg {h['load_avg_start'][0]:.1f}->{h.get('load_avg_end', [float('nan')])[0]:.1f}"
    fig.suptitle(f"{h['device_name']} | torch {h['torch_version']} | {h['date']} | {load}", fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())

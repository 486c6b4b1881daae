"""Turn a results directory into PNG plots and a markdown report.

Reads ``<dir>/runs/*.json`` (sweep), and ``<dir>/probe.json`` and
``<dir>/replay.json`` when present. Plots use matplotlib's Agg backend.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

from genesis_fp16.base.storage import atomic_write_text
from genesis_fp16.base.extras import require
from genesis_fp16_tools.forensics.metrics import applied_stagnation, skipped_value_steps


def _load(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def load_runs(results_dir: Path) -> list[dict]:
    runs = []
    for p in sorted((Path(results_dir) / "runs").glob("*.json")):
        try:
            runs.append(json.loads(p.read_text()))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{p}: not valid JSON ({exc}); delete it and re-run the sweep to redo that run") from None
    return runs


def _mean(xs):
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return sum(xs) / len(xs) if xs else float("nan")


def format_cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.3g}" if (abs(v) >= 1e-3 or v == 0) else f"{v:.2e}"
    return str(v)


def sweep_table(runs: list[dict]) -> list[dict]:
    """One row per (configuration, value lr), averaged over seeds."""
    by_cfg: dict[tuple[str, float], list[dict]] = defaultdict(list)
    for r in runs:
        by_cfg[r["config"], r["args"]["value_lr"]].append(r)
    rows = []
    for (cfg, value_lr), rs in by_cfg.items():
        s = [r["summary"] for r in rs]
        rows.append(
            {
                "config": cfg,
                "value_lr": value_lr,
                "seeds": len(rs),
                "failed": sum(r["status"] == "failed" for r in rs),
                "failures": ",".join(sorted({r["failure"]["kind"] for r in rs if r.get("failure")})) or "-",
                "true_reward_first": _mean([x["true_reward_first"] for x in s]),
                "true_reward_last": _mean([x["true_reward_last"] for x in s]),
                "kl_fp64_last": _mean([x["kl_fp64_last"] for x in s]),
                "kl_abs_err_mean": _mean([x["kl_abs_err_mean"] for x in s]),
                "reward_tie_rate_mean": _mean([x.get("reward_tie_rate_mean") for x in s]),
                "reward_kendall_tau_mean": _mean([x.get("reward_kendall_tau_mean") for x in s]),
                "value_quant_step_median": _mean([x["value_quant_step_median"] for x in s]),
                # over applied value steps; the scaler's skips are counted apart
                "value_stagnation_rate_mean": _mean([applied_stagnation(r["steps"]) for r in rs]),
                "value_steps_skipped": sum(skipped_value_steps(r["steps"]) for r in rs),
                "overflow_steps": sum(x["policy_overflow_steps"] + x["value_overflow_steps"] for x in s),
            }
        )
    return rows


PROBE_COLUMNS = [
    "config",
    "seq_len",
    "kl_fp64",
    "kl_penalty_mean",
    "kl_abs_err",
    "log_ratio_near_zero_frac",
    "log_ratio_exact_zero_frac",
    "reward_resolution_median",
    "reward_resolution_rel_median",
    "reward_tie_rate",
    "reward_kendall_tau",
    "value_quant_step_median",
    "value_stagnation_rate",
    "accum_err_final",
    "accum_err_rounding_floor",
    "accum_err_slope",
    "policy_accum_err_final",
    "policy_accum_err_rounding_floor",
    "seq_log_ratio_abs_err_mean",
    "failure",
]


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        out.append("| " + " | ".join(format_cell(r.get(c)) for c in columns) + " |")
    return "\n".join(out)


def _plots(results_dir: Path, runs: list[dict], probe: dict | None, replay: dict | None) -> list[str]:
    matplotlib = require("matplotlib", "genesis-fp16 forensics analyze")

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    made: list[str] = []

    def save(fig: "matplotlib.figure.Figure", name: str) -> None:
        fig.tight_layout()
        fig.savefig(results_dir / name, dpi=100)
        plt.close(fig)
        made.append(name)

    if runs:
        fig, axes = plt.subplots(1, 3, figsize=(15, 4))
        by_cfg: dict[str, list[dict]] = defaultdict(list)
        for r in runs:
            by_cfg[r["config"]].append(r)
        for cfg, rs in sorted(by_cfg.items()):
            n = min(len(r["steps"]) for r in rs)
            for ax, key in zip(axes, ("true_reward", "kl_abs_err", "value_stagnation_rate")):
                ys = [_mean([r["steps"][i].get(key) for r in rs]) for i in range(n)]
                ax.plot(range(n), ys, label=cfg)
        for ax, title in zip(
            axes, ("true reward (mean over seeds)", "|KL - KL_fp64|", "value stagnation rate (fixed probe)")
        ):
            ax.set_title(title)
            ax.set_xlabel("PPO step")
        axes[1].set_yscale("symlog", linthresh=1e-10)
        axes[2].legend(fontsize=7)
        save(fig, "sweep.png")
    lrs = sorted({r["args"]["value_lr"] for r in runs})
    if len(lrs) > 1:  # H3: stagnation against the value model's learning rate
        fig, ax = plt.subplots(figsize=(6, 4))
        table = sweep_table(runs)
        for cfg in sorted({r["config"] for r in table}):
            rs = sorted((r for r in table if r["config"] == cfg), key=lambda r: r["value_lr"])
            ax.plot([r["value_lr"] for r in rs], [r["value_stagnation_rate_mean"] for r in rs], marker="o", label=cfg)
        ax.set_xscale("log")
        ax.set_xlabel("value-model learning rate (Adam)")
        ax.set_ylabel("fraction of probe values unchanged per update")
        ax.set_title("H3: value stagnation against the value lr")
        ax.legend(fontsize=7)
        save(fig, "h3_value_lr.png")
    if probe:
        rows = probe["rows"]
        lengths = sorted({r["seq_len"] for r in rows})
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for cfg in sorted({r["config"] for r in rows}):
            rs = sorted((r for r in rows if r["config"] == cfg), key=lambda r: r["seq_len"])
            axes[0].plot([r["seq_len"] for r in rs], [max(r["kl_abs_err"], 1e-12) for r in rs], marker="o", label=cfg)
            (line,) = axes[1].plot(
                [r["seq_len"] for r in rs], [max(r["accum_err_final"], 1e-12) for r in rs], marker="o", label=cfg
            )
            if all("accum_err_rounding_floor" in r for r in rs):  # dashed: rounding the exact logits alone
                axes[1].plot(
                    [r["seq_len"] for r in rs],
                    [max(r["accum_err_rounding_floor"], 1e-12) for r in rs],
                    linestyle="--",
                    color=line.get_color(),
                )
        for ax, title in zip(axes, ("H1 |KL - KL_fp64|", "H4 reference accum_err_final (dashed: rounding floor)")):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("sequence length")
            ax.set_title(title)
            ax.set_xticks(lengths, [str(x) for x in lengths])
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        axes[1].legend(fontsize=7)
        save(fig, "probe.png")
    if replay:
        fig, ax = plt.subplots(figsize=(6, 4))
        for r in replay["rows"]:
            c = r["curve"]
            ax.plot(c["lengths"], [max(v, 1e-12) for v in c["seq_logp_mismatch"]], label=r["config"])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("generated tokens")
        ax.set_title("policy |seq log-prob - fp64| (mismatch)")
        ax.legend(fontsize=7)
        save(fig, "replay_mismatch.png")
    return made


def length_slopes(rows: list[dict]) -> list[dict]:
    """Per configuration: the slope of log(accum_err_final) on log(scored
    tokens) across the probe's sequence lengths (needs two or more)."""
    import numpy as np

    from genesis_fp16_tools.forensics.metrics import loglog_slope
    from genesis_fp16_tools.forensics.probe import PROMPT_LEN

    out = []
    for cfg in dict.fromkeys(r["config"] for r in rows):
        rs = sorted((r for r in rows if r["config"] == cfg), key=lambda r: r["seq_len"])
        if len(rs) < 2:
            continue
        scored = np.array([r["seq_len"] - PROMPT_LEN for r in rs], dtype=float)
        out.append(
            {
                "config": cfg,
                "lengths": ",".join(str(r["seq_len"]) for r in rs),
                "accum_err_slope_across_lengths": loglog_slope(scored, np.array([r["accum_err_final"] for r in rs])),
                "policy_accum_err_slope_across_lengths": loglog_slope(
                    scored, np.array([r["policy_accum_err_final"] for r in rs])
                ),
            }
        )
    return out


def analyze(results_dir: Path) -> dict:
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise ValueError(f"{results_dir}: no such results directory (expected the --out of `forensics sweep`)")
    runs = load_runs(results_dir)
    probe = _load(results_dir / "probe.json")
    replay = _load(results_dir / "replay.json")
    if not runs and not probe and not replay:
        raise ValueError(f"{results_dir}: found no runs/*.json, probe.json or replay.json to analyze")
    plots = _plots(results_dir, runs, probe, replay)
    table = sweep_table(runs)
    parts = ["# Forensics report", ""]
    sweep_meta = _load(results_dir / "sweep.json") or {}
    meta = sweep_meta.get("meta") or (probe or {}).get("meta") or {}
    if meta:
        parts += [
            f"Device: {meta.get('cpu', '?')} ({meta.get('device', '?')}), torch {meta.get('torch_version', '?')}, "
            f"{meta.get('date', '?')}.",
            "",
        ]
    if runs:
        parts += [
            "## PPO sweep (mean over seeds)",
            "",
            f"Arguments: `{json.dumps(sweep_meta.get('args', {}), sort_keys=True)}`",
            "",
            markdown_table(table, list(table[0].keys())),
            "",
            "![sweep](sweep.png)",
            "",
        ]
        if "h3_value_lr.png" in plots:
            parts += [
                "### H3: value stagnation against the value lr (mean over steps and seeds)",
                "",
                markdown_table(
                    sorted(table, key=lambda r: (r["config"], r["value_lr"])),
                    [
                        "config",
                        "value_lr",
                        "value_stagnation_rate_mean",
                        "value_steps_skipped",
                        "value_quant_step_median",
                        "true_reward_last",
                        "failed",
                    ],
                ),
                "",
                "![H3 stagnation against value lr](h3_value_lr.png)",
                "",
            ]
    if probe:
        parts += [
            "## Static probe",
            "",
            f"Command: `{probe.get('meta', {}).get('command', '?')}`",
            "",
            markdown_table(probe["rows"], PROBE_COLUMNS),
            "",
            "![probe](probe.png)",
            "",
        ]
        slopes = length_slopes(probe["rows"])
        if slopes:
            parts += [
                "### H4: log-log slope of accum_err_final against scored length, across the probe's lengths",
                "",
                markdown_table(slopes, list(slopes[0].keys())),
                "",
            ]
    if replay:
        parts += [
            "## Replay of frozen FP32 trajectories",
            "",
            markdown_table(replay["rows"], PROBE_COLUMNS),
            "",
            "![replay](replay_mismatch.png)",
            "",
        ]
    report = "\n".join(parts)
    atomic_write_text(results_dir / "report.md", report)
    return {
        "report": str(results_dir / "report.md"),
        "plots": [str(results_dir / p) for p in plots],
        "sweep_table": table,
    }

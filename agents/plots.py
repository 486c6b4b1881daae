"""Learning curves as PNG: ``evolve --plot``, ``ppo --plot`` and
``scripts/evolution_table.py --plot``.

Each report becomes a `Figure` (panels of lines and a target), plain
data that tests can check; `write_png` is the only place that touches
matplotlib (the ``plots`` extra, Agg backend, imported when a plot is drawn).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

from genesis_fp16.base.storage import atomic_write_bytes
from genesis_fp16.base.extras import require

# what the loop's generation records carry (agents/evolve_report.py): every
# candidate runs one real episode on a training start state; a candidate whose
# episode meets the target is verified on every training start state
BEST_EPISODE = "best episode of the generation"
REFINED_EPISODE = "best refined candidate (critic gradient)"
CMA_EPISODE = "best CMA-ES sample"
VERIFIED = "verified: mean return on the training start states"
# the report keys of scripts/evolution_table.py (and the loop's own mode words)
METHOD_NAMES = {
    "full": "SE-Darwin loop (CMA-ES refined by the critic and world model)",
    "loop": "SE-Darwin loop (CMA-ES refined by the critic and world model)",
    "loop_e1": "SE-Darwin loop, ensemble of 1",
    "no_world_model": "same loop, world model off",
    "no_model": "same loop, world model off",
    "no_critic": "same loop, critic off",
    "cma": "one-episode CMA-ES (the loop, nothing refined)",
    "cma_long": "plain CMA-ES (long budget)",
    "cma_tuned": "tuned CMA-ES, 1 episode per candidate",
    "cma_tuned_norm": "tuned CMA-ES, normalised observations",
    "ars": "ARS V2-t",
    "sac": "SB3 SAC, defaults",
}


@dataclass(frozen=True)
class Line:
    x: tuple[float, ...]
    y: tuple[float, ...]
    label: Optional[str]  # None: not in the legend (a method's second and later seeds)
    color: Optional[str] = None
    width: float = 1.8
    alpha: float = 1.0
    # a best-so-far holds its value until the next generation: a step, not a slope
    steps: bool = True
    marker: Optional[str] = None


@dataclass(frozen=True)
class Panel:
    title: str
    xlabel: str
    ylabel: str
    lines: list[Line] = field(default_factory=list)
    target: Optional[float] = None
    target_label: str = "target"
    log_x: bool = False
    log_y: bool = False
    integer_x: bool = False  # generations: no 0.5 ticks


@dataclass(frozen=True)
class Figure:
    title: str
    panels: list[Panel]


def _number(value: Any) -> Optional[float]:
    """A finite float, or None (a lost candidate's -inf is written as the string "-inf")."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _points(
    records: Iterable[Mapping[str, Any]], x_key: str, y_key: str
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    pairs = [(_number(r.get(x_key)), _number(r.get(y_key))) for r in records]
    kept = [(x, y) for x, y in pairs if x is not None and y is not None]
    return tuple(x for x, _ in kept), tuple(y for _, y in kept)


def _verified(report: Mapping[str, Any], x_key: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The candidates verified on every training start state (``full``), at
    their generation's ``x_key``: the set the target is judged on."""
    xs, ys = [], []
    for g in report.get("generations", []):
        x = _number(g.get(x_key))
        for c in g.get("candidates") or []:
            y = _number(c.get("real_return"))
            if c.get("full") and x is not None and y is not None:
                xs.append(x)
                ys.append(y)
    return tuple(xs), tuple(ys)


def _positive(points: tuple[tuple[float, ...], tuple[float, ...]]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Points a log axis can draw (a loss of exactly 0 cannot be)."""
    kept = [(x, y) for x, y in zip(*points) if y > 0]
    return tuple(x for x, _ in kept), tuple(y for _, y in kept)


def _has_env_steps(reports: Sequence[Mapping[str, Any]]) -> bool:
    return any(g.get("env_steps") is not None for r in reports for g in r.get("generations", []))


def _wide_range(lines: Sequence[Line]) -> bool:
    """Log x when one method's budget dwarfs another's (CMA-ES 10x)."""
    xs = [x for line in lines for x in line.x if x > 0]
    return bool(xs) and max(xs) / min(xs) > 50


def evolve_figure(report: Mapping[str, Any]) -> Figure:
    """One ``genesis-fp16 evolve`` report: against real episodes (and env
    steps when the generations carry them) the best one-episode return of
    each generation, split into refined candidates and CMA-ES samples when
    both ran, the verified candidates, the best's held-out return and the
    target; then the world model's and the critic's validation loss per
    generation, each where it trained."""
    target = _number(report.get("target"))
    generations = report.get("generations", [])
    heldout = _number(report.get("heldout_return"))
    last = generations[-1] if generations else {}
    panels = []
    for x_key, xlabel in (("real_episodes", "real episodes"), ("env_steps", "real env steps")):
        if x_key == "env_steps" and not _has_env_steps([report]):
            continue
        # one value per generation, not a best-so-far: a line between points, not a step
        lines = [
            Line(
                *_points(generations, x_key, "best_return"),
                BEST_EPISODE,
                color="C0",
                width=2.2,
                steps=False,
                marker="o",
            )
        ]
        kinds = [
            (key, label, color, marker)
            for key, label, color, marker in (
                ("refined_best", REFINED_EPISODE, "C1", "^"),
                ("cma_best", CMA_EPISODE, "C4", "v"),
            )
            if _points(generations, x_key, key)[0]
        ]
        if len(kinds) == 2:  # with one kind only, its line is the best episode's
            lines += [
                Line(
                    *_points(generations, x_key, key),
                    label,
                    color=color,
                    width=1.0,
                    alpha=0.8,
                    steps=False,
                    marker=marker,
                )
                for key, label, color, marker in kinds
            ]
        vx, vy = _verified(report, x_key)
        if vx:
            lines.append(Line(vx, vy, VERIFIED, color="C3", width=0.0, steps=False, marker="s"))
        end = _number(last.get(x_key))
        if heldout is not None and end is not None:
            lines.append(
                Line(
                    (end,),
                    (heldout,),
                    f"held-out return of the best ({report.get('heldout_episodes')} unseen start states)",
                    color="C2",
                    steps=False,
                    marker="D",
                )
            )
        panels.append(Panel(f"return against {xlabel}", xlabel, "episode return", lines, target))
    learners = report.get("learners") or {}
    for prefix, name, color, ylabel in (
        ("wm", "world_model", "C1", "validation loss (normalised MSE)"),
        ("critic", "critic", "C3", "validation loss (TD error)"),
    ):
        x, y = _positive(_points(generations, "generation", f"{prefix}_val_loss"))
        if x:
            precision = (learners.get(name) or {}).get("precision")
            line = Line(x, y, f"validation loss ({precision})", color=color, steps=False, marker="o")
            panels.append(Panel(name.replace("_", " "), "generation", ylabel, [line], log_y=True, integer_x=True))
    return Figure(f"evolve {report.get('mode')} on {report.get('env')}, seed {report.get('seed')}", panels)


def ppo_figure(result: Mapping[str, Any], target: Optional[float] = None, target_label: str = "target") -> Figure:
    """One ``genesis-fp16 ppo`` result (its ``--json`` form): the mean return of
    the last 20 training episodes per iteration against env steps, the final
    deterministic evaluation as one point, and the target when there is one."""
    x, y = _points(result.get("history", []), "global_step", "mean_return")
    lines = [Line(x, y, "training: mean return of the last 20 episodes", color="C0", steps=False)]
    evaluation, steps = _number(result.get("eval_return")), _number(result.get("env_steps"))
    if evaluation is not None and steps is not None:
        episodes = len(result.get("eval_returns") or [])
        lines.append(
            Line(
                (steps,),
                (evaluation,),
                f"evaluation: mean of {episodes} deterministic episodes",
                color="C2",
                steps=False,
                marker="D",
            )
        )
    panel = Panel("return against env steps", "env steps", "episode return", lines, target, target_label)
    return Figure(f"ppo on {result.get('env_id')}, seed {result.get('seed')}", [panel])


def table_figure(results: Mapping[str, Any]) -> Figure:
    """An ``evolution_table.py`` report: per method one colour, a thin line per
    seed of its records' ``best_return`` (the loop's: the best episode of each
    generation; a baseline's: its checks), the seed's held-out return at its
    last point, and the target. Runs stop at the target, so seeds end at
    different points and a median across them would mix finished and running
    seeds. Then the loop's world model and critic losses, a line per seed."""
    runs: Mapping[str, list[Mapping[str, Any]]] = results.get("runs", {})
    target = _number(results.get("target"))
    reports = [r for rs in runs.values() for r in rs]
    panels = []
    for x_key, xlabel in (("real_episodes", "real episodes"), ("env_steps", "real env steps")):
        if x_key == "env_steps" and not _has_env_steps(reports):
            continue
        lines = []
        for i, (mode, mode_reports) in enumerate(runs.items()):
            name = METHOD_NAMES.get(mode, mode)
            if mode == "cma_long" and results.get("cma_long_budget"):
                name = f"plain CMA-ES (budget {results['cma_long_budget']})"
            for k, report in enumerate(mode_reports):
                generations = report.get("generations", [])
                x, y = _points(generations, x_key, "best_return")
                label = f"{name} ({len(mode_reports)} seeds)" if k == 0 else None
                lines.append(Line(x, y, label, color=f"C{i}", width=1.0, alpha=0.7, steps=False, marker="o"))
                end, heldout = (
                    _number((generations[-1] if generations else {}).get(x_key)),
                    _number(report.get("heldout_return")),
                )
                if end is not None and heldout is not None:
                    lines.append(Line((end,), (heldout,), None, color=f"C{i}", steps=False, marker="D"))
        panels.append(
            Panel(
                f"return against {xlabel} (diamonds: held-out return)",
                xlabel,
                "episode return",
                lines,
                target,
                log_x=_wide_range(lines),
            )
        )
    loop = runs.get("full") or runs.get("loop") or []
    for prefix, name, ylabel in (
        ("wm", "world model", "validation loss (normalised MSE)"),
        ("critic", "critic", "validation loss (TD error)"),
    ):
        learned = []
        for report in loop:
            x, y = _positive(_points(report.get("generations", []), "generation", f"{prefix}_val_loss"))
            if x:
                label = f"loop's {name}, one line per seed" if not learned else None
                learned.append(Line(x, y, label, color="C0", width=1.0, alpha=0.7, steps=False, marker="o"))
        if learned:
            panels.append(Panel(name, "generation", ylabel, learned, log_y=True, integer_x=True))
    seeds = results.get("seeds", [])
    return Figure(f"{results.get('env')}: {len(seeds)} seeds, budget {results.get('budget')} real episodes", panels)


def write_png(figure: Figure, path: Path, purpose: str) -> Path:
    """Draw ``figure`` and write it to ``path`` atomically (a reader never
    sees half a PNG). ``purpose`` names the flag for the missing-extra error."""
    matplotlib = require("matplotlib", purpose)
    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    # constrained layout makes room for the legends beside the axes
    fig, axes = plt.subplots(
        len(figure.panels), 1, figsize=(11, 3.6 * len(figure.panels)), squeeze=False, layout="constrained"
    )
    try:
        for ax, panel in zip(axes[:, 0], figure.panels):
            _draw(ax, panel)
        fig.suptitle(figure.title)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=110)
    finally:
        plt.close(fig)
    return atomic_write_bytes(path, buffer.getvalue())


def _draw(ax: Any, panel: Panel) -> None:
    for line in panel.lines:
        ax.plot(
            line.x,
            line.y,
            label=line.label,
            color=line.color,
            linewidth=line.width,
            alpha=line.alpha,
            drawstyle="steps-post" if line.steps else "default",
            marker=line.marker,
            markersize=4 if len(line.x) > 1 else 7,
        )
    if panel.target is not None:
        ax.axhline(
            panel.target, color="black", linestyle="--", linewidth=1.0, label=f"{panel.target_label} {panel.target:g}"
        )
    if panel.log_x:
        ax.set_xscale("log")
    if panel.log_y:
        ax.set_yscale("log")
    if panel.integer_x:
        ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_title(panel.title, fontsize=10)
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.ylabel)
    ax.grid(alpha=0.3)
    if any(line.label for line in panel.lines) or panel.target is not None:
        # beside the axes: inside, it would hide the curves near the target
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))

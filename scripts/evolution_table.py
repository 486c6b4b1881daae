"""Measure the table in docs/EVOLUTION.md.

    .venv/bin/python scripts/evolution_table.py --seeds 0 1 2 3 4 --methods loop no_model floor cma_tuned
    cma_tuned_norm ars sac --budget-steps 12000 --cma-long-budget 0 --out docs/evolution/pendulum_target300.json
    .venv/bin/python scripts/evolution_table.py --env InvertedPendulum-v5 --out ip.json
    .venv/bin/python scripts/evolution_table.py --summarize docs/evolution/*.json
    .venv/bin/python scripts/evolution_table.py --summarize docs/evolution/pendulum_target300.json --plot pendulum.png

Any task ``genesis-fp16 evolve --env`` takes (``--target``, ``--policy`` and
``--episode-steps`` as there).

    .venv/bin/python scripts/evolution_table.py --env Swimmer-v5 --methods loop no_model no_critic floor cma_tuned
    cma_tuned_norm ars sac

For each seed, every method ``--methods`` names (``--modes`` is the same
option): ``full`` or ``loop`` (the loop with its world model; ``--ensemble``
sets its ensemble size where EvolveConfig has that field), ``loop_e1`` (the
loop with an ensemble of 1), ``no_world_model`` or ``no_model`` (the critic on
real data only), ``no_critic`` (refinement through 5 model steps), ``cma``,
``floor`` or ``cma_project`` (the loop with nothing learned: a one-episode
CMA-ES on normalised observations), ``cma_long``
(the same with a long budget), and the model-free baselines of
``benchmarks.baselines``: ``cma_tuned`` / ``cma_tuned_norm`` (pycma, one episode per
candidate, without / with observation normalisation), ``ars`` (ARS V2-t) and
``sac`` (Stable-Baselines3 SAC for the loop's env steps of the same seed, or
``--sac-steps``; capped at ``--sac-max-steps``). How a baseline's steps to the
target are counted: ``benchmarks/baselines/common.py``. Then world-model
validation loss in FP32, BF16 and FP16 on the same data and seed. Prints
markdown tables, the host first, and writes every run's report as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple, Optional, Sequence

import torch

# the baselines live in benchmarks/ at the repository root, not in an installed package
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.plots import table_figure, write_png  # noqa: E402
from agents.se_darwin_agent import EvolveConfig, SEDarwinAgent, run_cma_baseline  # noqa: E402
from agents.tasks import ResolvedTask, Task, get_task, run_episodes  # noqa: E402
from benchmarks.baselines import BaselineConfig, host, run_ars, run_cma_tuned, run_sac  # noqa: E402
from benchmarks.baselines.common import Clock  # noqa: E402
from genesis_fp16.base.storage import atomic_write_text  # noqa: E402
from genesis_fp16.base.extras import MissingExtraError, require  # noqa: E402
from genesis_fp16.base.seeds import numpy_rng  # noqa: E402
from genesis_fp16.base.settings import load_settings  # noqa: E402
from infrastructure.replay_buffer import trajectories_from_episodes  # noqa: E402
from infrastructure.world_model import WorldModel  # noqa: E402


def cpu_model() -> str:
    from genesis_fp16.precision.capability import cpu_flags, cpu_name

    name = cpu_name()
    flags = [f for f in ("avx512_bf16", "amx_bf16") if f in cpu_flags()] + (
        ["no AMX"] if "amx_bf16" not in cpu_flags() else []
    )
    return f"{name} [{', '.join(flags)}]" if flags else name


ALIASES = {
    "loop": "full",
    "no_model": "no_world_model",
    "floor": "cma",
    "cma_project": "cma",
}  # --methods' names -> the report keys
BASELINES = ("cma_tuned", "cma_tuned_norm", "ars", "sac")
METHODS = ("full", "loop_e1", "no_world_model", "no_critic", "cma", "cma_long", *BASELINES)
NAMES = {
    "full": "SE-Darwin loop: CMA-ES refined by the critic, the world model's rollouts training it",
    "loop_e1": "SE-Darwin loop, ensemble of 1",
    "no_world_model": "same loop, world model off (the critic on real data only)",
    "no_critic": "same loop, critic off (refinement through 5 model steps)",
    "cma": "the floor: the loop with nothing learned, a one-episode CMA-ES (same budget)",
    "cma_tuned": "tuned CMA-ES, 1 episode per candidate",
    "cma_tuned_norm": "tuned CMA-ES, 1 episode per candidate, normalised observations",
    "ars": "ARS V2-t",
    "sac": "SB3 SAC (defaults)",
}


class Options(NamedTuple):
    """What the methods take beyond the budget: the loop's ensemble size and
    env-step budget (passed where EvolveConfig has those fields), the
    baselines' options (benchmarks.baselines)."""

    ensemble: Optional[int] = None
    budget_steps: Optional[int] = None
    cma_sigma: float = 0.5
    cma_popsize: Optional[int] = None
    check_every: Optional[int] = None
    stop_at_target: bool = False
    sac_steps: Optional[int] = None
    sac_max_steps: Optional[int] = None


def evolve_fields() -> set[str]:
    """EvolveConfig's field names: an option of the loop is passed only where it is a field (the ensemble lands with
    issue 26)."""
    return {f.name for f in dataclasses.fields(EvolveConfig)}


def run_mode(
    mode: str,
    seed: int,
    budget: int,
    state_dir: Path,
    wm_precision: Optional[str],
    task: dict[str, Any],
    custom: Optional[Task] = None,
    opts: Optional[Options] = None,
) -> dict[str, Any]:
    opts = opts or Options()
    if mode in BASELINES:
        cfg = BaselineConfig(
            env_id=task["env_id"],
            seed=seed,
            budget=budget,
            budget_steps=opts.budget_steps,
            target=task["target"],
            policy=task["policy"],
            episode_steps=task["episode_steps"],
            check_every=opts.check_every,
            stop_at_target=opts.stop_at_target,
        )
        if mode == "ars":
            return run_ars(cfg, task=custom)
        if mode == "sac":
            return run_sac(cfg, total_steps=opts.sac_steps, max_steps=opts.sac_max_steps, task=custom)
        return run_cma_tuned(
            cfg, sigma0=opts.cma_sigma, popsize=opts.cma_popsize, normalize=mode == "cma_tuned_norm", task=custom
        )
    clock = Clock()
    settings = load_settings(state_dir=state_dir)
    fields, extra = evolve_fields(), {}
    if mode in ("full", "loop_e1") and "ensemble" in fields and (mode == "loop_e1" or opts.ensemble is not None):
        extra["ensemble"] = 1 if mode == "loop_e1" else opts.ensemble
    if opts.budget_steps is not None and "budget_steps" in fields:
        extra["budget_steps"] = opts.budget_steps
    if mode == "no_critic":
        extra.update(use_critic=False, refine_horizon=5)
    config = EvolveConfig(
        seed=seed, budget=budget, use_world_model=mode != "no_world_model", precision=wm_precision, **task, **extra
    )
    if mode.startswith("cma"):
        report = asyncio.run(run_cma_baseline(config, task=custom))
    else:
        report = asyncio.run(SEDarwinAgent(config, task=custom, settings=settings).evolve())
    report.setdefault("cpu_s", clock.cpu_s)  # this process and the evaluation workers it waited for
    return report


def precision_table(
    task: ResolvedTask, seeds: list[int], steps: int, episodes: int, state_dir: Path
) -> list[dict[str, Any]]:
    """World-model validation loss per precision on identical data and seed."""
    settings = load_settings(state_dir=state_dir)
    rows = []
    for seed in seeds:
        starts = task.start_states(seed)
        rng = numpy_rng(seed, "evolution_table.precision_params")
        trajs = []
        for k, params in enumerate(task.policy.random_params(rng, episodes, 1.0)):
            res = run_episodes(task.episode_spec, params, [starts.train[k % len(starts.train)]])
            for t in trajectories_from_episodes(res["episodes"], f"random{k}"):
                t.id = k + 1
                trajs.append(t)
        row: dict[str, Any] = {"seed": seed, "transitions": sum(len(t.obs) for t in trajs), "steps": steps}
        for precision in ("fp32", "bf16", "fp16"):
            wm = WorldModel(
                task.policy.obs_dim,
                task.policy.act_dim,
                done_head=task.learns_termination,
                precision=precision,
                seed=seed,
                settings=settings,
            )
            report = asyncio.run(wm.train(steps, trajectories=trajs, save=False))
            row[precision] = report.val_loss
            row[f"{precision}_wall_s"] = report.wall_s
            row[f"{precision}_skipped"] = report.skipped_steps
        rows.append(row)
    return rows


def _median(values: list[Optional[float]]) -> Optional[float]:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def markdown(results: dict[str, Any]) -> str:
    budget = results["budget"]
    lines = [
        f"{results['env']}, median over seeds {results['seeds']} (budget {budget} real episodes; target: mean return "
        ">= "
        f"{results['target']:g} on {results['n_train']} training start states; held-out: "
        f"{results['n_heldout']} start states never used by the search)."
        + (
            " Termination learned by the world model's done head (--learn-termination)."
            if results.get("termination") == "learned (done head)"
            else ""
        ),
        "",
        "| method | world-model precision | reached target | median real episodes to target | median real env steps | "
        "median held-out return | median best train return | median wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    names = {**NAMES, "cma_long": f"plain CMA-ES (budget {results['cma_long_budget']})"}
    for mode, reports in results["runs"].items():
        reached = [r for r in reports if r["target_reached"]]
        to_target = [r["episodes_to_target"] if r["target_reached"] else None for r in reports]
        med = _median([float(v) for v in to_target if v is not None]) if len(reached) * 2 > len(reports) else None
        med_text = f"{med:.0f}" if med is not None else f"not reached (> {reports[0]['budget']})"
        ho, tr = _median([r["heldout_return"] for r in reports]), _median([r["train_return"] for r in reports])
        steps = _median([float(r["env_steps"]) for r in reports if "env_steps" in r])
        precisions = (
            sorted({str(((r.get("learners") or {}).get("world_model") or {}).get("precision")) for r in reports})
            if mode == "full"
            else ["-"]
        )
        lines.append(
            f"| {names.get(mode, mode)} | {'/'.join(precisions)} | {len(reached)}/{len(reports)} | {med_text} | "
            f"{'-' if steps is None else f'{steps:.0f}'} | {'-' if ho is None else f'{ho:.1f}'} | "
            f"{'-' if tr is None else f'{tr:.1f}'} | {_median([r['wall_s'] for r in reports]):.1f} |"
        )
    lines += ["", "Per seed, real episodes to target (- = not reached):", ""]
    lines.append("| method | " + " | ".join(f"seed {s}" for s in results["seeds"]) + " |")
    lines.append("|---|" + "---|" * len(results["seeds"]))
    for mode, reports in results["runs"].items():
        cells = [str(r["episodes_to_target"]) if r["target_reached"] else "-" for r in reports]
        lines.append(f"| {names.get(mode, mode)} | " + " | ".join(cells) + " |")
    if results.get("precision"):
        lines += [
            "",
            "World-model validation loss (normalised MSE) on identical data and seed, "
            f"{results['precision'][0]['steps']} steps:",
            "",
            "| seed | transitions | FP32 | BF16 | FP16 (CPU scaler) | BF16 vs FP32 | FP16 vs FP32 |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in results["precision"]:
            gb = (row["bf16"] - row["fp32"]) / row["fp32"]
            gf = (row["fp16"] - row["fp32"]) / row["fp32"]
            lines.append(
                f"| {row['seed']} | {row['transitions']} | {row['fp32']:.5f} | {row['bf16']:.5f} | {row['fp16']:.5f} "
                f"| {gb:+.2%} | {gf:+.2%} |"
            )
    if any(mode in results["runs"] for mode in BASELINES):
        lines += ["", comparison(results)]
    measured = host_line(results["environment"])
    if results.get("kept"):
        kept = results["kept"]
        measured += f" Modes {', '.join(kept['modes'])} kept from the run of {kept['from']['date']} (--keep-finished)."
    return "\n".join([measured, "", *lines])


def host_line(env: Optional[dict[str, Any]]) -> str:
    """Where a table was measured, as its report recorded it."""
    if not env:
        return "Measured on a host the report does not record."
    flags = f", flags {' '.join(env['flags']) or 'none of avx2/avx512/amx/f16c'}" if "flags" in env else ""
    return (
        f"Measured {env['date']} on {env['cpu']} ({env['cores']} cores, shared{flags}), torch {env['torch']}, python "
        f"{env['python']}."
    )


def _steps_to_target(report: dict[str, Any]) -> Optional[float]:
    """Env steps when the target was met: a baseline records it; the loop stops there, so its env steps are that
    number."""
    if not report["target_reached"]:
        return None
    return float(
        report["env_steps_to_target"] if report.get("env_steps_to_target") is not None else report["env_steps"]
    )


def _reached(reports: list[dict[str, Any]]) -> tuple[str, Optional[float], Optional[float], Optional[float]]:
    """(reached n/seeds, median episodes and env steps to the target when most seeds got there, median env steps
    spent)."""
    hits = [r for r in reports if r["target_reached"]]
    majority = len(hits) * 2 > len(reports)
    eps = _median([float(r["episodes_to_target"]) for r in hits]) if majority else None
    steps = _median([_steps_to_target(r) for r in hits]) if majority else None
    return f"{len(hits)}/{len(reports)}", eps, steps, _median([float(r["env_steps"]) for r in reports])


def _method_settings(mode: str, reports: list[dict[str, Any]]) -> str:
    if not reports or "settings" not in reports[0]:
        ensemble = sorted({str(r["config"]["ensemble"]) for r in reports if "ensemble" in r.get("config", {})})
        return f"ensemble {'/'.join(ensemble)}" if ensemble else "-"
    s = reports[0]["settings"]
    if mode.startswith("cma_tuned"):
        final = _median([r["settings"]["sigma_final"] for r in reports])
        return f"sigma0 {s['sigma0']:g} (final median {final:.3g}), popsize {s['popsize']}, {s['policy']}"
    if mode == "ars":
        return f"{s['version']}: alpha {s['step_size']:g}, nu {s['noise']:g}, N {s['directions']}, b {s['top']}"
    if mode == "sac":
        capped = [r for r in reports if r["settings"]["capped"]]
        cap = f"; CAPPED at {capped[0]['settings']['steps_run']} env steps on {len(capped)} seed(s)" if capped else ""
        return (
            f"SB3 {s['stable_baselines3']} defaults, env steps asked "
            f"{'/'.join(str(r['settings']['steps_asked']) for r in reports)}{cap}"
        )
    return "-"


def _fmt(value: Optional[float], spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def comparison(results: dict[str, Any]) -> str:
    """Every method against the target at equal real budget: reached, env
    steps to the target, held-out return, time; then the ratio of the best
    tuned model-free baseline's (CMA-ES, ARS) env steps to the loop's, and SAC's."""
    runs = results["runs"]
    lines = [
        "| method | reached target | median real episodes to target | median env steps to target | median env steps "
        "spent | "
        "median held-out return | median wall s (a baseline's off-budget target checks included) | median CPU s | "
        "settings |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    stats = {}
    for mode, reports in runs.items():
        reached, eps, steps, spent = stats[mode] = _reached(reports)
        cpu = _median([r.get("cpu_s") for r in reports])
        wall = _fmt(_median([r["wall_s"] for r in reports]))
        checks = _median([r.get("check_wall_s") for r in reports])
        if checks is not None:
            wall += f" ({checks:.1f} in checks)"
        lines.append(
            f"| {NAMES.get(mode, mode)} | {reached} | {_fmt(eps, '.0f')} | {_fmt(steps, '.0f')} | "
            f"{_fmt(spent, '.0f')} | "
            f"{_fmt(_median([r['heldout_return'] for r in reports]))} | {wall} | {_fmt(cpu)} | "
            f"{_method_settings(mode, reports)} |"
        )
    loop = stats.get("full")
    lines.append("")
    if loop is None or loop[2] is None:
        lines.append(
            "The loop did not reach the target on most seeds (or did not run): no ratio of env steps to the target."
        )
        return "\n".join(lines)
    tuned = [m for m in ("cma_tuned", "cma_tuned_norm", "ars") if m in stats]
    there = [m for m in tuned if stats[m][2] is not None]
    if there:
        best = min(there, key=lambda m: stats[m][2])
        lines.append(
            f"Best tuned model-free baseline: {NAMES[best]}, a median of {stats[best][2]:.0f} env steps to the target; "
            f"the loop {loop[2]:.0f}: **{stats[best][2] / loop[2]:.1f}x** the loop's."
        )
    elif tuned:
        most = max(stats[m][3] or 0.0 for m in tuned)
        lines.append(
            f"No tuned model-free baseline ({', '.join(tuned)}) reached the target on most seeds within a median of "
            f"{most:.0f} "
            f"env steps: **> {most / loop[2]:.1f}x** the loop's {loop[2]:.0f}."
        )
    if "sac" in stats:
        sac = stats["sac"]
        lines.append(
            f"SAC: a median of {sac[2]:.0f} env steps to the target, {sac[2] / loop[2]:.1f}x the loop's."
            if sac[2] is not None
            else f"SAC did not reach the target on most seeds in a median of {_fmt(sac[3], '.0f')} env steps."
        )
    return "\n".join(lines)


def summary(tables: list[dict[str, Any]]) -> str:
    """One row per measured table (task and target): the loop against its
    ablation and plain CMA-ES, episodes and env steps to the target."""
    lines = [
        "| task (target) | seeds | loop: reached | loop: median episodes to target | loop: median env steps to target "
        "| "
        "loop: median held-out | no world model: reached | CMA-ES same budget: reached | CMA-ES 10x: reached | "
        "CMA-ES 10x: median episodes to target | CMA-ES 10x / loop |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def reached(mode: str) -> tuple[str, Optional[float], Optional[float]]:
        reports = runs.get(mode) or []
        if not reports:
            return "-", None, None
        hits = [r for r in reports if r["target_reached"]]
        majority = len(hits) * 2 > len(reports)  # a median to the target exists only if most seeds got there
        eps = _median([float(r["episodes_to_target"]) for r in hits]) if majority else None
        steps = _median([float(r["env_steps"]) for r in hits]) if majority else None
        return f"{len(hits)}/{len(reports)}", eps, steps

    for t in tables:
        runs = t["runs"]
        loop, loop_eps, loop_steps = reached("full")
        cma_long, cma_eps, _ = reached("cma_long")
        heldout = _median([r["heldout_return"] for r in runs.get("full", [])])
        if cma_eps is not None and loop_eps:
            ratio = f"{cma_eps / loop_eps:.1f}x"
        elif "cma_long" in runs and loop_eps:
            ratio = f"> {t['cma_long_budget'] / loop_eps:.0f}x (CMA-ES not there in {t['cma_long_budget']})"
        else:
            ratio = "-"
        cells = [
            f"{t['env']} ({t['target']:g})",
            str(len(t["seeds"])),
            loop,
            "-" if loop_eps is None else f"{loop_eps:.0f}",
            "-" if loop_steps is None else f"{loop_steps:.0f}",
            "-" if heldout is None else f"{heldout:.1f}",
            reached("no_world_model")[0],
            reached("cma")[0],
            cma_long,
            "-" if cma_eps is None else f"{cma_eps:.0f}",
            ratio,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def baseline_summary(tables: list[dict[str, Any]]) -> str:
    """One row per table with the model-free baselines: the loop against
    the best tuned baseline (CMA-ES with one episode per candidate, ARS)
    and SAC, in env steps to the target and held-out return."""
    lines = [
        "| task (target) | seeds | loop: reached | loop: median env steps to target | loop: median held-out | best "
        "tuned baseline | "
        "its reached | its median env steps to target | its median held-out | baseline / loop env steps | SAC: "
        "reached | "
        "SAC: median env steps to target | SAC: median held-out |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in tables:
        runs = t["runs"]
        if not any(m in runs for m in BASELINES):
            continue
        loop = _reached(runs["full"]) if "full" in runs else ("-", None, None, None)
        tuned = {m: _reached(runs[m]) for m in ("cma_tuned", "cma_tuned_norm", "ars") if m in runs}
        there = [m for m in tuned if tuned[m][2] is not None]
        best = (
            min(there, key=lambda m: tuned[m][2])
            if there
            else (
                max(tuned, key=lambda m: _median([r["heldout_return"] for r in runs[m]]) or -math.inf)
                if tuned
                else None
            )
        )
        cells = [
            f"{t['env']} ({t['target']:g})",
            str(len(t["seeds"])),
            loop[0],
            _fmt(loop[2], ".0f"),
            _fmt(_median([r["heldout_return"] for r in runs.get("full", [])])),
        ]
        if best is None:
            cells += ["-"] * 5
        else:
            b = tuned[best]
            if b[2] is not None and loop[2]:
                ratio = f"{b[2] / loop[2]:.1f}x"
            elif loop[2] and b[3]:
                ratio = f"> {b[3] / loop[2]:.1f}x (not there in {b[3]:.0f})"
            else:
                ratio = "-"
            cells += [
                NAMES[best],
                b[0],
                _fmt(b[2], ".0f"),
                _fmt(_median([r["heldout_return"] for r in runs[best]])),
                ratio,
            ]
        sac = _reached(runs["sac"]) if "sac" in runs else None
        cells += (
            [sac[0], _fmt(sac[2], ".0f"), _fmt(_median([r["heldout_return"] for r in runs["sac"]]))]
            if sac
            else ["-"] * 3
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _number(value: Any) -> Optional[float]:
    return (
        float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        else None
    )


def merge_tables(tables: list[dict[str, Any]], paths: Sequence[Path]) -> list[dict[str, Any]]:
    """Tables of the same task and target merged into one: each method's
    runs from every file, sorted by seed. A method measured twice on the same
    seed is an error (which of the two would the table show?)."""
    merged: dict[tuple[str, float], dict[str, Any]] = {}
    origin: dict[tuple[str, float, str, Any], Path] = {}
    for t, path in zip(tables, paths):
        key = (t["env"], float(t["target"]))
        into = merged.setdefault(key, {**t, "seeds": [], "runs": {}})
        for mode, reports in t["runs"].items():
            for r in reports:
                seen = origin.setdefault((*key, mode, r.get("seed")), path)
                if seen is not path:
                    raise SystemExit(
                        f"--merge: {mode} seed {r.get('seed')} of {key[0]} (target {key[1]:g}) is in both {seen} and "
                        f"{path}"
                    )
                into["runs"].setdefault(mode, []).append(r)
    for t in merged.values():
        for reports in t["runs"].values():
            reports.sort(key=lambda r: (r.get("seed") is None, r.get("seed")))
        t["seeds"] = sorted(
            {r.get("seed") for reports in t["runs"].values() for r in reports if r.get("seed") is not None}
        )
    return list(merged.values())


def seed_table(t: dict[str, Any]) -> str:
    """Every method of a (merged) table, seed by seed: held-out return, and
    env steps to the target where it was met."""
    seeds = t["seeds"]
    lines = [
        f"{t['env']}, target {t['target']:g}, seeds {', '.join(str(s) for s in seeds)}:",
        "",
        "| method | reached | held-out return per seed | median held-out | env steps to target per seed | median env "
        "steps to target | "
        "median env steps spent | median CPU s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode, reports in t["runs"].items():
        by_seed = {r.get("seed"): r for r in reports}
        heldout = " / ".join(_fmt(_number(by_seed[s]["heldout_return"])) if s in by_seed else "." for s in seeds)
        to_target = " / ".join(_fmt(_steps_to_target(by_seed[s]), ".0f") if s in by_seed else "." for s in seeds)
        reached, _, steps, spent = _reached(reports)
        cpu = _median([_number(r.get("cpu_s")) for r in reports])
        cells = [
            NAMES.get(mode, mode),
            reached,
            heldout,
            _fmt(_median([_number(r["heldout_return"]) for r in reports])),
            to_target,
            _fmt(steps, ".0f"),
            _fmt(spent, ".0f"),
            _fmt(cpu, ".0f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "(`.`: not measured on that seed; `-`: not reached. A loop's env steps to the target are the steps it ran: it "
        "stops "
        "there; a baseline's are those at its first check that met the target, checked off the budget. CPU s: the "
        "runs of this script "
        "only, a plain `evolve --json` report does not record it.)",
    ]
    return "\n".join(lines)


def as_table(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """A report of this script as it is; a plain `genesis-fp16 evolve --json`
    report (one run, no "runs") as a table of that one run."""
    if "runs" in data:
        return data
    if "env" in data and "generations" in data:
        return {
            "env": data["env"],
            "target": data["target"],
            "seeds": [data.get("seed")],
            "budget": data.get("budget"),
            "cma_long_budget": 0,
            "runs": {data.get("mode") or "full": [data]},
            "environment": data.get("environment"),
        }
    raise SystemExit(
        f"{path}: neither a report of this script (no 'runs') nor a `genesis-fp16 evolve --json` report (no 'env' and "
        "'generations')"
    )


SAME_SETTINGS = (
    "env",
    "target",
    "policy",
    "episode_steps",
    "n_train",
    "n_heldout",
    "seeds",
    "budget",
    "cma_long_budget",
    "wm_precision",
    "termination",
    "options",
)


def finished_modes(path: Path, results: dict[str, Any]) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    """The modes a report at ``path`` finished for every seed and the
    environment it was measured in, when it was written by this script with
    the same settings as ``results``; ({}, {}) when there is no such file. A report of other settings is refused: going
    on
    from it would mix two measurements in one table."""
    if not path.exists():
        return {}, {}
    try:
        old = json.loads(path.read_text())
        differ = [key for key in SAME_SETTINGS if old.get(key) != json.loads(json.dumps(results[key], default=str))]
        runs, environment = old["runs"], old["environment"]
    except (ValueError, KeyError, TypeError) as exc:
        raise SystemExit(
            f"--keep-finished: {path} is not a report of this script ({exc!r}); move it away or drop --keep-finished"
        )
    if differ:
        raise SystemExit(
            f"--keep-finished: {path} was measured with other settings ({', '.join(differ)}); move it away or drop "
            "--keep-finished"
        )
    return {mode: reports for mode, reports in runs.items() if len(reports) == len(results["seeds"])}, environment


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--env", default="Pendulum-v1", help="task name or gymnasium id (genesis-fp16 evolve --list-tasks)"
    )
    parser.add_argument(
        "--target", type=float, default=None, help="default: the task's, else the env spec's reward_threshold"
    )
    parser.add_argument("--policy", default=None, help="linear or mlp:H; default: the task's")
    parser.add_argument("--episode-steps", type=int, default=None, help="default: the task's, else the env spec's")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--budget", type=int, default=200)
    parser.add_argument("--cma-long-budget", type=int, default=2000, help="budget of the long CMA-ES run (0: skip)")
    parser.add_argument(
        "--methods",
        "--modes",
        dest="modes",
        nargs="+",
        default=["full", "no_world_model", "cma", "cma_long"],
        choices=[*METHODS, *ALIASES],
        metavar="METHOD",
        help=f"what to run, in this order: {', '.join(METHODS)} (aliases: "
        f"{', '.join(f'{a}={m}' for a, m in ALIASES.items())})",
    )
    parser.add_argument(
        "--ensemble",
        type=int,
        default=None,
        help="the loop's world-model ensemble size (where EvolveConfig has `ensemble`)",
    )
    parser.add_argument(
        "--budget-steps",
        type=int,
        default=None,
        help="a real env-step budget beside --budget: every baseline's, and the loop's where EvolveConfig has "
        "`budget_steps`",
    )
    parser.add_argument("--cma-sigma", type=float, default=0.5, help="initial step size of the tuned CMA-ES")
    parser.add_argument(
        "--cma-popsize", type=int, default=None, help="population of the tuned CMA-ES (default: pycma's, 4 + 3 ln n)"
    )
    parser.add_argument(
        "--check-every",
        type=int,
        default=None,
        help="real episodes between a baseline's off-budget target checks (default: every generation / iteration; "
        "SAC: 5 episodes)",
    )
    parser.add_argument(
        "--stop-at-target",
        action="store_true",
        help="baselines stop at their first check that meets the target, as the loop does",
    )
    parser.add_argument(
        "--sac-steps",
        type=int,
        default=None,
        help="SAC's env steps (default: the loop's env steps of the same seed when `full` ran before, else "
        "--budget-steps, "
        "else --budget full-length episodes)",
    )
    parser.add_argument(
        "--sac-max-steps",
        type=int,
        default=100_000,
        help="cap on SAC's env steps (its gradient steps take hours on a CPU beyond this); a capped run says so in "
        "the table (0: no cap)",
    )
    parser.add_argument("--precision-steps", type=int, default=800)
    parser.add_argument("--precision-episodes", type=int, default=12)
    parser.add_argument(
        "--wm-precision",
        choices=["auto", "fp32", "fp16", "bf16"],
        default=None,
        help="world-model precision of the loop runs (default: settings and profile, i.e. auto)",
    )
    parser.add_argument(
        "--learn-termination",
        action="store_true",
        help="drop the task's termination function, so the world model learns termination with its done head",
    )
    parser.add_argument("--out", type=Path, default=None, help="write all reports as JSON here")
    parser.add_argument(
        "--keep-finished",
        action="store_true",
        help="when --out already holds this script's reports for the same settings (a run cut short), keep its "
        "finished modes and run the rest",
    )
    parser.add_argument(
        "--summarize",
        type=Path,
        nargs="+",
        default=None,
        help="print one summary row per JSON this script wrote; run nothing",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="with --summarize: merge the JSONs of one task and target (several seed groups and methods, plain "
        "`evolve --json` reports too) into one table, and print a per-seed table of every method",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        default=None,
        help="draw per method the return curves of every seed and the target as PNG: of the one JSON given to "
        "--summarize, "
        "else of the run measured now",
    )
    args = parser.parse_args(argv)
    read = args.summarize
    if args.plot is not None:
        if read and len(read) != 1:
            parser.error(f"--plot draws one report; got {len(read)} JSON files ({', '.join(map(str, read))}); give one")
        try:  # before any run: a missing extra must not cost a measurement
            require("matplotlib", "evolution_table.py --plot")
        except MissingExtraError as exc:
            parser.error(str(exc))
    if args.merge and not read:
        parser.error("--merge goes with --summarize (the JSONs to merge)")
    if read:
        tables = [as_table(json.loads(path.read_text()), path) for path in read]
        for path, t in zip(read, tables):
            print(f"{path}: {host_line(t.get('environment'))}")
        print()
        if args.merge:
            tables = merge_tables(tables, read)
            for t in tables:
                print(seed_table(t) + "\n")
        print(summary(tables))
        if any(m in t["runs"] for t in tables for m in BASELINES):
            print("\n" + baseline_summary(tables))
        if args.plot is not None:
            write_png(table_figure(tables[0]), args.plot, "evolution_table.py --plot")
            print(f"plot written to {args.plot}", file=sys.stderr)
        return 0
    modes = list(dict.fromkeys(ALIASES.get(m, m) for m in args.modes))
    fields = evolve_fields()
    if "loop_e1" in modes and "ensemble" not in fields:
        parser.error(
            "--methods loop_e1: EvolveConfig has no `ensemble` field in this checkout (the ensemble world model is "
            "not merged)"
        )
    notes = []
    if args.ensemble is not None and "ensemble" not in fields:
        notes.append(f"--ensemble {args.ensemble} not passed: EvolveConfig has no `ensemble` field in this checkout")
    if (
        args.budget_steps is not None
        and "budget_steps" not in fields
        and {"full", "loop_e1", "no_world_model"} & set(modes)
    ):
        notes.append(
            f"--budget-steps {args.budget_steps} not passed to the loop: EvolveConfig has no `budget_steps` field "
            "(episodes only)"
        )
    for option in ("budget_steps", "cma_popsize", "check_every", "sac_steps", "ensemble"):
        value = getattr(args, option)
        if value is not None and value < 1:
            parser.error(f"--{option.replace('_', '-')} {value}: expected at least 1")
    if args.sac_max_steps < 0:
        parser.error(f"--sac-max-steps {args.sac_max_steps}: expected at least 1, or 0 (no cap)")
    if "sac" in modes:
        try:  # before any run: a missing extra must not cost a measurement
            require("stable_baselines3", "evolution_table.py --methods sac")
        except MissingExtraError as exc:
            parser.error(str(exc))
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    options = Options(
        ensemble=args.ensemble,
        budget_steps=args.budget_steps,
        cma_sigma=args.cma_sigma,
        cma_popsize=args.cma_popsize,
        check_every=args.check_every,
        stop_at_target=args.stop_at_target,
        sac_steps=args.sac_steps,
        sac_max_steps=args.sac_max_steps or None,
    )
    torch.set_num_threads(1)

    task = {"env_id": args.env, "target": args.target, "policy": args.policy, "episode_steps": args.episode_steps}
    custom = None
    if args.learn_termination:
        custom = dataclasses.replace(get_task(args.env), termination=None)
        if not custom.terminates:
            parser.error(
                f"--learn-termination: {args.env} never terminates (time limit only); there is nothing to learn"
            )
    config, resolved = EvolveConfig(**task).resolve(custom)  # a bad task fails here, before any run
    starts = resolved.start_states(0)
    results: dict[str, Any] = {
        "env": config.env_id,
        "target": config.target,
        "policy": config.policy,
        "episode_steps": config.episode_steps,
        "n_train": len(starts.train),
        "n_heldout": len(starts.heldout),
        "seeds": args.seeds,
        "budget": args.budget,
        "cma_long_budget": args.cma_long_budget,
        "wm_precision": args.wm_precision,
        "termination": "learned (done head)"
        if resolved.learns_termination
        else ("task function" if resolved.task.termination else "never"),
        "options": options._asdict(),
        "notes": notes,
        "environment": {**host(), "cpu": cpu_model()},
        "runs": {},
    }
    if args.keep_finished:
        if args.out is None:
            parser.error("--keep-finished needs --out (the report to go on from)")
        kept, measured_in = finished_modes(args.out, results)
        if kept:
            results["runs"].update(kept)
            results["kept"] = {"modes": sorted(kept), "from": measured_in}
            print(f"keeping {', '.join(sorted(kept))} from {args.out}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="evolution_table_") as tmp:
        state = Path(tmp)
        for mode in modes:
            if (mode == "cma_long" and not args.cma_long_budget) or mode in results["runs"]:
                continue
            budget = args.cma_long_budget if mode == "cma_long" else args.budget
            loop_steps = {r["seed"]: r["env_steps"] for r in results["runs"].get("full", [])}
            reports = []
            for seed in args.seeds:
                t0 = time.perf_counter()
                opts = options
                if mode == "sac" and args.sac_steps is None and seed in loop_steps:
                    opts = options._replace(sac_steps=int(loop_steps[seed]))
                report = run_mode(mode, seed, budget, state / mode, args.wm_precision, task, custom, opts)
                report["mode"] = mode
                reports.append(report)
                print(
                    f"{mode:15s} seed {seed}: reached={report['target_reached']} "
                    f"episodes_to_target={report['episodes_to_target']} "
                    f"env_steps={report['env_steps']} train={report['train_return']} "
                    f"heldout={report['heldout_return']} wall={time.perf_counter() - t0:.1f}s "
                    f"cpu={report.get('cpu_s', float('nan')):.1f}s",
                    file=sys.stderr,
                    flush=True,
                )
            results["runs"][mode] = reports
            if args.out:  # what is measured so far survives a run cut short
                atomic_write_text(args.out, json.dumps({**results, "partial": True}, indent=2, default=str) + "\n")
        if args.precision_steps:
            results["precision"] = precision_table(
                resolved, args.seeds, args.precision_steps, args.precision_episodes, state / "precision"
            )
    text = markdown(results)
    print(text)
    if args.out:
        results["markdown"] = text
        atomic_write_text(args.out, json.dumps(results, indent=2, default=str) + "\n")
    if args.plot is not None:
        write_png(table_figure(results), args.plot, "evolution_table.py --plot")
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

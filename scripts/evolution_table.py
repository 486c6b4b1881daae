"""Measure the table in docs/EVOLUTION.md.

    .venv/bin/python scripts/evolution_table.py --cma-long-budget 2000 --out docs/evolution/pendulum.json
    .venv/bin/python scripts/evolution_table.py --env InvertedPendulum-v5 --out ip.json
    .venv/bin/python scripts/evolution_table.py --summarize docs/evolution/*.json
    .venv/bin/python scripts/evolution_table.py --summarize docs/evolution/pendulum.json --plot pendulum.png

Any task ``genesis-fp16 evolve --env`` takes (``--target``, ``--policy`` and
``--episode-steps`` as there).

For each seed: the full loop, the loop without the world model, plain CMA-ES
under the same budget, and plain CMA-ES with a long budget (how many real
episodes it needs, for the ratio). Then world-model validation loss in FP32,
BF16 and FP16 on the same data and seed. Prints markdown tables and writes
every run's report as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from agents.plots import table_figure, write_png
from agents.se_darwin_agent import EvolveConfig, SEDarwinAgent, run_cma_baseline
from agents.tasks import ResolvedTask, Task, get_task, run_episodes
from genesis_fp16.checkpoint import atomic_write_text
from genesis_fp16.extras import MissingExtraError, require
from genesis_fp16.settings import load_settings
from infrastructure.replay_buffer import trajectories_from_episodes
from infrastructure.world_model import WorldModel


def cpu_model() -> str:
    from genesis_fp16.precision import cpu_flags

    name = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = [f for f in ("avx512_bf16", "amx_bf16") if f in cpu_flags()] + (["no AMX"] if "amx_bf16" not in cpu_flags() else [])
    return f"{name} [{', '.join(flags)}]" if flags else name


def run_mode(
    mode: str, seed: int, budget: int, state_dir: Path, wm_precision: Optional[str], task: dict[str, Any], custom: Optional[Task] = None
) -> dict[str, Any]:
    settings = load_settings(state_dir=state_dir)
    config = EvolveConfig(seed=seed, budget=budget, use_world_model=mode != "no_world_model", precision=wm_precision, **task)
    if mode.startswith("cma"):
        return asyncio.run(run_cma_baseline(config, task=custom))
    return asyncio.run(SEDarwinAgent(config, task=custom, settings=settings).evolve())


def precision_table(task: ResolvedTask, seeds: list[int], steps: int, episodes: int, state_dir: Path) -> list[dict[str, Any]]:
    """World-model validation loss per precision on identical data and seed."""
    settings = load_settings(state_dir=state_dir)
    rows = []
    for seed in seeds:
        starts = task.start_states(seed)
        rng = np.random.default_rng(seed)
        trajs = []
        for k, params in enumerate(task.policy.random_params(rng, episodes, 1.0)):
            res = run_episodes(task.episode_spec, params, [starts.train[k % len(starts.train)]])
            for t in trajectories_from_episodes(res["episodes"], f"random{k}"):
                t.id = k + 1
                trajs.append(t)
        row: dict[str, Any] = {"seed": seed, "transitions": sum(len(t.obs) for t in trajs), "steps": steps}
        for precision in ("fp32", "bf16", "fp16"):
            wm = WorldModel(
                task.policy.obs_dim, task.policy.act_dim, done_head=task.learns_termination, precision=precision, seed=seed, settings=settings
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
        f"{results['env']}, median over seeds {results['seeds']} (budget {budget} real episodes; target: mean return >= "
        f"{results['target']:g} on {results['n_train']} training start states; held-out: "
        f"{results['n_heldout']} start states never used by the search)."
        + (" Termination learned by the world model's done head (--learn-termination)." if results.get("termination") == "learned (done head)" else ""),
        "",
        "| method | world-model precision | reached target | median real episodes to target | median real env steps | "
        "median held-out return | median best train return | median wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    names = {
        "full": "SE-Darwin loop with world model",
        "no_world_model": "same loop, world model off",
        "cma": "plain CMA-ES (same budget)",
        "cma_long": f"plain CMA-ES (budget {results['cma_long_budget']})",
    }
    for mode, reports in results["runs"].items():
        reached = [r for r in reports if r["target_reached"]]
        to_target = [r["episodes_to_target"] if r["target_reached"] else None for r in reports]
        med = _median([float(v) for v in to_target if v is not None]) if len(reached) * 2 > len(reports) else None
        med_text = f"{med:.0f}" if med is not None else f"not reached (> {reports[0]['budget']})"
        ho, tr = _median([r["heldout_return"] for r in reports]), _median([r["train_return"] for r in reports])
        steps = _median([float(r["env_steps"]) for r in reports if "env_steps" in r])
        precisions = sorted({str(r.get("precision")) for r in reports}) if mode == "full" else ["-"]
        lines.append(
            f"| {names.get(mode, mode)} | {'/'.join(precisions)} | {len(reached)}/{len(reports)} | {med_text} | "
            f"{'-' if steps is None else f'{steps:.0f}'} | {'-' if ho is None else f'{ho:.1f}'} | {'-' if tr is None else f'{tr:.1f}'} | {_median([r['wall_s'] for r in reports]):.1f} |"
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
            f"World-model validation loss (normalised MSE) on identical data and seed, {results['precision'][0]['steps']} steps:",
            "",
            "| seed | transitions | FP32 | BF16 | FP16 (CPU scaler) | BF16 vs FP32 | FP16 vs FP32 |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in results["precision"]:
            gb = (row["bf16"] - row["fp32"]) / row["fp32"]
            gf = (row["fp16"] - row["fp32"]) / row["fp32"]
            lines.append(
                f"| {row['seed']} | {row['transitions']} | {row['fp32']:.5f} | {row['bf16']:.5f} | {row['fp16']:.5f} | {gb:+.2%} | {gf:+.2%} |"
            )
    env = results["environment"]
    lines += ["", f"Measured {env['date']} on {env['cpu']} ({env['cores']} cores, shared), torch {env['torch']}, python {env['python']}."]
    if results.get("kept"):
        kept = results["kept"]
        lines[-1] += f" Modes {', '.join(kept['modes'])} kept from the run of {kept['from']['date']} (--keep-finished)."
    return "\n".join(lines)


def summary(tables: list[dict[str, Any]]) -> str:
    """One row per measured table (task and target): the loop against its
    ablation and plain CMA-ES, episodes and env steps to the target."""
    lines = [
        "| task (target) | seeds | loop: reached | loop: median episodes to target | loop: median env steps to target | "
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
            f"{t['env']} ({t['target']:g})", str(len(t["seeds"])), loop,
            "-" if loop_eps is None else f"{loop_eps:.0f}", "-" if loop_steps is None else f"{loop_steps:.0f}",
            "-" if heldout is None else f"{heldout:.1f}", reached("no_world_model")[0], reached("cma")[0], cma_long,
            "-" if cma_eps is None else f"{cma_eps:.0f}", ratio,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def imagination(tables: list[dict[str, Any]]) -> str:
    """One row per table: how the world model's imagined returns of the
    candidates the loop chose for a real evaluation compare with the real
    returns they got (a probe's one episode or a full evaluation's mean),
    pooled over seeds and generations. A rank correlation near 0 says the
    model's ranking carried no information about the real one."""
    lines = [
        "| task (target) | candidates evaluated after ranking | median imagined return | median real return | "
        "rank correlation (Spearman) |",
        "|---|---|---|---|---|",
    ]
    for t in tables:
        pairs = [
            (e["imagined"], e["real_return"])
            for r in t["runs"].get("full", [])
            for g in r.get("generations", [])
            for e in g["evaluated"]
            if e.get("imagined") is not None and e.get("real_return") is not None
        ]
        cells = [f"{t['env']} ({t['target']:g})", str(len(pairs))]
        if len(pairs) < 3:
            cells += ["-", "-", "-"]
        else:
            imagined, real = np.array(pairs).T
            ranks = [np.argsort(np.argsort(a, kind="stable"), kind="stable") for a in (imagined, real)]
            rho = float(np.corrcoef(*ranks)[0, 1])
            cells += [f"{np.median(imagined):.1f}", f"{np.median(real):.1f}", f"{rho:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


SAME_SETTINGS = ("env", "target", "policy", "episode_steps", "n_train", "n_heldout", "seeds", "budget", "cma_long_budget", "wm_precision", "termination")


def finished_modes(path: Path, results: dict[str, Any]) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    """The modes a report at ``path`` finished for every seed and the
    environment it was measured in, when it was written by this script with
    the same settings as ``results``; ({}, {}) when there is no such file. A report of other settings is refused: going on
    from it would mix two measurements in one table."""
    if not path.exists():
        return {}, {}
    try:
        old = json.loads(path.read_text())
        differ = [key for key in SAME_SETTINGS if old.get(key) != json.loads(json.dumps(results[key], default=str))]
        runs, environment = old["runs"], old["environment"]
    except (ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"--keep-finished: {path} is not a report of this script ({exc!r}); move it away or drop --keep-finished")
    if differ:
        raise SystemExit(f"--keep-finished: {path} was measured with other settings ({', '.join(differ)}); move it away or drop --keep-finished")
    return {mode: reports for mode, reports in runs.items() if len(reports) == len(results["seeds"])}, environment


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="Pendulum-v1", help="task name or gymnasium id (genesis-fp16 evolve --list-tasks)")
    parser.add_argument("--target", type=float, default=None, help="default: the task's, else the env spec's reward_threshold")
    parser.add_argument("--policy", default=None, help="linear or mlp:H; default: the task's")
    parser.add_argument("--episode-steps", type=int, default=None, help="default: the task's, else the env spec's")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--budget", type=int, default=200)
    parser.add_argument("--cma-long-budget", type=int, default=2000, help="budget of the long CMA-ES run (0: skip)")
    parser.add_argument("--modes", nargs="+", default=["full", "no_world_model", "cma", "cma_long"])
    parser.add_argument("--precision-steps", type=int, default=800)
    parser.add_argument("--precision-episodes", type=int, default=12)
    parser.add_argument(
        "--wm-precision",
        choices=["auto", "fp32", "fp16", "bf16"],
        default=None,
        help="world-model precision of the loop runs (default: settings and profile, i.e. auto)",
    )
    parser.add_argument(
        "--learn-termination", action="store_true",
        help="drop the task's termination function, so the world model learns termination with its done head",
    )
    parser.add_argument("--out", type=Path, default=None, help="write all reports as JSON here")
    parser.add_argument(
        "--keep-finished", action="store_true",
        help="when --out already holds this script's reports for the same settings (a run cut short), keep its finished modes and run the rest",
    )
    parser.add_argument("--summarize", type=Path, nargs="+", default=None, help="print one summary row per JSON this script wrote; run nothing")
    parser.add_argument(
        "--imagination", type=Path, nargs="+", default=None,
        help="print, per JSON this script wrote, how the loop's imagined returns ranked against the real ones; run nothing",
    )
    parser.add_argument(
        "--plot", type=Path, default=None,
        help="draw per method the return curves of every seed and the target as PNG: of the one JSON given to --summarize or "
        "--imagination, else of the run measured now",
    )
    args = parser.parse_args(argv)
    read = args.summarize or args.imagination
    if args.plot is not None:
        if read and len(read) != 1:
            parser.error(f"--plot draws one report; got {len(read)} JSON files ({', '.join(map(str, read))}); give one")
        try:  # before any run: a missing extra must not cost a measurement
            require("matplotlib", "evolution_table.py --plot")
        except MissingExtraError as exc:
            parser.error(str(exc))
    if read:
        tables = [json.loads(path.read_text()) for path in read]
        print(summary(tables) if args.summarize else imagination(tables))
        if args.plot is not None:
            write_png(table_figure(tables[0]), args.plot, "evolution_table.py --plot")
            print(f"plot written to {args.plot}", file=sys.stderr)
        return 0
    torch.set_num_threads(1)
    import os

    task = {"env_id": args.env, "target": args.target, "policy": args.policy, "episode_steps": args.episode_steps}
    custom = None
    if args.learn_termination:
        custom = dataclasses.replace(get_task(args.env), termination=None)
        if not custom.terminates:
            parser.error(f"--learn-termination: {args.env} never terminates (time limit only); there is nothing to learn")
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
        "termination": "learned (done head)" if resolved.learns_termination else ("task function" if resolved.task.termination else "never"),
        "environment": {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
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
        for mode in args.modes:
            if (mode == "cma_long" and not args.cma_long_budget) or mode in results["runs"]:
                continue
            budget = args.cma_long_budget if mode == "cma_long" else args.budget
            reports = []
            for seed in args.seeds:
                t0 = time.perf_counter()
                report = run_mode(mode, seed, budget, state / mode, args.wm_precision, task, custom)
                report["mode"] = mode
                reports.append(report)
                print(
                    f"{mode:15s} seed {seed}: reached={report['target_reached']} episodes_to_target={report['episodes_to_target']} "
                    f"env_steps={report['env_steps']} train={report['train_return']} heldout={report['heldout_return']} wall={time.perf_counter() - t0:.1f}s",
                    file=sys.stderr,
                    flush=True,
                )
            results["runs"][mode] = reports
            if args.out:  # what is measured so far survives a run cut short
                atomic_write_text(args.out, json.dumps({**results, "partial": True}, indent=2, default=str) + "\n")
        if args.precision_steps:
            results["precision"] = precision_table(resolved, args.seeds, args.precision_steps, args.precision_episodes, state / "precision")
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

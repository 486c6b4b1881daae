"""``genesis-fp16 bench``: the precision benchmark from the command line."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any, Optional

import typer


def canonical_command(prog: str, options: Any, **paths: Optional[Path]) -> str:
    """The command that reproduces this run, with every default spelled out
    (sys.argv is not used: under a test runner it names the runner)."""
    parts = [
        "--sizes", ",".join(s.name for s in options.sizes),
        "--precisions", ",".join(options.precisions),
        "--repeats", str(options.repeats),
        "--seed", str(options.seed),
        "--chunk-s", f"{options.chunk_s:g}",
    ]  # fmt: skip
    if options.quick:
        parts.append("--quick")
    if options.compile:
        parts.append("--compile")
    if options.modes is not None:
        parts += ["--modes", ",".join(options.modes)]
    if options.device:
        parts += ["--device", options.device]
    if options.threads:
        parts += ["--threads", str(options.threads)]
    if options.clock != "wall":
        parts += ["--clock", options.clock]
    for flag, path in paths.items():
        if path:
            parts += [f"--{flag}", str(path)]
    return " ".join([prog] + [shlex.quote(p) for p in parts])


SMOKE_NOTE = "--quick is a smoke run: its checks are shown, not judged (no verdict); run without --quick for pass/FAIL"


def check_lines(result: dict[str, Any]) -> list[tuple[str, str]]:
    """The acceptance checks as (mark, text) lines. A ``--quick`` run is a
    smoke run (size S, few steps, short chunks): too small to judge, so its
    checks are marked ``smoke`` under a note saying so, never pass/FAIL."""
    quick = bool(result["header"].get("quick"))
    lines = [("smoke", f": {SMOKE_NOTE}")] if quick and result["summary"]["checks"] else []
    for check in result["summary"]["checks"]:
        mark = "smoke" if quick else ("pass" if check["passed"] else "FAIL")
        lines.append((mark, f" {check['check']}: {check['value']:.4g} (goal {check['goal']})"))
    return lines


def failed_checks(result: dict[str, Any]) -> list[str]:
    """The names of the acceptance checks a full run failed; none for a
    ``--quick`` run, which is a smoke run with no verdict."""
    if result["header"].get("quick"):
        return []
    return [check["check"] for check in result["summary"]["checks"] if not check["passed"]]


def run_and_write(
    options: Any,
    json_path: Optional[Path] = None,
    csv_path: Optional[Path] = None,
    plot_path: Optional[Path] = None,
    markdown_path: Optional[Path] = None,
) -> dict[str, Any]:
    """Run the benchmark with a progress display, write the requested files,
    print the table and the acceptance checks. Shared by the CLI and
    scripts/benchmark_fp16_training.py."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.text import Text

    from genesis_fp16.cli import console, out, safe_text
    from genesis_fp16_tools.bench.report import markdown_table, require_matplotlib, write_csv, write_json, write_plot
    from genesis_fp16_tools.bench.runner import run_benchmark

    if plot_path:  # before the run, not after minutes of measuring
        require_matplotlib()
    with Progress(
        TextColumn("[bold]bench[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}", markup=False),
        console=console,
        transient=False,
    ) as progress:
        task = progress.add_task("starting", total=None)

        def update(text: str, done: int, total: int) -> None:
            progress.update(task, description=text, completed=done, total=total)

        result = run_benchmark(options, update)
    written = []
    if json_path:
        written.append(write_json(json_path, result))
    if csv_path:
        written.append(write_csv(csv_path, result))
    if plot_path and result["rows"]:
        written.append(write_plot(plot_path, result))
    table = markdown_table(result)
    if markdown_path:
        from genesis_fp16.base.storage import atomic_write_text

        h = result["header"]
        stamp = (
            f"Device: {h['device_name']} ({h['device']}), torch {h['torch_version']}, {h['date']}\nCommand: "
            f"`{h['command']}`\n\n"
        )
        written.append(atomic_write_text(markdown_path, stamp + table))
    sys.stdout.write(table)
    sys.stdout.flush()
    load = result["header"]["load_avg_start"][0], result["header"]["load_avg_end"][0]
    cores = result["header"]["cpu_count"] or 1
    if max(load) > 0.5 * cores:
        console.print(
            f"[yellow]warning:[/] load average {load[0]:.1f} at start, {load[1]:.1f} at end on {cores} cores: "
            "other processes shared the machine, so timings are noisy (ratios are taken side by side, but re-run when "
            "quiet)"
        )
    colours = {"pass": "green", "FAIL": "red", "smoke": "yellow"}
    for mark, text in check_lines(result):
        out.print(Text.assemble(Text(mark, colours.get(mark, "")), safe_text(text)))
    for path in written:
        console.print(safe_text(f"wrote {path}"))
    return result


def register(app: typer.Typer) -> None:
    @app.command("bench")
    def bench(
        sizes: Optional[str] = typer.Option(
            None,
            "--sizes",
            help="Comma list of S,M,L,XL,LSTM (default S,M,L,LSTM on a CPU, with XL on CUDA; S with --quick).",
        ),
        precisions: Optional[str] = typer.Option(
            None,
            "--precisions",
            help="Comma list of precisions with FP32 master weights (default all; a wrong name lists them).",
        ),
        compile_: bool = typer.Option(
            False, "--compile", help="torch.compile the model (a failure is logged; the cell runs eager)."
        ),
        modes: Optional[str] = typer.Option(
            None,
            "--modes",
            help="How the trainer runs its training window's steps: eager, captured (one CUDA graph a step; CUDA "
            "only). Default: both on CUDA, eager elsewhere.",
        ),
        repeats: Optional[int] = typer.Option(
            None, "--repeats", help="Timed raw/ours pairs per cell (default 11; 3 with --quick)."
        ),
        quick: bool = typer.Option(
            False,
            "--quick",
            help="CI smoke run, under a minute: checks shown, not judged (exit 0). A full run exits 1 if a check "
            "fails.",
        ),
        device: Optional[str] = typer.Option(None, "--device", help="cpu or cuda[:N] (default: cuda if available)."),
        seed: int = typer.Option(0, "--seed", help="Seed for data and initial weights."),
        threads: Optional[int] = typer.Option(
            None,
            "--threads",
            help="torch intra-op threads (default: torch's, one per core; 1 with --quick on a CPU).",
        ),
        clock: Optional[str] = typer.Option(
            None,
            "--clock",
            help="wall, or cpu: the thread's CPU time, robust to other load (needs --threads 1). Default: wall; "
            "cpu with --quick on a CPU, so a smoke run on a busy machine still gives its ratios.",
        ),
        chunk_s: Optional[float] = typer.Option(
            None, "--chunk-s", help="Seconds per timed chunk (default 0.25; 0.05 with --quick)."
        ),
        json_path: Optional[Path] = typer.Option(None, "--json", help="Write header + rows as JSON here."),
        csv_path: Optional[Path] = typer.Option(None, "--csv", help="Write device-stamped rows as CSV here."),
        plot_path: Optional[Path] = typer.Option(
            None,
            "--plot",
            help="Write a PNG plot here: per size, and speed-up vs fp32 against FLOPs per step (needs the plots "
            "extra: pip install -e '.\\[plots]').",
        ),
        markdown_path: Optional[Path] = typer.Option(None, "--markdown", help="Write the Markdown table here."),
    ) -> None:
        """Throughput, distance from the arithmetic limit, peak memory, validation loss and trainer overhead per size
        and precision, stamped with the device.
        A full run exits 1 when an acceptance check fails (after writing every result); --quick never judges."""
        from genesis_fp16.cli import fail, load_settings_or_exit
        from genesis_fp16.base.storage import StorageError, check_output_path
        from genesis_fp16_tools.bench.models import SIZES, SLOW_ON_CPU, default_sizes, parse_sizes
        from genesis_fp16_tools.bench.options import PRECISIONS, BenchOptions, check_clock, pick_device

        load_settings_or_exit()  # a bad GENESIS_FP16_* variable fails here, clearly
        try:  # before measuring: a bad output path must not lose the run
            for flag, path in (
                ("--json", json_path),
                ("--csv", csv_path),
                ("--plot", plot_path),
                ("--markdown", markdown_path),
            ):
                if path is not None:
                    check_output_path(path, flag)
        except StorageError as exc:
            raise fail(str(exc))
        try:
            picked = pick_device(device)
            if quick and picked.type == "cpu":  # a smoke run on a busy machine: one thread, timed by its own CPU clock
                threads = 1 if threads is None else threads
                clock = clock or ("cpu" if threads == 1 else "wall")
            options = BenchOptions(
                sizes=parse_sizes(sizes) if sizes else ([SIZES["S"]] if quick else default_sizes(picked.type)),
                precisions=precisions or ",".join(PRECISIONS),  # type: ignore[arg-type]
                repeats=repeats if repeats is not None else (3 if quick else 11),
                quick=quick,
                compile=compile_,
                modes=modes,  # type: ignore[arg-type]
                device=device,
                seed=seed,
                threads=threads,
                clock=clock or "wall",
                chunk_s=chunk_s if chunk_s is not None else (0.05 if quick else 0.25),
            )
            options.command = canonical_command(
                "genesis-fp16 bench", options, json=json_path, csv=csv_path, plot=plot_path, markdown=markdown_path
            )
            check_clock(options.clock, picked)
        except (ValueError, RuntimeError) as exc:
            raise fail(str(exc))
        slow = [s.name for s in options.sizes if s.name in SLOW_ON_CPU]
        if slow and picked.type == "cpu":
            from genesis_fp16.cli import console

            console.print(
                f"[yellow]warning:[/] size {', '.join(slow)} is compute-bound: seconds per training step on a CPU, "
                "so minutes per precision (it is a default on CUDA only)"
            )
        result = run_and_write(options, json_path, csv_path, plot_path, markdown_path)
        if not result["rows"]:
            raise fail(
                "no cell could be measured: "
                + "; ".join(f"{f['size']}/{f['precision']}: {f['reason']}" for f in result["failed"]),
                code=1,
            )
        failed = failed_checks(result)
        if failed:  # after the table, the checks and the files: nothing measured is lost
            checks = result["summary"]["checks"]
            raise fail(
                f"{len(failed)} of {len(checks)} acceptance checks failed: {', '.join(failed)} "
                "(see FAIL above; --quick is a smoke run with no verdict)",
                code=1,
            )

"""Kill `genesis-fp16 evolve` during a generation, resume it, and compare the
report with the uninterrupted run's: a resumed run must be the same run.

    python scripts/resume_drill.py --seed 0 --budget 48 --generations 1 2 3 --signals kill int --load 2

One uninterrupted run, then for each (generation, signal, delay): a fresh
state dir, `evolve` started with the same flags, the signal sent ``delay``
seconds after generation ``g - 1`` was committed (so inside generation ``g``:
its episodes, the world model's, the critic's or the actor's training), then
the `--resume` command the interrupt prints. ``--load N`` keeps N busy
processes running throughout (both cores busy on a 2-core machine).
The uninterrupted run and each interrupted run's first session share one
precision cache (a host's cache: the same decisions, as `auto` promises
however loaded the machine); ``--fresh-cache`` gives each resumed session an
empty one, so a resume that decided its precision again would measure it
anew, under load, instead of taking the run's own decisions.
Prints one line per case and exits 1 when any report differs (fields that
are wall times, paths and run ids are left out of the comparison).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from determinism_check import VOLATILE, burn, diff, strip  # noqa: E402  (one report comparison for both drills)

SIGNALS = {"kill": signal.SIGKILL, "int": signal.SIGINT, "term": signal.SIGTERM}
RESUME_ONLY = {"resumed", "resumed_from"}
"""What a resumed report says of itself beside what any two runs differ in (`determinism_check.VOLATILE`)."""


def comparable(report: dict[str, Any]) -> dict[str, Any]:
    """The report without what differs between sessions of one run (times, paths, ids, that it resumed); a
    precision decision by its precision alone (its reason holds the figures measured, or says the cache answered)."""
    return strip(report, VOLATILE | RESUME_ONLY)


def evolve(state: Path, cache: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "GENESIS_FP16_STATE_DIR": str(state), "GENESIS_FP16_PRECISION_CACHE": str(cache)}
    state.mkdir(parents=True, exist_ok=True)
    log = open(
        state / f"evolve-{len(list(state.glob('evolve-*.log')))}.log", "w"
    )  # a pipe would fill and stall the run
    # SIGINT back to its default: a shell's background job starts with it ignored, and Python then never raises
    # KeyboardInterrupt (the Ctrl-C case would run on to the end)
    return subprocess.Popen(
        [sys.executable, "-m", "genesis_fp16.cli", "evolve", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def committed(state: Path) -> int:
    """The last committed generation of the one run under ``state`` (-1: none yet)."""
    for manifest in (state / "runs").glob("*/run.json"):
        try:
            return int(json.loads(manifest.read_text()).get("generation", -1))
        except (OSError, ValueError):
            return -1  # being replaced right now
    return -1


def finish(proc: subprocess.Popen, state: Path, what: str, timeout: float) -> None:
    if proc.wait(timeout=timeout) != 0:
        logs = sorted(state.glob("evolve-*.log"))
        raise SystemExit(f"{what} failed (exit {proc.returncode}): {logs[-1].read_text()[-2000:] if logs else ''}")


def run_case(
    work: Path,
    flags: list[str],
    generation: int,
    sig: str,
    delay: float,
    cache: Path,
    fresh_cache: bool,
    timeout: float,
) -> tuple[Optional[dict[str, Any]], str]:
    """(the resumed report, what happened) for one kill."""
    state = work / f"g{generation}-{sig}-{delay:g}"
    proc = evolve(state, cache, *flags)
    deadline = time.monotonic() + timeout
    while committed(state) < generation - 1 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(delay)
    if proc.poll() is not None:
        return None, f"the run ended (exit {proc.returncode}) before the signal: generation {generation} never started"
    at = committed(state)
    proc.send_signal(SIGNALS[sig])
    proc.wait(timeout=120)
    run_id = next((state / "runs").glob("*/run.json")).parent.name
    resumed = evolve(
        state,
        cache if not fresh_cache else state / "cache-resumed.json",
        "--resume",
        run_id,
        "--json",
        str(state / "report.json"),
    )
    finish(resumed, state, f"--resume after {sig} in generation {generation}", timeout)
    return json.loads((state / "report.json").read_text()), f"signal after generation {at} was committed"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=int, default=48)
    parser.add_argument("--generations", type=int, nargs="+", default=[1, 2, 3], help="kill during these generations")
    parser.add_argument("--signals", nargs="+", choices=sorted(SIGNALS), default=["kill", "int"])
    parser.add_argument("--delays", type=float, nargs="+", default=[1.0], help="seconds into the generation")
    parser.add_argument("--load", type=int, default=0, help="busy processes running throughout")
    parser.add_argument(
        "--fresh-cache", action="store_true", help="each resumed session an empty precision cache of its own"
    )
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--out", type=Path, help="write the cases as JSON here")
    parser.add_argument("--keep", type=Path, help="run in this directory and keep it (state dirs, logs, reports)")
    parser.add_argument("flags", nargs="*", help="more evolve flags (after --)")
    args = parser.parse_args(argv)
    flags = ["--seed", str(args.seed), "--budget", str(args.budget), *args.flags]
    busy = [multiprocessing.Process(target=burn, daemon=True) for _ in range(args.load)]
    for p in busy:
        p.start()
    cases, failed = [], 0
    try:
        with tempfile.TemporaryDirectory(prefix="resume-drill-") as tmp:
            work = Path(tmp) if args.keep is None else args.keep
            work.mkdir(parents=True, exist_ok=True)
            cache = work / "precision.json"
            whole = evolve(work / "whole", cache, *flags, "--json", str(work / "whole.json"))
            finish(whole, work / "whole", "the uninterrupted run", args.timeout)
            expected = json.loads((work / "whole.json").read_text())
            print(
                f"uninterrupted: held-out {expected['heldout_return']}, {expected['real_episodes']} episodes, "
                f"{expected['env_steps']} env steps",
                flush=True,
            )
            for generation in args.generations:
                for sig in args.signals:
                    for delay in args.delays:
                        report, what = run_case(
                            work, flags, generation, sig, delay, cache, args.fresh_cache, args.timeout
                        )
                        found = ["no report"] if report is None else diff(comparable(expected), comparable(report))
                        failed += bool(found)
                        cases.append(
                            {
                                "generation": generation,
                                "signal": sig,
                                "delay": delay,
                                "what": what,
                                "same": not found,
                                "differences": found[:20],
                                "heldout": None if report is None else report["heldout_return"],
                            }
                        )
                        print(
                            f"generation {generation}, {sig}, +{delay:g}s ({what}): "
                            f"{'same report' if not found else 'DIFFERS: ' + '; '.join(found[:3])}",
                            flush=True,
                        )
    finally:
        for p in busy:
            p.terminate()
    if args.out:
        import time

        import torch

        from genesis_fp16.precision.capability import cpu_flags

        commit = (
            subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
            or None
        )
        meta = {
            "torch": torch.__version__,
            "cpu_flags": sorted(f for f in cpu_flags() if f in ("amx_bf16", "avx512_bf16", "avx512f", "avx2")),
            "commit": commit,
            "date": time.strftime("%Y-%m-%d"),
            "fresh_cache": args.fresh_cache,
        }
        args.out.write_text(json.dumps({"flags": flags, "load": args.load, **meta, "cases": cases}, indent=1))
    print(
        f"{len(cases) - failed} of {len(cases)} resumed runs gave the uninterrupted report (load: {args.load} busy "
        "processes)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""What ``precision=auto`` picks for each workload, against each precision's
own speed measured at length: the figures behind docs/PERFORMANCE.md's
"auto by measurement" section.

    python scripts/auto_precision_table.py --json out.json
    python scripts/auto_precision_table.py --workloads S,world_model --repeats 5

Workloads: the bench sizes S, M, L and LSTM (`genesis-fp16 bench`'s models,
first batch and loss), ``world_model`` (the ensemble `genesis-fp16 evolve`
trains by default, 5 members x 128 x 2 layers, Pendulum-v1's dimensions,
a batch of 256 per member, its beta-NLL loss) and ``ppo`` (PPO's CartPole-v1
actor-critic and its clipped loss on a minibatch of 256 of the default config).

Per workload, first each precision ``auto`` may pick at length: a copy of the
model and optimizer per precision, warm-up steps, then rounds of steps
interleaved across precisions, timed by this process's CPU time with one torch
thread (other processes' load does not count), and the loss after the same
steps against FP32's (the canary's rule, as the calibration checks it). Then
``auto``'s own calibration ``--repeats`` times (`genesis_fp16.precision.measure.measure_auto`: no
ledger) and what it picked, how its pick's measured speed compares with the
fastest precision that passes the FP32 check, and what the calibration cost.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
from datetime import datetime, timezone
from typing import Any, Callable

import torch

from genesis_fp16.precision import calibration as cal
from genesis_fp16.precision.measure import measure_auto
from genesis_fp16_tools.bench.models import SIZES, make_task
from genesis_fp16_tools.bench.stamp import INTERESTING_FLAGS
from genesis_fp16.training.config import FP16TrainingConfig
from genesis_fp16.precision.capability import cpu_flags
from genesis_fp16.base.seeds import torch_generator
from genesis_fp16.base.settings import PrecisionMode
from genesis_fp16.training.trainer import FP16Trainer, calibration_copies

Workload = tuple[
    torch.nn.Module,
    Callable[[torch.nn.Module], torch.optim.Optimizer],
    Any,
    Callable[[torch.nn.Module, Any], torch.Tensor],
]
WORKLOADS = ("S", "M", "L", "LSTM", "world_model", "ppo")


def bench_workload(name: str, device: torch.device) -> Workload:
    spec = SIZES[name]
    task = make_task(spec, 0, device)
    return (
        task.make_model(0, device),
        lambda m: torch.optim.Adam(m.parameters(), lr=spec.lr),
        task.train[0],
        task.loss_fn,
    )


def world_model_workload(device: torch.device) -> Workload:
    from infrastructure.ensemble import EnsembleDynamics, ensemble_loss

    gen = torch_generator(0, "auto_precision_table.world_model")  # a private generator: torch's global one untouched
    model = EnsembleDynamics(3, 1, ensemble=5, hidden=128, layers=2, generator=gen).to(device)
    x, y = torch.randn(4096, 4, generator=gen).to(device), torch.randn(4096, 4, generator=gen).to(device)
    model.fit_normaliser(x, y)
    rows = torch.randint(0, 4096, (5, 256), generator=gen).to(device)
    batch = (model.normalise_x(x)[rows], model.normalise_y(y)[rows])
    return model, lambda m: torch.optim.Adam(m.parameters(), lr=1e-3), batch, ensemble_loss


def ppo_workload(device: torch.device) -> Workload:
    from agents.ppo.config import load_config
    from agents.ppo.ppo import PPO

    ppo = PPO(load_config(None, env_id="CartPole-v1", vec_env="sync", device=str(device)))
    try:
        n = ppo.cfg.minibatch_size
        g = torch_generator(0, "auto_precision_table.ppo_batch")
        mb = {
            "obs": torch.randn(n, 4, generator=g),
            "act": torch.randint(0, 2, (n,), generator=g),
            "logp": torch.full((n,), -0.69),
            "adv": torch.randn(n, generator=g),
            "ret": torch.randn(n, generator=g),
            "val": torch.randn(n, generator=g),
        }
        mb = {k: v.to(device) for k, v in mb.items()}
        net = copy.deepcopy(
            ppo.net
        )  # not ppo.net: PPO's loss runs a copy's own forward (as the calibration's copies do)
        return (
            net,
            lambda m: torch.optim.Adam(m.parameters(), lr=ppo.cfg.learning_rate, eps=1e-5),
            mb,
            lambda m, b: ppo._loss(m, b)[0],
        )
    finally:
        ppo.close()


def build(name: str, device: torch.device) -> Workload:
    if name in SIZES:
        return bench_workload(name, device)
    return world_model_workload(device) if name == "world_model" else ppo_workload(device)


def at_length(
    workload: Workload, warmup: int, rounds: int, steps: int, device: torch.device
) -> dict[str, dict[str, Any]]:
    """Seconds per step (median round) and loss ratio vs FP32 of each precision auto may pick, at length,
    on the calibration's clock (`calibration.time_step`: CPU time on a CPU, synchronised wall time on CUDA).
    A precision more than `calibration.PROBE_SLOWER` times slower than FP32 in the first round is timed
    for that round only (it cannot be the fastest; its loss is then read after fewer steps); one whose
    steps raise is reported with the error."""
    model, make_opt, batch, loss_fn = workload
    trainers: dict[str, FP16Trainer] = {}
    failed: dict[str, str] = {}
    for mode in cal.candidates(device):
        m = copy.deepcopy(model)
        trainers[mode.value] = FP16Trainer(
            m, make_opt(m), FP16TrainingConfig(precision=mode.value, device=str(device)), name=f"table-{mode.value}"
        )

    def run(t: FP16Trainer, n: int) -> None:
        for _ in range(n):
            t.backward_and_step(t.training_step(batch, loss_fn))

    times: dict[str, list[float]] = {k: [] for k in trainers}
    for r in range(rounds):
        for k, t in trainers.items():
            if k in failed or (r > 0 and times[k][0] > cal.PROBE_SLOWER * times["fp32"][0]):
                continue
            try:
                if r == 0:
                    run(t, warmup)
                times[k].append(cal.time_step(PrecisionMode(k), lambda t=t: run(t, steps), steps, device))
            except Exception as exc:
                if k == "fp32":
                    raise
                failed[k] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[
                    :200
                ]
    losses = {k: cal.final_loss(t.model, batch, loss_fn) for k, t in trainers.items() if k not in failed}
    out: dict[str, dict[str, Any]] = {
        k: {
            "s_per_step": statistics.median(v),
            "loss_ratio": cal.loss_ratio(losses[k], losses["fp32"]),
            "rounds": len(v),
        }
        for k, v in times.items()
        if k not in failed
    }
    out.update({k: {"error": why} for k, why in failed.items()})
    return out


def render(header: dict[str, Any], rows: list[dict[str, Any]], rounds: int) -> None:
    """The Markdown table (a precision out after the first round shows no loss ratio: it ran fewer steps)."""
    print(
        f"{header['date']}  {header['device_name']}  torch {header['torch']}  CPU flags "
        f"{' '.join(header['cpu_flags'])}  {header['clock']}, "
        f"load average {header['load_avg_start']:.1f} -> {header['load_avg_end']:.1f}"
    )
    print(
        "| workload | speed vs fp32 at length | loss vs fp32 | fastest passing | auto picks | auto's pick vs fastest "
        "(worst) | calibration s (median) |"
    )
    print("|---|---|---|---|---|---:|---:|")
    for r in rows:
        speed = ", ".join(f"{k} {v:.2f}x" for k, v in r["speed_vs_fp32"].items() if k != "fp32")
        speed += "".join(f", {k} cannot run" for k in r["could_not_run"])
        loss = ", ".join(
            f"{k} {v:.3f}" if r["rounds"][k] == rounds else f"{k} - (out after round 1)"
            for k, v in r["loss_ratio"].items()
            if k != "fp32"
        )
        print(
            f"| {r['workload']} | {speed} | {loss} | {r['fastest_passing']} | {', '.join(r['auto_picks'])} | "
            f"{r['auto_vs_fastest_min']:.2f} | {r['calibration_s_median']:.3f} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma list of {','.join(WORKLOADS)}")
    parser.add_argument("--repeats", type=int, default=3, help="auto's calibrations per workload")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds at length")
    parser.add_argument(
        "--seconds", type=float, default=2.0, help="about how long each precision runs at length, in total"
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--json", default=None, help="write the rows here")
    parser.add_argument(
        "--render", default=None, metavar="JSON", help="print the table of an earlier run's --json and exit"
    )
    args = parser.parse_args(argv)
    if args.render:
        saved = json.loads(open(args.render, encoding="utf-8").read())
        render(saved["header"], saved["rows"], saved["header"]["rounds"])
        return 0
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown or not names or args.repeats < 1 or args.rounds < 1 or args.seconds <= 0:
        parser.error(
            f"--workloads: expected some of {', '.join(WORKLOADS)} (got {unknown or names}); --repeats, --rounds >= "
            "1; --seconds > 0"
        )
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: torch sees no CUDA device here")
    torch.set_num_threads(1)
    load_start = os.getloadavg()
    rows = []
    for name in names:
        workload = build(name, device)
        model, make_opt, batch, loss_fn = workload
        probe = FP16Trainer(
            copy.deepcopy(model),
            make_opt(model),
            FP16TrainingConfig(precision="fp32", device=str(device)),
            name="table-probe",
        )
        probe.backward_and_step(probe.training_step(batch, loss_fn))
        per_step = cal.time_step(
            PrecisionMode.FP32, lambda: probe.backward_and_step(probe.training_step(batch, loss_fn)), 1, device
        )
        steps = max(2, int(args.seconds / args.rounds / max(per_step, 1e-5)))
        long = at_length(workload, warmup=2, rounds=args.rounds, steps=steps, device=device)
        fp32 = long["fp32"]["s_per_step"]
        errors = {k: v["error"] for k, v in long.items() if "error" in v}
        long = {k: v for k, v in long.items() if "error" not in v}
        passing = [k for k, v in long.items() if cal.passes(v["loss_ratio"])]
        fastest = min(passing, key=lambda k: long[k]["s_per_step"])
        picks, costs = [], []
        for _ in range(args.repeats):
            m = copy.deepcopy(model)
            copies = calibration_copies(FP16TrainingConfig(precision="auto", device=str(device)), device, "table-auto")
            result = measure_auto(m, make_opt(m), batch, loss_fn, device=device, copy_trainer=copies)
            picks.append(result.precision)
            costs.append(result.cost_s)
        versus = [long[fastest]["s_per_step"] / long[p]["s_per_step"] for p in picks]
        row = {
            "workload": name,
            "steps_per_round": steps,
            "speed_vs_fp32": {k: fp32 / v["s_per_step"] for k, v in long.items()},
            "ms_per_step": {k: 1000 * v["s_per_step"] for k, v in long.items()},
            "loss_ratio": {k: v["loss_ratio"] for k, v in long.items()},
            "rounds": {k: v["rounds"] for k, v in long.items()},
            "could_not_run": errors,
            "fastest_passing": fastest,
            "auto_picks": picks,
            "auto_vs_fastest_min": min(versus),
            "calibration_s_median": statistics.median(costs),
            "calibration_s": costs,
        }
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    header = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "device": str(device),
        "device_name": cal.device_name(device),
        "cpu_flags": sorted(f for f in cpu_flags() if f in INTERESTING_FLAGS),
        "threads": 1,
        "clock": "process CPU time" if device.type == "cpu" else "wall time between CUDA synchronisations",
        "load_avg_start": load_start[0],
        "load_avg_end": os.getloadavg()[0],
        "rounds": args.rounds,
        "command": "python scripts/auto_precision_table.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    render(header, rows, args.rounds)
    if args.json:
        from genesis_fp16.base.storage import atomic_write_text

        atomic_write_text(args.json, json.dumps({"header": header, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

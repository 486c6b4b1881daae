#!/usr/bin/env python
"""Where the FP32 canary's threshold comes from, and what the canary costs.

    .venv/bin/python scripts/canary_threshold.py [--seeds 6] [--json PATH]

1. The FP32-vs-FP32 gap between seeds: the same data, the same validation
   set, FP32 training from another seed's initial weights (and, for the world
   model, another batch order). Over every pair of seeds the ratio of the
   worse validation loss to the better one; ``val_loss_ratio`` (the guard's
   P1 threshold, also the canary's) must sit above its 95th percentile, or
   FP32's own noise would roll agents back. Workloads: the evolve world model
   (``WorldModel``'s training loop: DynamicsMLP, Adam 1e-3, batch 256,
   ``wm_steps`` 800, on Pendulum trajectories) and the bench workloads S, M
   and LSTM (``genesis_fp16_tools.bench.models``, their ``quality_steps``).
2. The canary in practice: ``WorldModel`` in stage on, BF16, a canary on
   every call: the BF16-vs-FP32 ratios it sees (same start, same batches).
3. The canary's cost: the same calls with ``canary_every`` 5 and 0 (off);
   the extra wall time as a fraction of training time (goal: about 1/5 plus
   the evaluation).

Runs on one torch thread (tiny models, a shared machine). Takes about 2-3
minutes on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents import pendulum_task  # noqa: E402
from genesis_fp16.training import registry  # noqa: E402
from genesis_fp16.base import telemetry  # noqa: E402
from genesis_fp16_tools.bench.models import SIZES, make_task, validation_loss  # noqa: E402
from genesis_fp16.rollout.guard import RollbackGuard  # noqa: E402
from genesis_fp16.rollout.profiles import THRESHOLD_DEFAULTS  # noqa: E402
from genesis_fp16.rollout.ledger import RolloutLedger  # noqa: E402
from genesis_fp16.base.seeds import init_parameters, numpy_rng, torch_generator  # noqa: E402
from genesis_fp16.base.settings import load_settings  # noqa: E402
from infrastructure.dynamics import DynamicsMLP, mse_loss, training_data  # noqa: E402
from infrastructure.replay_buffer import trajectories_from_episodes  # noqa: E402
from infrastructure.world_model import WorldModel  # noqa: E402

WM_STEPS = 800  # agents/evolve_config.py: wm_steps
WM_BATCH = 256


def pendulum_trajectories(candidates: int = 8):
    starts = pendulum_task.start_states(0)
    rng = numpy_rng(0, "canary_threshold.random_params")
    out = []
    for k, params in enumerate(pendulum_task.random_params(rng, candidates, 1.0)):
        res = pendulum_task.run_episodes(params, [starts.train[k % len(starts.train)]])
        for t in trajectories_from_episodes(res["episodes"], f"c{k}"):
            t.id = k + 1
            out.append(t)
    return out


def wm_fp32_val_loss(data, seed: int) -> float:
    """WorldModel's FP32 training loop, seeded ``seed``, on fixed data; its validation loss."""
    x_tr, y_tr, x_val, y_val = data
    model = init_parameters(
        DynamicsMLP(pendulum_task.OBS_DIM, pendulum_task.ACT_DIM, 64),  # WorldModel's default hidden
        torch_generator(seed, "canary_threshold.init"),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    trainer = registry.create_trainer("fp32", model, optimizer, name=f"threshold.seed{seed}")
    model.fit_normaliser(x_tr, y_tr)
    xn, yn = model.normalise_x(x_tr), model.normalise_y(y_tr)
    gen = torch_generator(seed, "canary_threshold.batches")
    for _ in range(WM_STEPS):
        idx = torch.randint(len(xn), (min(WM_BATCH, len(xn)),), generator=gen)
        trainer.backward_and_step(trainer.training_step((xn[idx], yn[idx]), mse_loss))
    model.eval()
    with torch.no_grad():
        return float(mse_loss(model, (model.normalise_x(x_val), model.normalise_y(y_val))))


def bench_fp32_val_loss(name: str, seed: int) -> float:
    spec = SIZES[name]
    task = make_task(spec, 0, torch.device("cpu"))  # the same data for every seed
    model = task.make_model(seed, torch.device("cpu"))
    trainer = registry.create_trainer(
        "fp32", model, torch.optim.Adam(model.parameters(), lr=spec.lr), name=f"threshold.{name}"
    )
    for step in range(spec.quality_steps):
        trainer.backward_and_step(trainer.training_step(task.train[step % len(task.train)], task.loss_fn))
    return validation_loss(model, task)


def pair_ratios(losses: list[float]) -> list[float]:
    return [max(a, b) / min(a, b) for a, b in itertools.combinations(losses, 2)]


def world_model_calls(trajs, state: Path, agent: str, canary_every: int, calls: int, steps: int) -> dict:
    settings = load_settings(state_dir=state, enable_fp16_training=True, log_level="WARNING")
    ledger = RolloutLedger.from_settings(settings)
    ledger.enable(agent, actor="canary_threshold")
    guard = RollbackGuard(agent, settings=settings, ledger=ledger, thresholds={"canary_every": canary_every})
    wm = WorldModel(
        pendulum_task.OBS_DIM,
        pendulum_task.ACT_DIM,
        agent=agent,
        guard=guard,
        settings=settings,
        precision="bf16",
        seed=0,
        checkpoint_dir=state / agent,
    )

    async def train_calls():
        return [await wm.train(steps, trajectories=trajs) for _ in range(calls)]

    started = time.perf_counter()
    reports = asyncio.run(train_calls())
    wall = time.perf_counter() - started
    ratios = [r.val_loss / r.fp32_val_loss for r in reports if r.reference == "canary"]
    return {
        "wall_s": wall,
        "per_call_s": [r.wall_s for r in reports],
        "canary_ratios": ratios,
        "rolled_back": any(r.rolled_back for r in reports),
        "precision": reports[-1].precision,
        "inference_gaps": [r.inference_gap for r in reports],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10, help="seeds per workload (pairs: seeds*(seeds-1)/2)")
    parser.add_argument("--calls", type=int, default=10, help="WorldModel.train() calls for the cost measurement")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    out: dict = {
        "torch": torch.__version__,
        "seeds": args.seeds,
        "val_loss_ratio_default": THRESHOLD_DEFAULTS["val_loss_ratio"],
    }

    trajs = pendulum_trajectories()
    data = training_data(trajs, seed=0, val_fraction=0.1)
    workloads = {"evolve_world_model": [wm_fp32_val_loss(data, s) for s in range(args.seeds)]}
    for name in ("S", "M", "LSTM"):
        workloads[f"bench_{name}"] = [bench_fp32_val_loss(name, s) for s in range(args.seeds)]
    pooled: list[float] = []
    out["seed_gap"] = {}
    for name, losses in workloads.items():
        ratios = pair_ratios(losses)
        pooled += ratios
        out["seed_gap"][name] = {
            "val_losses": losses,
            "p50": float(np.percentile(ratios, 50)),
            "p95": float(np.percentile(ratios, 95)),
            "max": max(ratios),
        }
    out["seed_gap"]["pooled"] = {
        "pairs": len(pooled),
        "p50": float(np.percentile(pooled, 50)),
        "p95": float(np.percentile(pooled, 95)),
        "max": max(pooled),
    }

    with tempfile.TemporaryDirectory(prefix="canary-threshold-") as tmp:
        telemetry.configure_logging(load_settings(state_dir=Path(tmp), log_level="WARNING"), force=True)
        steps = WM_STEPS // 4
        world_model_calls(trajs, Path(tmp), "wm_warm_up", 0, 2, steps)
        every_call = world_model_calls(trajs, Path(tmp), "wm_canary_every_1", 1, args.calls, steps)
        # alternated, twice each, the faster of each kept: the machine is shared
        runs = [
            world_model_calls(trajs, Path(tmp), f"wm_canary_{every}_{k}", every, args.calls, steps)
            for k in range(2)
            for every in (0, 5)
        ]
        off = min((r for r in runs[0::2]), key=lambda r: r["wall_s"])
        on5 = min((r for r in runs[1::2]), key=lambda r: r["wall_s"])
        telemetry.configure_logging(force=True)
    # within the every-5 run: canary calls (5, 10, ...) against the median plain call
    plain = float(np.median([w for i, w in enumerate(on5["per_call_s"], 1) if i % 5]))
    within = sum(on5["per_call_s"]) / (plain * len(on5["per_call_s"])) - 1
    out["bf16_canary_ratios"] = every_call["canary_ratios"]
    out["bf16_canary_rolled_back"] = every_call["rolled_back"]
    out["bf16_inference_gaps"] = every_call["inference_gaps"]
    out["cost"] = {
        "calls": args.calls,
        "steps_per_call": steps,
        "canary_every": 5,
        "wall_off_s": off["wall_s"],
        "wall_every_5_s": on5["wall_s"],
        "wall_every_1_s": every_call["wall_s"],
        "overhead_every_5": on5["wall_s"] / off["wall_s"] - 1,
        "overhead_every_1": every_call["wall_s"] / off["wall_s"] - 1,
        "overhead_every_5_within_run": within,
        "plain_call_s": plain,
    }
    out["seconds"] = time.perf_counter() - started

    print(
        f"FP32 seed-to-seed val-loss ratio (worse/better over {args.seeds * (args.seeds - 1) // 2} pairs per workload):"
    )
    for name, row in out["seed_gap"].items():
        print(f"  {name:20s} p50 {row['p50']:.3f}  p95 {row['p95']:.3f}  max {row['max']:.3f}")
    print(f"default val_loss_ratio: {out['val_loss_ratio_default']}")
    ratios = out["bf16_canary_ratios"]
    print(
        f"BF16 canaries on the evolve world model ({len(ratios)}): ratio {min(ratios):.4f}-{max(ratios):.4f}, "
        f"rolled back: {out['bf16_canary_rolled_back']}"
    )
    c = out["cost"]
    print(
        f"canary cost ({c['calls']} calls x {c['steps_per_call']} steps): off {c['wall_off_s']:.2f} s, every 5 "
        f"{c['wall_every_5_s']:.2f} s (+{c['overhead_every_5']:.1%}), every call {c['wall_every_1_s']:.2f} s "
        f"(+{c['overhead_every_1']:.1%}); within the every-5 run: +{c['overhead_every_5_within_run']:.1%} over "
        f"{c['calls']} plain calls of {c['plain_call_s']:.3f} s"
    )
    print(f"took {out['seconds']:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

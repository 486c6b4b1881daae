"""Real episodes per second, process pool vs Ray tasks, on Pendulum-v1.

    .venv/bin/python scripts/bench_backends.py [--workers 1 2] [--states 16] [--calls 10]

Each configuration warms its workers up with one call, then times ``--calls``
calls of ``evaluate(params, states)`` with ``--states`` start states each (the
loop's shape: one candidate, its start states split into one chunk per
worker). Also reports the local Ray start-up time (``ray.init``) and the
round trip of an empty Ray task. Wall-clock figures: on a shared machine,
run it when the machine is otherwise idle and compare runs taken together.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time


def _noop() -> None:
    return None


def episodes_per_s(ev, params, states, calls: int) -> float:
    ev.evaluate(params, states)  # warm-up: workers started, modules imported
    started = time.perf_counter()
    for _ in range(calls):
        ev.evaluate(params, states)
    return calls * len(states) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--states", type=int, default=16)
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args()

    import ray
    import torch

    from agents.evaluation import Evaluator
    from agents.ray_evaluation import RayEvaluator
    from agents.tasks.builtin import pendulum
    from genesis_fp16.base.seeds import numpy_rng

    task = pendulum().resolve()
    params = task.policy.random_params(numpy_rng(0, "bench_backends.params"), 1, 1.0)[0]
    states = task.start_states(0).train
    states = [states[i % len(states)] for i in range(args.states)]
    out: dict = {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "ray": ray.__version__,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "states_per_call": args.states,
        "calls": args.calls,
    }
    for w in args.workers:
        with Evaluator(task, workers=w, timeout_s=300) as ev:
            out[f"process_w{w}_eps"] = round(episodes_per_s(ev, params, states, args.calls), 1)
        started = time.perf_counter()
        ray.init(num_cpus=w, include_dashboard=False, log_to_driver=False)
        out[f"ray_init_w{w}_s"] = round(time.perf_counter() - started, 2)
        try:
            noop = ray.remote(num_cpus=1)(_noop)
            ray.get(noop.remote())
            started = time.perf_counter()
            for _ in range(50):
                ray.get(noop.remote())
            out[f"ray_task_roundtrip_w{w}_ms"] = round((time.perf_counter() - started) / 50 * 1000, 2)
            with RayEvaluator(task, workers=w, timeout_s=300) as ev:
                out[f"ray_w{w}_eps"] = round(episodes_per_s(ev, params, states, args.calls), 1)
        finally:
            ray.shutdown()
        out[f"ray_vs_process_w{w}"] = round(out[f"ray_w{w}_eps"] / out[f"process_w{w}_eps"], 3)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

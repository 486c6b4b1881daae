#!/usr/bin/env python
"""Acceptance check: CartPole-v1 mean evaluation return >= 475 within 100,000
steps for at least 4 of 5 seeds (8 envs, 128 steps, 4 epochs, minibatch 256).

    OMP_NUM_THREADS=1 .venv/bin/python scripts/check_cartpole.py [--seeds 1 2 3 4 5] [--steps 100000] [--json PATH]

Exit status 0 when the bar is met, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--threshold", type=float, default=475.0)
    ap.add_argument("--need", type=int, default=4)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import torch

    from agents.ppo.config import load_config
    from agents.ppo.ppo import run

    rows = []
    for seed in args.seeds:
        cfg = load_config(ROOT / "configs" / "base.yaml", args.overrides, env_id="CartPole-v1", total_steps=args.steps, seed=seed)
        res = run(cfg)
        rows.append({"seed": seed, "env_steps": res.env_steps, "eval_return": res.eval_return,
                     "env_steps_per_s": res.env_steps_per_s, "wall_s": res.wall_s})
        print(f"seed {seed}: eval return {res.eval_return:.1f} after {res.env_steps} steps "
              f"({res.env_steps_per_s:,.0f} env steps/s)", flush=True)
    passed = sum(r["eval_return"] >= args.threshold for r in rows)
    ok = passed >= args.need
    print(f"{passed}/{len(rows)} seeds >= {args.threshold}: {'PASS' if ok else 'FAIL'} (need {args.need})")
    if args.json:
        from genesis_fp16.checkpoint import atomic_write_text

        atomic_write_text(args.json, json.dumps({"rows": rows, "passed": passed, "ok": ok, "torch": torch.__version__,
                                                 "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, indent=2))
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()

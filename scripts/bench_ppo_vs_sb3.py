#!/usr/bin/env python
"""Stable-Baselines3 PPO vs genesis-fp16 PPO on the same settings.

    .venv/bin/python scripts/bench_ppo_vs_sb3.py [--env CartPole-v1] [--steps 100000] [--repeats 3] [--json PATH]

Both use 8 in-process environments (SB3's DummyVecEnv, our SyncVectorEnv),
128 steps per rollout, 4 epochs, minibatch 256, separate 64-64 tanh actor and
critic MLPs, the same learning rate / gamma / GAE lambda / entropy / clip
values, FP32 on the CPU. Each measurement runs in its own subprocess with
OMP_NUM_THREADS=1; the two alternate (SB3 first on odd repeats, ours first on
even ones) and the ratio is of the medians. Needs the ``bench`` extra
(``pip install -e .[bench]``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = dict(num_envs=8, num_steps=128, update_epochs=4, minibatch_size=256)


def _ours_config(env_id: str, steps: int, seed: int):
    from agents.ppo.config import load_config

    return load_config(ROOT / "configs" / "base.yaml", env_id=env_id, total_steps=steps, seed=seed,
                       vec_env="sync", device="cpu", **SHARED)


def worker_ours(env_id: str, steps: int, seed: int) -> dict:
    from agents.ppo.ppo import run

    result = run(_ours_config(env_id, steps, seed))
    return {"impl": "ours", "env_steps": result.env_steps, "wall_s": result.wall_s,
            "env_steps_per_s": result.env_steps_per_s, "eval_return": result.eval_return,
            "time_split_s": result.time_split_s}


def worker_sb3(env_id: str, steps: int, seed: int) -> dict:
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import DummyVecEnv

    cfg = _ours_config(env_id, steps, seed)
    lr = cfg.learning_rate
    env = make_vec_env(env_id, n_envs=cfg.num_envs, seed=seed, vec_env_cls=DummyVecEnv)
    model = PPO(
        "MlpPolicy", env, n_steps=cfg.num_steps, batch_size=cfg.minibatch_size, n_epochs=cfg.update_epochs,
        learning_rate=(lambda progress: progress * lr) if cfg.anneal_lr else lr, gamma=cfg.gamma,
        gae_lambda=cfg.gae_lambda, clip_range=cfg.clip_coef, ent_coef=cfg.ent_coef, vf_coef=cfg.vf_coef,
        max_grad_norm=cfg.max_grad_norm, normalize_advantage=cfg.norm_adv,
        policy_kwargs=dict(net_arch=dict(pi=[cfg.hidden_size] * 2, vf=[cfg.hidden_size] * 2), activation_fn=torch.nn.Tanh),
        seed=seed, device="cpu", verbose=0,
    )
    total = cfg.num_iterations * cfg.batch_size  # the same number of env steps as ours
    t0 = time.perf_counter()
    model.learn(total_timesteps=total)
    wall = time.perf_counter() - t0
    eval_env = make_vec_env(env_id, n_envs=1, seed=seed + 10_000)
    mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=cfg.eval_episodes, deterministic=True)
    return {"impl": "sb3", "env_steps": model.num_timesteps, "wall_s": wall,
            "env_steps_per_s": model.num_timesteps / wall, "eval_return": float(mean)}


def _spawn(impl: str, env_id: str, steps: int, seed: int) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", impl, "--env", env_id, "--steps", str(steps), "--seed", str(seed)]
    env = {**__import__("os").environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # a subprocess needs its env
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"{impl} worker failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--worker", choices=["ours", "sb3"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        fn = worker_ours if args.worker == "ours" else worker_sb3
        print(json.dumps(fn(args.env, args.steps, args.seed)))
        return
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        raise SystemExit("stable-baselines3 is not installed: pip install -e '.[bench]'")
    import platform

    import torch

    runs = {"ours": [], "sb3": []}
    for rep in range(args.repeats):
        order = ["sb3", "ours"] if rep % 2 == 0 else ["ours", "sb3"]
        for impl in order:
            res = _spawn(impl, args.env, args.steps, args.seed + rep)
            runs[impl].append(res)
            print(f"repeat {rep + 1}/{args.repeats} {impl:4s}: {res['env_steps_per_s']:8,.0f} env steps/s, "
                  f"eval return {res['eval_return']:.1f}, wall {res['wall_s']:.1f} s", flush=True)
    med = {k: statistics.median(r["env_steps_per_s"] for r in v) for k, v in runs.items()}
    ratio = med["ours"] / med["sb3"]
    pair_ratios = [o["env_steps_per_s"] / s["env_steps_per_s"] for o, s in zip(runs["ours"], runs["sb3"])]
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
    summary = {
        "env": args.env, "steps": args.steps, "repeats": args.repeats, "settings": SHARED,
        "median_env_steps_per_s": med, "ratio_of_medians": ratio, "pair_ratios": pair_ratios,
        "eval_returns": {k: [r["eval_return"] for r in v] for k, v in runs.items()},
        "runs": runs, "torch": torch.__version__, "cpu": cpu, "cores": len(__import__("os").sched_getaffinity(0)),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_avg": list(__import__("os").getloadavg()),
    }
    print(f"median env steps/s: ours {med['ours']:,.0f}, SB3 {med['sb3']:,.0f}; ratio {ratio:.2f}x "
          f"(per pair: {', '.join(f'{r:.2f}' for r in pair_ratios)})")
    print(f"final eval returns: ours {summary['eval_returns']['ours']}, SB3 {summary['eval_returns']['sb3']}")
    if args.json:
        from genesis_fp16.checkpoint import atomic_write_text

        atomic_write_text(args.json, json.dumps(summary, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

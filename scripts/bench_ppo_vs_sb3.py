#!/usr/bin/env python
"""Stable-Baselines3 PPO vs genesis-fp16 PPO on the same settings, beside
the raw env-stepping rate.

    .venv/bin/python scripts/bench_ppo_vs_sb3.py [--env CartPole-v1] [--steps 100000] [--repeats 3] [--json PATH]

Both use 8 in-process environments (SB3's DummyVecEnv; ours what ``--vec-env``
says, by default what ``genesis-fp16 ppo`` picks, with its CPU fast path: for
HalfCheetah-v5 and Swimmer-v5 the lean MuJoCo step, gymnasium's results step for step),
128 steps per rollout, 4 epochs, minibatch 256, separate 64-64 tanh actor and
critic MLPs, the same learning rate / gamma / GAE lambda / entropy / clip
values and the same observation / reward normalisation (SB3's VecNormalize
where ours normalises inside the learner), FP32 on the CPU. Each measurement runs in its own subprocess with
OMP_NUM_THREADS=1; the two alternate (SB3 first on odd repeats, ours first on
even ones) and the ratio is of the medians. Every run is timed twice: by
wall clock and by the process's CPU time (``time.process_time``, user +
system of all its threads), over training only (not start-up or the final
evaluation). On a shared machine the wall-clock ratio moves with other
people's load; the CPU-time ratio much less, so it is the one to read there
(the load average before each run is in the JSON). Each repeat also steps
gymnasium's ``SyncVectorEnv`` x8 with random actions (SAME_STEP autoreset,
actions sampled beforehand): the raw limit a PPO on these envs approaches.
Needs the ``bench`` extra (``pip install -e .[bench]``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # benchmarks/ (the baselines' host report) is not installed
SHARED = dict(num_envs=8, num_steps=128, update_epochs=4, minibatch_size=256)
OVERRIDES: list[str] = []  # --set key=value: configs/base.yaml overrides, read by both implementations


def _ours_config(env_id: str, steps: int, seed: int, vec_env: str = "sync"):
    from agents.ppo.config import load_config

    return load_config(
        ROOT / "configs" / "base.yaml",
        OVERRIDES,
        env_id=env_id,
        total_steps=steps,
        seed=seed,
        vec_env=vec_env,
        device="cpu",
        **SHARED,
    )


def train_timed(ppo) -> tuple[Any, float, float]:
    """(result, CPU seconds of training alone, mean evaluation return) of a `PPO`, which it closes."""
    import numpy as np

    try:
        cpu0 = time.process_time()
        result = ppo.train()
        cpu = time.process_time() - cpu0
        return result, cpu, float(np.mean(ppo.evaluate()))
    finally:
        ppo.close()


def worker_ours(env_id: str, steps: int, seed: int, vec_env: str) -> dict:
    from agents.ppo.ppo import PPO

    ppo = PPO(_ours_config(env_id, steps, seed, vec_env))
    result, cpu, eval_return = train_timed(ppo)
    return {
        "impl": "ours",
        "env_steps": result.env_steps,
        "wall_s": result.wall_s,
        "cpu_s": cpu,
        "env_steps_per_s": result.env_steps_per_s,
        "env_steps_per_cpu_s": result.env_steps / cpu,
        "eval_return": eval_return,
        "time_split_s": result.time_split_s,
        "vec_env": ppo.vec_choice.mode if ppo.vec_choice is not None else None,
    }


def worker_raw(env_id: str, steps: int, seed: int, vec_env: str) -> dict:
    """Gymnasium's SyncVectorEnv x8 stepped with random actions: no policy, no learning."""
    import gymnasium as gym

    n = SHARED["num_envs"]
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * n, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    try:
        envs.reset(seed=seed)
        envs.action_space.seed(seed)
        vector_steps = max(1, steps // n)
        actions = [envs.action_space.sample() for _ in range(vector_steps)]
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for a in actions:
            envs.step(a)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    finally:
        envs.close()
    total = vector_steps * n
    return {
        "impl": "raw",
        "env_steps": total,
        "wall_s": wall,
        "cpu_s": cpu,
        "env_steps_per_s": total / wall,
        "env_steps_per_cpu_s": total / cpu,
    }


def worker_sb3(env_id: str, steps: int, seed: int, vec_env: str) -> dict:  # SB3 always steps its DummyVecEnv
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    cfg = _ours_config(env_id, steps, seed)
    lr = cfg.learning_rate
    env = make_vec_env(env_id, n_envs=cfg.num_envs, seed=seed, vec_env_cls=DummyVecEnv)
    normalized = cfg.normalize_obs or cfg.normalize_reward
    if normalized:  # ours normalises inside the learner; SB3's way is the VecNormalize wrapper
        env = VecNormalize(env, norm_obs=cfg.normalize_obs, norm_reward=cfg.normalize_reward, gamma=cfg.gamma)
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=cfg.num_steps,
        batch_size=cfg.minibatch_size,
        n_epochs=cfg.update_epochs,
        learning_rate=(lambda progress: progress * lr) if cfg.anneal_lr else lr,
        gamma=cfg.gamma,
        gae_lambda=cfg.gae_lambda,
        clip_range=cfg.clip_coef,
        ent_coef=cfg.ent_coef,
        vf_coef=cfg.vf_coef,
        max_grad_norm=cfg.max_grad_norm,
        normalize_advantage=cfg.norm_adv,
        policy_kwargs=dict(
            net_arch=dict(pi=[cfg.hidden_size] * 2, vf=[cfg.hidden_size] * 2), activation_fn=torch.nn.Tanh
        ),
        seed=seed,
        device="cpu",
        verbose=0,
    )
    total = cfg.num_iterations * cfg.batch_size  # the same number of env steps as ours
    t0, cpu0 = time.perf_counter(), time.process_time()
    model.learn(total_timesteps=total)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    eval_env = make_vec_env(env_id, n_envs=1, seed=seed + 10_000)
    if normalized:  # the training statistics, frozen; true rewards
        eval_env = VecNormalize(eval_env, norm_obs=cfg.normalize_obs, norm_reward=False, training=False)
        if cfg.normalize_obs:
            eval_env.obs_rms = env.obs_rms
    mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=cfg.eval_episodes, deterministic=True)
    return {
        "impl": "sb3",
        "env_steps": model.num_timesteps,
        "wall_s": wall,
        "cpu_s": cpu,
        "env_steps_per_s": model.num_timesteps / wall,
        "env_steps_per_cpu_s": model.num_timesteps / cpu,
        "eval_return": float(mean),
    }


def _spawn(impl: str, env_id: str, steps: int, seed: int, vec_env: str) -> dict:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        impl,
        "--env",
        env_id,
        "--steps",
        str(steps),
        "--seed",
        str(seed),
        "--vec-env",
        vec_env,
        *(f"--set={o}" for o in OVERRIDES),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # a subprocess needs its env
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
    ap.add_argument(
        "--raw-steps", type=int, default=None, help="env steps of the raw SyncVectorEnv measurement (default: --steps)"
    )
    ap.add_argument(
        "--vec-env",
        choices=["auto", "sync"],
        default="auto",
        help="our PPO's vec_env (SB3 steps its DummyVecEnv either way; auto: what `genesis-fp16 ppo` picks); "
        "the raw rate is measured on gymnasium's SyncVectorEnv",
    )
    ap.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        help="a key=value override of configs/base.yaml, for ours and SB3 alike (e.g. normalize_reward=false)",
    )
    ap.add_argument("--worker", choices=["ours", "sb3", "raw"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    OVERRIDES[:] = args.overrides
    if args.worker:
        fn = {"ours": worker_ours, "sb3": worker_sb3, "raw": worker_raw}[args.worker]
        print(json.dumps(fn(args.env, args.steps, args.seed, args.vec_env)))
        return
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        raise SystemExit("stable-baselines3 is not installed: pip install -e '.[bench]'")
    from benchmarks.baselines.common import host

    runs: dict[str, list[dict]] = {"ours": [], "sb3": [], "raw": []}
    for rep in range(args.repeats):
        order = ["sb3", "ours", "raw"] if rep % 2 == 0 else ["raw", "ours", "sb3"]
        for impl in order:
            load = os.getloadavg()[0]
            res = _spawn(
                impl,
                args.env,
                args.raw_steps or args.steps if impl == "raw" else args.steps,
                args.seed + rep,
                args.vec_env,
            )
            res["load_avg_before"] = load
            runs[impl].append(res)
            ret = f", eval return {res['eval_return']:.1f}" if "eval_return" in res else ""
            print(
                f"repeat {rep + 1}/{args.repeats} {impl:4s}: {res['env_steps_per_cpu_s']:8,.0f} env steps per CPU-s, "
                f"{res['env_steps_per_s']:8,.0f} per wall-s{ret} (load {load:.1f})",
                flush=True,
            )
    med = {k: statistics.median(r["env_steps_per_s"] for r in v) for k, v in runs.items()}
    med_cpu = {k: statistics.median(r["env_steps_per_cpu_s"] for r in v) for k, v in runs.items()}
    ratio, ratio_cpu = med["ours"] / med["sb3"], med_cpu["ours"] / med_cpu["sb3"]
    pairs = list(zip(runs["ours"], runs["sb3"]))
    pair_ratios = [o["env_steps_per_s"] / s["env_steps_per_s"] for o, s in pairs]
    pair_ratios_cpu = [o["env_steps_per_cpu_s"] / s["env_steps_per_cpu_s"] for o, s in pairs]
    where = host()  # CPU model, the flags a figure is read against, cores, torch, date
    summary = {
        "env": args.env,
        "steps": args.steps,
        "repeats": args.repeats,
        "settings": SHARED,
        "overrides": OVERRIDES,
        "vec_env": args.vec_env,
        "vec_env_resolved": sorted({str(r["vec_env"]) for r in runs["ours"]}),
        "median_env_steps_per_s": med,
        "median_env_steps_per_cpu_s": med_cpu,
        "ratio_of_medians": ratio,
        "ratio_of_medians_cpu": ratio_cpu,
        "pair_ratios": pair_ratios,
        "pair_ratios_cpu": pair_ratios_cpu,
        "share_of_raw_cpu": {k: med_cpu[k] / med_cpu["raw"] for k in ("ours", "sb3")},
        "eval_returns": {k: [r["eval_return"] for r in runs[k]] for k in ("ours", "sb3")},
        "runs": runs,
        "torch": where["torch"],
        "cpu": where["cpu"],
        "cpu_flags": where["flags"],
        "cores": len(os.sched_getaffinity(0)),
        "date": where["date"],
        "load_avg": list(os.getloadavg()),
    }
    print(f"our engine: {', '.join(summary['vec_env_resolved'])}")
    print(
        f"per CPU-second: ours {med_cpu['ours']:,.0f}, SB3 {med_cpu['sb3']:,.0f}, raw SyncVectorEnv "
        f"{med_cpu['raw']:,.0f}; "
        f"ours/SB3 {ratio_cpu:.2f}x (per pair: {', '.join(f'{r:.2f}' for r in pair_ratios_cpu)}); "
        f"ours {100 * summary['share_of_raw_cpu']['ours']:.0f}% of raw, SB3 "
        f"{100 * summary['share_of_raw_cpu']['sb3']:.0f}%"
    )
    print(
        f"per wall-second: ours {med['ours']:,.0f}, SB3 {med['sb3']:,.0f}; ratio {ratio:.2f}x "
        f"(per pair: {', '.join(f'{r:.2f}' for r in pair_ratios)}); load average now {os.getloadavg()[0]:.1f}"
    )
    print(f"final eval returns: ours {summary['eval_returns']['ours']}, SB3 {summary['eval_returns']['sb3']}")
    if args.json:
        from genesis_fp16.base.storage import atomic_write_text

        atomic_write_text(args.json, json.dumps(summary, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

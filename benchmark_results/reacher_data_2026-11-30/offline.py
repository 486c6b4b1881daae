"""Offline diagnostic: can the learners, given a run's whole replay buffer, make a better actor than its answer?

usage: python offline.py RUN_DIR HIDDEN ROUNDS CRITIC_STEPS ACTOR_STEPS {answer,zero}
(RUN_DIR holds the run's state dir st/; the actor is the run's policy family, from its answer or from zeros)."""

import asyncio
import dataclasses
import glob
import sqlite3
import sys

import numpy as np
import torch

from agents.policies import load_policy
from agents.refine import ZPolicy, refine
from agents.search_space import SearchSpace
from infrastructure.critic import Critic
from infrastructure.replay_buffer import ReplayBuffer
from infrastructure.transitions import Transitions


def make_critic(spec, hidden: int, checkpoint_dir: str) -> Critic:
    """A fresh FP32 critic of the project (`infrastructure.critic.Critic`) for ``spec``'s spaces."""
    return Critic(
        spec.obs_dim,
        spec.act_dim,
        action_low=spec.action_low,
        action_high=spec.action_high,
        precision="fp32",
        seed=0,
        checkpoint_dir=checkpoint_dir,
        hidden=hidden,
    )


def main() -> None:
    torch.set_num_threads(1)
    run_dir, start = sys.argv[1], sys.argv[6]
    hidden, rounds, critic_steps, actor_steps = (int(v) for v in sys.argv[2:6])
    pol = load_policy(glob.glob(f"{run_dir}/st/runs/*/policy.json")[0])
    db = f"{run_dir}/st/replay.sqlite"
    agent = sqlite3.connect(db).execute("select distinct agent from trajectories").fetchone()[0]
    data = Transitions.from_trajectories(ReplayBuffer(db, read_only=True).sample(agent))
    spec = pol.spec
    obs = data.obs.double().numpy() * np.asarray(spec.obs_scale)
    space = SearchSpace(spec, obs.mean(0), obs.std(0) + 1e-8)
    z = space.to_z(np.asarray(pol.params)) if start == "answer" else np.zeros(spec.n_params)
    print("transitions", len(data), "answer heldout", pol.evaluate().mean_return, flush=True)
    critic = make_critic(spec, hidden, f"/tmp/offline_ck_{hidden}_{start}_{rounds}")

    def act(zz: np.ndarray):
        policy, zt = ZPolicy(space), torch.tensor(np.asarray(zz, dtype=np.float32)[None])
        return lambda o: policy(zt, o.float()[None])[0].detach()

    async def run() -> None:
        nonlocal z
        for r in range(rounds):
            await critic.train(data, act(z), critic_steps, save=False)
            z = refine(z, data.obs[-4096:], space, value=critic.value, snapshots=[actor_steps], seed=r)[0]
            if (r + 1) % max(1, rounds // 4) == 0:
                now = dataclasses.replace(pol, params=space.to_raw(z), path=None)
                print(f"round {r + 1}: heldout {now.evaluate().mean_return:.3f}", flush=True)

    asyncio.run(run())


if __name__ == "__main__":
    main()

"""Offline diagnostic 2: a fresh 256x256 TD3 actor (SAC's actor size) trained through the project's critic on a run's
replay buffer, or on SAC's (``SACBUF=sac_buf.npz``); the held-out mean on the run's held-out start states.

usage: python offline_big.py RUN_DIR HIDDEN ROUNDS CRITIC_STEPS ACTOR_STEPS WIDTH"""

import asyncio
import glob
import os
import sqlite3
import sys

import gymnasium as gym
import numpy as np
import torch

from agents.policies import load_policy
from genesis_fp16.base.seeds import torch_generator
from infrastructure.replay_buffer import ReplayBuffer
from infrastructure.transitions import Transitions
from offline import make_critic  # this folder's


def load_data(run_dir: str) -> Transitions:
    if os.environ.get("SACBUF"):
        b = np.load(os.environ["SACBUF"])
        fields = [torch.tensor(b[k], dtype=torch.float32) for k in ("obs", "act", "rew", "next_obs", "done")]
        return Transitions(*fields)
    db = f"{run_dir}/st/replay.sqlite"
    agent = sqlite3.connect(db).execute("select distinct agent from trajectories").fetchone()[0]
    return Transitions.from_trajectories(ReplayBuffer(db, read_only=True).sample(agent))


def main() -> None:
    torch.set_num_threads(1)
    run_dir = sys.argv[1]
    hidden, rounds, critic_steps, actor_steps, width = (int(v) for v in sys.argv[2:7])
    pol = load_policy(glob.glob(f"{run_dir}/st/runs/*/policy.json")[0])
    data = load_data(run_dir)
    print("transitions", len(data), float(data.rew.mean()), flush=True)
    spec = pol.spec
    low = torch.tensor(spec.action_low, dtype=torch.float32)
    high = torch.tensor(spec.action_high, dtype=torch.float32)
    mu, sd = data.obs.mean(0), data.obs.std(0) + 1e-6
    layers = [torch.nn.Linear(spec.obs_dim, width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU()]
    net = torch.nn.Sequential(*layers, torch.nn.Linear(width, spec.act_dim), torch.nn.Tanh())
    init = torch_generator(0, "offline_big.init")
    with torch.no_grad():  # PyTorch's default Linear init, drawn from a named stream
        for layer in net:
            if isinstance(layer, torch.nn.Linear):
                bound = 1.0 / layer.in_features**0.5
                layer.weight.uniform_(-bound, bound, generator=init)
                layer.bias.uniform_(-bound, bound, generator=init)

    def pi(o: torch.Tensor) -> torch.Tensor:
        return low + (net((o.float() - mu) / sd) + 1) * (high - low) / 2

    opt = torch.optim.Adam(net.parameters(), lr=3e-4)
    critic = make_critic(spec, hidden, f"/tmp/offline_big_ck_{hidden}_{width}")

    def heldout() -> float:
        env, returns = gym.make("Reacher-v5"), []
        for state in pol.heldout_states:
            o, _ = env.reset(seed=int(state[0]))
            total, done = 0.0, False
            while not done:
                with torch.no_grad():
                    a = pi(torch.tensor(o)[None])[0].numpy()
                o, r, terminated, truncated, _ = env.step(a)
                total, done = total + r, terminated or truncated
            returns.append(total)
        return float(np.mean(returns))

    async def run() -> None:
        g = torch_generator(0, "offline_big.rows")
        for r in range(rounds):
            await critic.train(data, lambda o: pi(o).detach(), critic_steps, save=False)
            for _ in range(actor_steps):
                o = data.obs[torch.randint(len(data), (256,), generator=g)].float()
                loss = -critic.value(o, pi(o)).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            if (r + 1) % max(1, rounds // 4) == 0:
                print(f"round {r + 1}: heldout {heldout():.3f}", flush=True)

    asyncio.run(run())


if __name__ == "__main__":
    main()

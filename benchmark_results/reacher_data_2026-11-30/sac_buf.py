"""SB3 SAC (its defaults) on Reacher-v5, seed 2, 10,000 steps: its replay buffer (sac_buf.npz) and policy (sac2.zip)."""

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import SAC


def main() -> None:
    torch.set_num_threads(1)
    model = SAC("MlpPolicy", gym.make("Reacher-v5"), seed=2, verbose=0)
    model.learn(10000)
    rb, n = model.replay_buffer, model.replay_buffer.pos
    np.savez(
        "sac_buf.npz",
        obs=rb.observations[:n, 0],
        act=rb.actions[:n, 0],
        rew=rb.rewards[:n, 0],
        next_obs=rb.next_observations[:n, 0],
        done=rb.dones[:n, 0] * (1 - rb.timeouts[:n, 0]),
    )
    model.save("sac2")


if __name__ == "__main__":
    main()

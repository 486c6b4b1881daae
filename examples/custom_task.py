"""Evolve a policy for your own environment with the SE-Darwin loop.

    .venv/bin/python examples/custom_task.py --budget 80 [--seed S] [--json report.json] [--policy FILE]

A small gymnasium environment (a thermostat), a Task around it, and the loop through the Python API:
``await agent.evolve()`` runs each candidate's real episodes in worker processes and trains a world model and a
critic on them after every generation; the answer is a policy file, loaded back to act and to evaluate.
docs/EMBEDDING.md shows this file as it stands and explains each part.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from typing import Any, Optional

import gymnasium as gym
import numpy as np

from agents.tasks import Task  # numpy only: the evaluation workers import this module, and start fastest without torch


class Thermostat(gym.Env):
    """Keep a room at its set point. Observation: (temperature error, last heater power); action: heater power in
    [-1, 1]. Reward 1 a step minus the squared error; the episode ends early when the error leaves [-4, 4]."""

    observation_space = gym.spaces.Box(-5.0, 5.0, (2,), np.float32)  # a flat Box
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)  # a bounded Box

    def reset(
        self, *, seed: Optional[int] = None, options: Optional[dict[str, Any]] = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.error, self.power = float(self.np_random.uniform(-2.0, 2.0)), 0.0
        return self._obs(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.power = float(np.clip(action[0], -1.0, 1.0))
        self.error = 0.9 * self.error + 0.5 * self.power + 0.15  # the room loses heat to a warm corridor
        reward = 1.0 - self.error**2 - 0.01 * self.power**2
        return self._obs(), reward, abs(self.error) > 4.0, False, {}

    def _obs(self) -> np.ndarray:
        return np.array([self.error, self.power], dtype=np.float32)


def make_thermostat() -> gym.Env:
    """Module level: the evaluation workers import it to build their env."""
    return Thermostat()


THERMOSTAT = Task(
    env_id="Thermostat-v0",  # a gymnasium id, or the name of what env_factory makes
    env_factory=make_thermostat,  # leave out for a gymnasium id (env_kwargs= passes kwargs to gym.make)
    target=48.5,  # the mean return over the training start states that counts as solved
    policy="linear",  # or "mlp:H"; actions are tanh-bounded into the action box
    episode_steps=50,  # default: the env spec's max_episode_steps, else 1000
    n_train=8,  # start states: reset(seed=k), disjoint train / validation (n_validation=8) / held-out seeds
    n_heldout=16,
    description="hold a room at its set point",
)


async def evolve(budget: int, seed: int = 0, state_dir: Optional[str] = None, **options: Any) -> dict[str, Any]:
    """Run the loop on the thermostat and return its report (the dictionary ``genesis-fp16 evolve --json``
    writes). ``options`` are further `EvolveConfig` fields (a test passes tiny ones)."""
    # imported here, not at the top: the workers import this module for its env factory, and these bring torch
    from agents.evolve_config import EvolveConfig
    from agents.se_darwin_agent import SEDarwinAgent
    from genesis_fp16.base.settings import load_settings

    settings = load_settings(state_dir=state_dir) if state_dir else load_settings()
    config = EvolveConfig(env_id=THERMOSTAT.env_id, budget=budget, seed=seed, **options)

    def progress(record: dict[str, Any]) -> None:
        print(
            f"generation {record['generation']}: {record['real_episodes']} real episodes, "
            f"best {record['best_return']:.1f}"
        )

    agent = SEDarwinAgent(config, task=THERMOSTAT, settings=settings, on_generation=progress)
    return await agent.evolve()


def main() -> None:
    from agents.policies import load_policy  # torch-free

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=int, default=80, help="real episodes the search may spend (default 80)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", dest="json_path", help="write the report here")
    parser.add_argument("--policy", default="thermostat-policy.json", help="save the evolved policy here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="custom_task_") as state_dir:  # a fresh state dir: no earlier run's data
        report = asyncio.run(evolve(args.budget, args.seed, state_dir, workers=2))
        policy = load_policy(report["policy_file"])  # the run's answer, written to its run folder
        policy.save(args.policy)  # kept: the state dir goes when this block ends
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2, default=str)
    print(
        f"target {report['target']} reached: {report['target_reached']} after {report['real_episodes']} real "
        f"episodes ({report['env_steps']} env steps); held-out return {report['heldout_return']:.1f}; "
        f"{report['wall_s']:.1f} s"
    )
    # the policy acts on its own: a batch of observations (or one) in, deterministic actions out
    print("actions for errors -1, 0, 1:", load_policy(args.policy).predict([[-1.0, 0.0], [0.0, 0.0], [1.0, 0.0]]))
    held_out = policy.evaluate(task=THERMOSTAT)  # the run's held-out start states, in this process
    print(
        f"saved {args.policy}: held-out mean {held_out.mean_return:.1f} (the report's {report['heldout_return']:.1f})"
    )


if __name__ == "__main__":  # the evaluation workers are spawned processes: each imports this module, without running it
    main()

"""The built-in tasks. Termination functions use tensor methods only, so
this module stays importable without torch (worker processes import it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import pendulum as pendulum_states
from .task import ExactStates, Task

if TYPE_CHECKING:
    import torch


def pendulum() -> Task:
    # refine_steps 1600, by measurement: `genesis-fp16 evolve` (no flags) on seeds 0-9 confirmed its target in
    # 40 / 28 / 32 / 28 / 36 / 28 / 28 / 40 / 28 / 32 real episodes, every seed's learners meeting it in the first
    # generation they run in, against the loop's 800 steps' 28 / 43 / 44 / 32 / 66 / 47 / 28 / 60 / 28 / 32 (3200:
    # seed 7 took 60; benchmark_results/pendulum_refine_2026-11-29)
    return Task(
        env_id="Pendulum-v1",
        target=pendulum_states.TARGET_RETURN,
        policy=f"mlp:{pendulum_states.HIDDEN}",
        episode_steps=pendulum_states.EPISODE_STEPS,
        n_train=pendulum_states.N_TRAIN_STARTS,
        n_heldout=pendulum_states.N_HELDOUT_STARTS,
        n_validation=pendulum_states.N_VALIDATION_STARTS,
        exact_states=ExactStates(
            split=pendulum_states.start_states,
            set_state=pendulum_states.set_state,
            observe=pendulum_states.observation,
            extra=pendulum_states.extra_states,
        ),
        obs_scale=pendulum_states.OBS_SCALE,
        project=pendulum_states.project,
        terminates=False,
        description="swing up and hold; 16 exact start states, target -300",
        refine_steps=1600,
    )


def inverted_pendulum_done(obs: "torch.Tensor") -> "torch.Tensor":
    """InvertedPendulum-v5 ends when the pole angle leaves [-0.2, 0.2] (gymnasium's own rule)."""
    return obs[..., 1].abs() > 0.2


def inverted_pendulum() -> Task:
    return Task(
        env_id="InvertedPendulum-v5",
        policy="linear",
        termination=inverted_pendulum_done,
        description="balance a pole (MuJoCo); target: the spec's 950",
    )


def mountain_car_done(obs: "torch.Tensor") -> "torch.Tensor":
    """MountainCarContinuous-v0 ends at the flag: position >= 0.45 with velocity >= 0."""
    return (obs[..., 0] >= 0.45) & (obs[..., 1] >= 0.0)


def mountain_car() -> Task:
    return Task(
        env_id="MountainCarContinuous-v0",
        policy="mlp:8",
        termination=mountain_car_done,
        description="drive up the hill; target: the spec's 90",
    )


def swimmer() -> Task:
    # linear, as ARS V2 (Mania et al. 2018) solves it; not measured against another policy here
    return Task(
        env_id="Swimmer-v5",
        policy="linear",
        terminates=False,
        description="swim forward (MuJoCo); target: the spec's 360",
    )


def half_cheetah() -> Task:
    return Task(
        env_id="HalfCheetah-v5",
        policy="linear",
        terminates=False,
        description="run forward (MuJoCo); target: the spec's 4800",
    )


def inverted_double_pendulum_done(obs: "torch.Tensor") -> "torch.Tensor":
    """InvertedDoublePendulum-v5 ends when the tip's height y = 0.6 cos(a1) + 0.6 cos(a1 + a2) is at most 1 (gymnasium's
    rule; the observation holds sin and cos of both angles: obs[1:3] and obs[3:5])."""
    s1, s2, c1, c2 = obs[..., 1], obs[..., 2], obs[..., 3], obs[..., 4]
    return 0.6 * c1 + 0.6 * (c1 * c2 - s1 * s2) <= 1.0


def inverted_double_pendulum() -> Task:
    # linear, by measurement: the loop at 3,500 env steps, seeds 1-5, held-out 548.4 / 411.0 / 509.7 / 430.7 / 387.9
    # against mlp:8's 477.8 / 663.2 / 288.9 / 410.9 / 362.5, better on 4 of 5 seeds (the loop's rules of c2529be:
    # benchmark_results/loop55_2026-11-29)
    return Task(
        env_id="InvertedDoublePendulum-v5",
        policy="linear",
        termination=inverted_double_pendulum_done,
        description="balance two poles on a cart (MuJoCo); target: the spec's 9100",
    )


def hopper_done(obs: "torch.Tensor") -> "torch.Tensor":
    """Hopper-v5 ends when it is not healthy (gymnasium's rule on what the observation shows): the torso's height
    obs[0] at most 0.7, its angle obs[1] outside (-0.2, 0.2), or a joint position or velocity at 100 or beyond."""
    return (obs[..., 0] <= 0.7) | (obs[..., 1].abs() >= 0.2) | (obs[..., 1:].abs() >= 100.0).any(dim=-1)


def hopper() -> Task:
    # linear, as ARS V2 (Mania et al. 2018) solves it; not measured against another policy here.
    # discount 0.995 (a horizon of 200 steps) instead of 0.99, by measurement: the loop at 15,000 env steps, seeds 1-5,
    # held-out 1042.4 / 1190.6 / 1039.6 / 1153.2 / 1367.3 (median 1153.2, 1.12x its floor) against 0.99's 1804.1 /
    # 790.6 / 1039.6 / 1032.1 / 760.1 (1032.1); 0.998 on seeds 1-3: 784.1 / 467.7 / 1043.1
    # (benchmark_results/discount_2026-11-29). At 0.99 a fall 150 steps ahead weighs 0.22 in the critic's value, and
    # the actor's extras lead CMA-ES into short fast episodes (about 300 in 150 steps) off the standing plateau (about
    # 1000 in 1000 steps) that the floor climbs.
    return Task(
        env_id="Hopper-v5",
        policy="linear",
        termination=hopper_done,
        description="hop forward (MuJoCo); target: the spec's 3800",
        discount=0.995,
    )


def reacher() -> Task:
    # mlp:16, by measurement: the loop at 10,000 env steps, seeds 1-5, held-out -8.86 / -6.92 / -8.15 / -6.76 / -8.96
    # against linear's -9.73 / -8.14 / -8.14 / -8.17 / -9.25 (better on 4 of 5 seeds, the same median, 28% less CPU;
    # the loop's rules of ce5a803: benchmark_results/loop55_2026-11-29). The torque that reaches a point is the arm's
    # Jacobian (sines and cosines of the joint angles) times the fingertip's error: a product a linear policy cannot
    # form.
    return Task(
        env_id="Reacher-v5",
        policy="mlp:16",
        terminates=False,
        description="reach a random target (MuJoCo); target: the spec's -3.75",
    )


def pusher() -> Task:
    # sigma0 0.1 instead of 0.5, by measurement: the loop at 10,000 env steps, seeds 1-5, held-out -44.0 / -48.3 /
    # -46.1 / -54.0 / -49.2 (median -48.3) against 0.5's -62.0 / -56.8 / -100.9 / -53.1 / -67.5 (-62.0) and 0.2's
    # -52.4 / -55.0 / -55.1 / -50.3 / -54.9 (-54.9); benchmark_results/unseen_tasks_2026-11-30. Doing nothing (every
    # action 0) scores about -55: at 0.5 the first population's actions saturate the seven joints (pre-activations of
    # about 2.4 on 23 normalised inputs), its episodes score -150 to -290, and the learners start from there. linear:
    # not measured against another policy here (mlp:16 at 0.5: no better).
    return Task(
        env_id="Pusher-v5",
        policy="linear",
        terminates=False,
        description="push an object to a goal (MuJoCo); target: the spec's 0, out of reach",
        sigma0=0.1,
    )


BUILTIN = {
    "Pendulum-v1": pendulum,
    "InvertedPendulum-v5": inverted_pendulum,
    "MountainCarContinuous-v0": mountain_car,
    "InvertedDoublePendulum-v5": inverted_double_pendulum,
    "Reacher-v5": reacher,
    "Swimmer-v5": swimmer,
    "Hopper-v5": hopper,
    "HalfCheetah-v5": half_cheetah,
    "Pusher-v5": pusher,
}

"""The world model's data: the features it reads, the targets it learns, and
the checks and the seeded train/validation split applied to replay
trajectories before training; and `DynamicsMLP`, the single network the
world model was before the ensemble (`infrastructure.ensemble`)."""

from __future__ import annotations

import hashlib
import numbers
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from torch import nn

from genesis_fp16.training.checkpoint import generator_state_problem
from genesis_fp16.base.seeds import numpy_rng

from .trajectory import FLOAT_FIELDS, Trajectory, non_finite_field

ProjectFn = Callable[[torch.Tensor], torch.Tensor]
TerminationFn = Callable[[torch.Tensor], torch.Tensor]  # observations (..., obs_dim) -> bool (...)


class NonFiniteDataError(ValueError):
    """`WorldModel.train` refused a trajectory holding NaN or inf in its
    observations, actions, rewards or next observations.

    The message names the trajectory (its replay-buffer id, candidate, agent
    and generation), the array and the first bad transition. Nothing was
    trained. A trajectory read from a replay buffer is removed with
    `ReplayBuffer.delete_trajectories([id])`, which the message spells out.
    """


class NotTrainedError(RuntimeError):
    """`WorldModel.predict`, `observed_region`, `model_env` or `rollouts` (or a
    `ModelEnv` on the model) was called before the first `await train()` or `load()`."""


def features(obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """The model's raw inputs: observation and action, nothing else. Training
    and prediction both go through this function (and then the same
    normaliser inside `DynamicsMLP`)."""
    return torch.cat([obs, action], dim=-1)


def targets(
    obs: torch.Tensor, next_obs: torch.Tensor, reward: torch.Tensor, done: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """What the model learns to predict: the observation delta and the reward,
    and whether the env terminated (0/1) for a model with a done head."""
    parts = [next_obs - obs, reward.reshape(*obs.shape[:-1], 1)]
    if done is not None:
        parts.append(done.reshape(*obs.shape[:-1], 1).float())
    return torch.cat(parts, dim=-1)


class DynamicsMLP(nn.Module):
    """One MLP on normalised features, the world model before the ensemble:
    ``scripts/canary_threshold.py`` trains it, and `WorldModel.load` names its
    checkpoints when refusing them. The normaliser statistics are buffers, so
    they travel with every checkpoint. With ``done_head`` a last output is the
    logit of termination (its target is 0/1, never normalised)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int = 64, done_head: bool = False) -> None:
        super().__init__()
        self.obs_dim, self.act_dim, self.done_head = obs_dim, act_dim, done_head
        n_in, n_out = obs_dim + act_dim, obs_dim + 1 + int(done_head)
        self.net = nn.Sequential(
            nn.Linear(n_in, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, n_out)
        )
        self.register_buffer("x_mean", torch.zeros(n_in))
        self.register_buffer("x_std", torch.ones(n_in))
        self.register_buffer("y_mean", torch.zeros(n_out))
        self.register_buffer("y_std", torch.ones(n_out))

    def fit_normaliser(self, x: torch.Tensor, y: torch.Tensor) -> None:
        with torch.no_grad():
            self.x_mean.copy_(x.mean(0))
            self.x_std.copy_(x.std(0).clamp_min(1e-6))
            self.y_mean.copy_(y.mean(0))
            self.y_std.copy_(y.std(0).clamp_min(1e-6))
            if self.done_head:  # the done logit is learned as is
                self.y_mean[-1], self.y_std[-1] = 0.0, 1.0

    def forward(self, x_norm: torch.Tensor) -> torch.Tensor:
        return self.net(x_norm)

    def normalise_x(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.x_mean) / self.x_std

    def normalise_y(self, y: torch.Tensor) -> torch.Tensor:
        return (y - self.y_mean) / self.y_std

    def predict_raw(self, x: torch.Tensor) -> torch.Tensor:
        """Un-normalised prediction (delta obs, reward[, done logit]) for raw features."""
        return self.net(self.normalise_x(x)).float() * self.y_std + self.y_mean

    def predict_next(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(next_obs, reward) for batches of raw observations and actions, in FP32."""
        self.eval()
        with torch.no_grad():
            out = self.predict_raw(features(obs, action))
        return obs + out[..., : self.obs_dim], out[..., self.obs_dim]

    def observed_region(self, spread: float = 4.0) -> tuple[torch.Tensor, torch.Tensor]:
        """(low, high) per observation dimension: the normaliser's mean -/+
        ``spread`` standard deviations, where predictions rest on data."""
        mean, std = self.x_mean[: self.obs_dim].float(), self.x_std[: self.obs_dim].float()
        return mean - spread * std, mean + spread * std


def mse_loss(model: DynamicsMLP, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Squared error of the normalised delta and reward; with a done head,
    plus the binary cross-entropy of the termination logit."""
    x, y = batch
    out = model(x).float()  # loss in float32, as the AMP docs advise
    if not model.done_head:
        return ((out - y) ** 2).mean()
    mse = ((out[:, :-1] - y[:, :-1]) ** 2).mean()
    return mse + nn.functional.binary_cross_entropy_with_logits(out[:, -1], y[:, -1])


def check_finite(trajectories: Sequence[Trajectory]) -> None:
    """Raise `NonFiniteDataError` for the first trajectory holding NaN or inf.
    The replay buffer refuses such rows since it checks on append; this still
    catches a database written before, and trajectories changed after they were made."""
    for traj in trajectories:
        found = non_finite_field({name: getattr(traj, name) for name in FLOAT_FIELDS})
        if found is not None:
            name, bad = found
            remedy = (
                f"remove it with ReplayBuffer.delete_trajectories([{traj.id}]) and fix its source"
                if traj.id is not None  # it came from a replay buffer
                else "fix its source, or leave it out of trajectories="
            )
            raise NonFiniteDataError(
                f"{traj.label}: non-finite {name} at transition {bad}; refusing to train on it: {remedy}"
            )


def check_sizes(trajectories: Sequence[Trajectory], obs_dim: int, act_dim: int) -> None:
    """Every trajectory matches a model built for ``obs_dim`` and ``act_dim``,
    and there are at least 2 transitions (one to train on, one to validate)."""
    built = (obs_dim, act_dim)
    for traj in trajectories:
        got = (traj.obs.shape[1], traj.action.shape[1])
        if got != built:
            what, size = ("observations", got[0]) if got[0] != built[0] else ("actions", got[1])
            raise ValueError(
                f"WorldModel.train: {traj.label} has {what} of size {size}, but this model was built for "
                f"obs_dim={built[0]}, act_dim={built[1]}; train it on its own environment's trajectories, "
                f"or build a WorldModel({got[0]}, {got[1]}) for this one"
            )
    total = sum(len(traj.obs) for traj in trajectories)
    if total < 2:
        raise ValueError(
            f"WorldModel.train: only {total} transition in all: expected at least 2 "
            "(one to train on, one to validate); collect more data first"
        )


def check_options(batch_size: int, val_fraction: float) -> None:
    """Refuse training options that would fail inside torch or give a NaN loss."""
    problems = []
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        problems.append(f"batch_size={batch_size!r}: expected at least 1 transition per optimizer step (e.g. 256)")
    if not 0.0 < val_fraction < 1.0:  # NaN fails too
        problems.append(
            f"val_fraction={val_fraction!r}: expected a fraction strictly between 0 and 1 "
            "(the share of transitions held out for the validation loss; e.g. 0.1)"
        )
    if problems:
        raise ValueError("WorldModel: " + "; ".join(problems))


def check_checkpoint_extra(extra: dict) -> None:
    """A world-model checkpoint's own fields (``trained``, ``sampler_state``) are
    usable, checked before a load changes anything (`FP16Trainer.load_checkpoint`'s ``check_extra``)."""
    if not isinstance(extra.get("trained", True), bool):
        raise TypeError(f"field extra.trained: {extra['trained']!r:.60}, expected True or False")
    state = extra.get("sampler_state")
    problem = None if state is None else generator_state_problem(state)
    if problem:
        raise TypeError(f"field extra.sampler_state: {problem}")


def data_key(traj: Trajectory) -> int:
    """A 64-bit key from the trajectory's own transitions (BLAKE2b of the
    little-endian float32 arrays): the same in every process and state dir,
    whatever row id or name the trajectory has. Episodes from different start
    states, or of different candidates, differ in their data and so in their key."""
    digest = hashlib.blake2b(digest_size=8)
    for name in ("obs", "action", "reward", "next_obs"):
        digest.update(np.ascontiguousarray(getattr(traj, name), dtype="<f4").tobytes())
    return int.from_bytes(digest.digest(), "little")


def validation_draws(key: int, length: int, seed: int) -> np.ndarray:
    """One uniform draw per transition from the stream ``dynamics.validation_split`` of (seed, key);
    a transition validates when its draw is under the validation fraction, so
    it stays on its side in every later training run."""
    return numpy_rng(seed, "dynamics.validation_split", key).random(length)


def training_data(
    trajectories: Sequence[Trajectory], *, seed: int, val_fraction: float, done: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Features and targets, split into train/validation by
    `validation_draws`: ``(x_train, y_train, x_val, y_val)``.
    Trajectories are put in a canonical order first (generation, then data
    key), so the data set and the batches drawn from it depend on the
    trajectories alone: not on row ids, the order the buffer returned them
    in, or what else the state dir holds. ``done``: the targets end with the
    termination flag (a model with a done head)."""
    check_finite(trajectories)
    keyed = sorted(((traj.generation, data_key(traj), k) for k, traj in enumerate(trajectories)))
    xs, ys, draws = [], [], []
    for _, key, k in keyed:
        traj = trajectories[k]
        obs, act = (
            torch.from_numpy(np.array(traj.obs, dtype=np.float32)),
            torch.from_numpy(np.array(traj.action, dtype=np.float32)),
        )
        nxt, rew = (
            torch.from_numpy(np.array(traj.next_obs, dtype=np.float32)),
            torch.from_numpy(np.array(traj.reward, dtype=np.float32)),
        )
        xs.append(features(obs, act))
        ys.append(targets(obs, nxt, rew, torch.from_numpy(np.array(traj.done, dtype=np.float32)) if done else None))
        draws.append(validation_draws(key, len(traj.obs), seed))
    x, y, u = torch.cat(xs).float(), torch.cat(ys).float(), np.concatenate(draws)
    val = u < val_fraction
    if not 0 < val.sum() < len(val):
        # too few transitions for the fraction to land on both sides: the k lowest draws validate
        k = min(max(1, round(len(val) * val_fraction)), len(val) - 1)
        val = np.zeros(len(val), dtype=bool)
        val[np.argsort(u, kind="stable")[:k]] = True
    val_t = torch.from_numpy(val)
    return x[~val_t], y[~val_t], x[val_t], y[val_t]

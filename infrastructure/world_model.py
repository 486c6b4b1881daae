"""An async, learned dynamics model: (observation, action) ->
(next-observation delta, reward), a probabilistic ensemble
(`infrastructure.ensemble`) on a chosen device; `WorldModel` says how it
trains (`infrastructure.world_model_training` does a call's work), and
`infrastructure.model_env` how it rolls out: short rollouts branched from
real states, whose transitions train a critic (MBPO)."""

from __future__ import annotations

import asyncio
import numbers
from functools import partial
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
import numpy.typing as npt
import torch

from genesis_fp16.device import DeviceArg
from genesis_fp16.window import fused_adam
from genesis_fp16.guarded import DEFAULT_GUARD, UNGUARDED, Guard, GuardChoice, GuardedTraining, Verdict
from genesis_fp16.seeds import torch_generator
from genesis_fp16.settings import Settings
from genesis_fp16.threads import torch_threads

from .dynamics import NonFiniteDataError, NotTrainedError, ProjectFn, TerminationFn, check_options, check_sizes, features, training_data
from .ensemble import EnsembleDynamics, ensemble_loss, sample_batch
from .model_env import ModelEnv, RolloutPolicy, Rollouts, branched_rollouts
from .replay_buffer import ReplayBuffer
from .trajectory import Trajectory
from .world_model_training import restore, train_sync
from .world_model_types import GuardedLearner, ShadowGapLedger, TrainReport

__all__ = ["EnsembleDynamics", "Guard", "ModelEnv", "NonFiniteDataError", "NotTrainedError", "Rollouts", "ShadowGapLedger",
           "TrainReport", "UNGUARDED", "Verdict", "WorldModel", "features"]

# The default size, by scripts/bench_world_model.py: from 128 hidden units
# up, BF16 trains a 5-member ensemble faster than FP32 (1.3-1.45x on an
# AVX512-BF16 CPU without AMX, one thread), at 64 it does not (0.8-1.0x);
# larger sizes cost the model's rollouts more than they save in training.
DEFAULT_ENSEMBLE = 5
DEFAULT_HIDDEN = 128
DEFAULT_LAYERS = 2


class WorldModel(GuardedLearner):
    """Learned dynamics for one environment: (observation, action) ->
    (next-observation delta, reward[, termination]).

    * A probabilistic ensemble (`EnsembleDynamics`, PETS-style): ``ensemble``
      members as batched weights, each trained on its own bootstrap of the
      data by the Gaussian negative log-likelihood; the ``elites`` best by
      validation loss predict and roll out (`model_env`, `rollouts`: short
      rollouts from real states, each step through an elite drawn at random,
      a row cut where the members disagree).
      ``ensemble=1, probabilistic=False`` is one deterministic network trained
      by squared error, for comparison.
    * The label never enters the inputs: training and prediction both call
      `features` (observation and action only).
    * It trains, validates and rolls out on ``device`` (and so do its FP32
      shadow and canary, copies of it); the data moves there once per
      `train()` call.
    * `await train()` runs in a worker thread (torch releases the GIL in its
      kernels, so the event loop keeps running); concurrent calls are
      serialised by an `asyncio.Lock`.
    * It trains under its rollout policy through
      `genesis_fp16.guarded.GuardedTraining`: the precision follows settings,
      the agent's profile and the rollout ledger; a `RollbackGuard` watches it
      by default and a rollback restores the last good checkpoint in FP32; an
      FP32 reference trains beside it in stage `shadow` (all along) and `on`
      (the canary, every `guard.canary_every`-th call).

    Args:
        obs_dim: observation size.
        act_dim: action size.
        buffer: where `train()` reads `data_agent`'s trajectories from.
        agent: the name the precision policy is resolved for (settings, profile, ledger).
        guard: the rollback guard; left out, `RollbackGuard(agent)`.
            `guard=UNGUARDED` (from `genesis_fp16.guarded`) trains without one:
            no rollback, no canary.
        precision: asks for a precision instead of settings and profile.
        device: where the model lives: ``auto`` (CUDA when torch sees it,
            else the CPU), ``cpu``, ``cuda``, ``cuda:N`` or a `torch.device`;
            left out, the setting ``GENESIS_FP16_DEVICE``. A device that is not
            there follows ``GENESIS_FP16_ON_UNSUPPORTED``: ``error`` raises
            `genesis_fp16.device.DeviceUnavailableError`, ``fallback`` runs on
            the CPU and logs ``world_model.device_fallback`` with the reason.
        ensemble: members of the ensemble (1: a single network).
        elites: the members rollouts and prediction use, the best by
            validation loss after each `train()`; left out, every member.
        hidden: units per hidden layer (SiLU).
        layers: hidden layers per member.
        probabilistic: a Gaussian head (mean and soft-bounded log-variance,
            trained by negative log-likelihood); False: the mean alone, trained
            by squared error, and rollouts without sampling.
        done_head: also learn termination (a 0/1 logit) for the model's rollouts.
        lr: Adam's learning rate.
        batch_size: transitions per member per optimizer step.
        val_fraction: the share of transitions held out for validation (and elites).
        seed: the weights' initialisation, the bootstraps, the batches and the split.
        checkpoint_dir: default `<state_dir>/world_model`.
        max_transitions: the most recent transitions `train()` reads from `buffer`.
    """

    def __init__(
        self, obs_dim: int, act_dim: int, *, buffer: Optional[ReplayBuffer] = None, agent: str = "world_model",
        data_agent: str = "se_darwin", guard: Union[Guard, GuardChoice] = DEFAULT_GUARD, settings: Optional[Settings] = None,
        precision: Optional[str] = None, device: DeviceArg = None, ensemble: int = DEFAULT_ENSEMBLE, elites: Optional[int] = None,
        hidden: int = DEFAULT_HIDDEN, layers: int = DEFAULT_LAYERS, probabilistic: bool = True, done_head: bool = False,
        lr: float = 1e-3, batch_size: int = 256, val_fraction: float = 0.1, seed: int = 0,
        checkpoint_dir: Union[str, Path, None] = None, max_transitions: Optional[int] = 50_000,
    ) -> None:
        check_options(batch_size, val_fraction)
        self._set_up_agent("world_model", agent, settings=settings, device=device, guard=guard, precision=precision)
        self.buffer = buffer
        self.data_agent = data_agent
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.seed = seed
        self.lr = lr
        self.max_transitions = max_transitions
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else Path(self.settings.state_dir) / "world_model"
        self.model = EnsembleDynamics(
            obs_dim, act_dim, ensemble=ensemble, elites=elites, hidden=hidden, layers=layers, probabilistic=probabilistic, done_head=done_head,
            generator=torch_generator(seed, "world_model.init"),
        ).to(self.device)
        self.optimizer = fused_adam(self.model.parameters(), lr, self.device)  # a window skips a step on the device
        self.trained = False
        self._training: Optional[GuardedTraining] = None
        self._lock = asyncio.Lock()
        self._generator = torch_generator(seed, "world_model.batches")  # on the CPU: the same draws on every device
        self.history: list[TrainReport] = []

    # -- trainer --------------------------------------------------------------
    @property
    def training(self) -> GuardedTraining:
        """The `GuardedTraining` this model trains through (built on first use)."""
        if self._training is None:
            self._training = GuardedTraining(
                self.agent, self.model, self.optimizer, settings=self.settings, precision=self.requested_precision,
                guard=self.guard if self.guard is not None else UNGUARDED, checkpoint_dir=self.checkpoint_dir,
                good_name=f"{self.agent}.initial.pt", checkpoint_every=0, save=self.save,
                sample=(sample_batch(self.model, self.batch_size, self.device), ensemble_loss),  # for a measured auto
                decision=self._reused_decision,  # a resumed run's: never decided again
            )
        return self._training


    def _dataset(self, trajectories: Sequence[Trajectory]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(x_train, y_train, x_val, y_val)``; see `infrastructure.dynamics.training_data`."""
        return training_data(trajectories, seed=self.seed, val_fraction=self.val_fraction, done=self.model.done_head)

    # -- checkpoints ------------------------------------------------------------
    @property
    def checkpoint_path(self) -> Path:
        """Where `save()` and `load()` go without a path: `<checkpoint_dir>/<agent>.pt`."""
        return self.checkpoint_dir / f"{self.agent}.pt"

    def save(self, path: Union[str, Path, None] = None) -> Path:
        """Write weights, normaliser, reward range, elites, optimizer and
        scaler state atomically to `path` (default `checkpoint_path`); returns
        the path written."""
        # the batch sampler's state too, so a loaded model trains on as this one would
        extra = {"trained": self.trained, "agent": self.agent, "sampler_state": self._generator.get_state(),
                 "architecture": self.model.spec.as_dict()}
        return self.training.trainer.save_checkpoint(path or self.checkpoint_path, extra=extra)

    def load(self, path: Union[str, Path, None] = None) -> Path:
        """Restore what `save()` wrote to `path` (default `checkpoint_path`,
        read with `weights_only=True` onto this model's device, whichever
        device saved it); the model then predicts, rolls out and trains on
        from it. Returns the path read; raises `CheckpointError` for a
        missing, unreadable or corrupt file or one of another model (another
        architecture, or the single network of earlier versions), and then
        nothing (weights, optimizer, sampler, `trained`) has changed."""
        path = Path(path or self.checkpoint_path)
        restore(self, path)
        return path

    # -- training ---------------------------------------------------------------
    async def train(
        self,
        steps: int = 800,
        *,
        trajectories: Optional[Sequence[Trajectory]] = None,
        save: bool = True,
    ) -> TrainReport:
        """Train for `steps` optimizer steps on the replay buffer's data (or on
        `trajectories`) in a worker thread; returns a `TrainReport`. Bad input
        (`steps < 1`, sizes that do not fit the model, fewer than 2 transitions)
        raises `ValueError`, NaN or inf data `NonFiniteDataError`, before anything
        is trained or written. `save` writes a checkpoint at the end of the call
        (recorded as good with a guard, when the run was healthy)."""
        if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 1:
            raise ValueError(f"WorldModel.train: steps={steps!r}: expected a positive number of optimizer steps (e.g. 800)")
        check_options(self.batch_size, self.val_fraction)
        async with self._lock:
            if trajectories is None:
                if self.buffer is None:
                    raise ValueError("WorldModel.train: no replay buffer and no trajectories given")
                trajectories = await self.buffer.asample(self.data_agent, max_transitions=self.max_transitions)
            if not trajectories:
                raise ValueError(f"WorldModel.train: no trajectories for agent {self.data_agent!r} in the replay buffer")
            trajectories = list(trajectories)
            check_sizes(trajectories, self.model.obs_dim, self.model.act_dim)
            with torch_threads(self.settings.torch_threads):  # process-wide, so it holds in the worker thread too
                report = await asyncio.to_thread(self._train_sync, trajectories, int(steps), save)
            self.history.append(report)
            return report

    def _train_sync(self, trajectories: list[Trajectory], steps: int, save: bool) -> TrainReport:
        report = train_sync(self, trajectories, steps, save)
        self._log.info("world_model.trained", **report.log_fields())
        return report

    # -- prediction -------------------------------------------------------------------
    def _require_trained(self) -> None:
        if not self.trained:
            raise NotTrainedError("WorldModel: call `await train()` (or load a checkpoint) before predict or a rollout")

    def predict_sync(self, obs: npt.ArrayLike, action: npt.ArrayLike) -> tuple[torch.Tensor, torch.Tensor]:
        """`(next_obs, reward)` for observations `(N, obs_dim)` and actions
        `(N, act_dim)`: the elites' mean prediction, FP32 tensors on the CPU;
        `NotTrainedError` before training."""
        self._require_trained()
        obs_t, act_t = (torch.as_tensor(np.asarray(v), dtype=torch.float32, device=self.device) for v in (obs, action))
        next_obs, reward = self.model.predict_next(obs_t, act_t)
        return next_obs.cpu(), reward.cpu()

    async def predict(self, obs: npt.ArrayLike, action: npt.ArrayLike) -> tuple[torch.Tensor, torch.Tensor]:
        """`(next_obs, reward)`, FP32 tensors `(N, obs_dim)` and `(N,)`, for
        observations `(N, obs_dim)` and actions `(N, act_dim)`: `predict_sync`
        in a worker thread, after any running `train()`. Raises
        `NotTrainedError` before the first `train()` or `load()`."""
        async with self._lock:
            return await asyncio.to_thread(self.predict_sync, obs, action)

    def observed_region(self, spread: float = 4.0) -> tuple[torch.Tensor, torch.Tensor]:
        """(low, high) per observation dimension, on the CPU: the training
        data's mean -/+ ``spread`` standard deviations (the normaliser's
        statistics), the region where the model's predictions rest on data.
        A rollout's ``project`` may clamp into it where the observation space is unbounded."""
        self._require_trained()
        low, high = self.model.observed_region(spread)
        return low.cpu(), high.cpu()

    # -- rollouts ----------------------------------------------------------------------
    def model_env(
        self, *, terminated: Optional[TerminationFn] = None, project: Optional[ProjectFn] = None, seed: int = 0,
        max_disagreement: Optional[float] = None,
    ) -> ModelEnv:
        """A `ModelEnv` stepping rows through this model (see
        `infrastructure.model_env`); `NotTrainedError` before training. It
        does not take the model's lock: step it while no `train()` runs."""
        self._require_trained()
        return ModelEnv(self, terminated=terminated, project=project, seed=seed, max_disagreement=max_disagreement)

    async def rollouts(
        self, policy: RolloutPolicy, start_obs: npt.ArrayLike, horizon: int, *, terminated: Optional[TerminationFn] = None,
        project: Optional[ProjectFn] = None, seed: int = 0, max_disagreement: Optional[float] = None,
    ) -> Rollouts:
        """`branched_rollouts` of ``policy`` from the real states ``start_obs
        (N, obs_dim)``, ``horizon`` steps at most, in a worker thread after any
        running `train()`: the transitions (on the model's device) and their
        `RolloutStats`. The same ``seed``, the same draws: pass a fresh one per
        call (e.g. the round) for fresh ones. `NotTrainedError` before training."""
        self._require_trained()
        run = partial(branched_rollouts, self, policy, start_obs, horizon, terminated=terminated, project=project, seed=seed,
                      max_disagreement=max_disagreement)
        async with self._lock:
            with torch_threads(self.settings.torch_threads):  # as train() does: process-wide, so it holds in the worker thread
                return await asyncio.to_thread(run)

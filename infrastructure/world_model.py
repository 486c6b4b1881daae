"""An async, learned dynamics model: (observation, action) ->
(next-observation delta, reward), a probabilistic ensemble
(`infrastructure.ensemble`) on a chosen device, trained as a guarded agent of
its own (`infrastructure.learner`); `infrastructure.model_env` says how it
rolls out: short rollouts branched from real states, whose transitions train a
critic (MBPO). The model, its training and its model env are three things, as
in mbrl-lib: `EnsembleDynamics`, `WorldModel`, `ModelEnv`."""

from __future__ import annotations

import asyncio
import contextlib
import math
import numbers
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt
import torch

from genesis_fp16.base.device import DeviceArg
from genesis_fp16.base.seeds import torch_generator
from genesis_fp16.base.settings import Settings
from genesis_fp16.base.threads import torch_threads
from genesis_fp16.precision.decision import PrecisionDecision
from genesis_fp16.precision.request import PrecisionRequest
from genesis_fp16.training.guarded import (
    DEFAULT_GUARD,
    UNGUARDED,
    CallReport,
    Guard,
    GuardChoice,
    QualityLedger,
    Verdict,
)
from genesis_fp16.training.trainer import FP16Trainer, fused_adam

from .dynamics import (
    NonFiniteDataError,
    NotTrainedError,
    ProjectFn,
    TerminationFn,
    check_checkpoint_extra,
    check_options,
    check_sizes,
    features,
    training_data,
)
from .ensemble import (
    EnsembleDynamics,
    batch_rows,
    bootstrap,
    check_architecture,
    ensemble_loss,
    member_losses,
    sample_batch,
)
from .learner import GuardedCallReport, GuardedLearner, StepFn
from .model_env import ModelEnv, RolloutPolicy, Rollouts, branched_rollouts
from .replay_buffer import ReplayBuffer
from .trajectory import Trajectory

__all__ = [
    "EnsembleDynamics",
    "Guard",
    "ModelEnv",
    "NonFiniteDataError",
    "NotTrainedError",
    "Rollouts",
    "ShadowGapLedger",
    "TrainReport",
    "UNGUARDED",
    "Verdict",
    "WorldModel",
    "features",
    "inference_gap_of",
    "val_loss_of",
]

ShadowGapLedger = QualityLedger
"""Where shadow-stage measurements go (``genesis_fp16.rollout.ledger.RolloutLedger``)."""

# The default size, by scripts/bench_world_model.py: from 128 hidden units
# up, BF16 trains a 5-member ensemble faster than FP32 (1.3-1.45x on an
# AVX512-BF16 CPU without AMX, one thread), at 64 it does not (0.8-1.0x);
# larger sizes cost the model's rollouts more than they save in training.
DEFAULT_ENSEMBLE = 5
DEFAULT_HIDDEN = 128
DEFAULT_LAYERS = 2


@dataclass
class TrainReport(GuardedCallReport):
    """What one ``WorldModel.train()`` call did.

    ``train_loss`` / ``val_loss``: the last training loss and the validation
    loss (under the trainer's autocast); ``precision``: what ran; ``steps`` /
    ``skipped_steps``: optimizer steps and how many were skipped;
    ``transitions`` / ``trajectories``: the data used. ``fp32_val_loss``,
    ``shadow_gap`` and ``reference`` (``shadow`` or ``canary``) are set when an
    FP32 reference was measured; ``inference_val_loss_fp32`` and
    ``inference_gap`` compare the same weights without autocast.
    ``rollback`` (the verdict of the first rollback; ``rolled_back`` and
    ``rollback_reason`` read it), ``checkpoint`` (restored or saved) and
    ``guard_decision`` (the guard's verdict at the end) say what the guard did; ``events`` lists the events the
    call logged. ``device`` is where it trained; ``member_val_loss`` each
    member's FP32 validation loss and ``elites`` the members chosen by it,
    best first.
    """

    train_loss: float
    val_loss: float
    precision: str
    steps: int
    skipped_steps: int
    wall_s: float
    transitions: int
    trajectories: int
    fp32_val_loss: Optional[float] = None
    shadow_gap: Optional[float] = None  # (val_loss - fp32_val_loss) / fp32_val_loss, from the shadow or the canary
    reference: Optional[str] = None  # where fp32_val_loss comes from: "shadow", "canary" or None (no FP32 reference)
    inference_val_loss_fp32: Optional[float] = None  # val loss of the same weights without autocast
    inference_gap: Optional[float] = None  # (val_loss - inference_val_loss_fp32) / inference_val_loss_fp32
    rollback: Optional[Verdict] = None
    checkpoint: Optional[str] = None
    guard_decision: Optional[Verdict] = None
    events: list[str] = field(default_factory=list)
    device: Optional[str] = None  # where the model trained (cpu, cuda:0, ...)
    member_val_loss: Optional[list[float]] = None  # each member's FP32 validation loss, in member order
    elites: Optional[list[int]] = None  # the members rollouts and prediction use, best first
    precision_decision: Optional[dict[str, Any]] = None  # precision, source, reason (genesis_fp16.precision.decision)

    def log_fields(self) -> dict[str, Any]:
        """The fields of the ``world_model.trained`` event."""
        names = (
            "train_loss",
            "val_loss",
            "precision",
            "steps",
            "skipped_steps",
            "wall_s",
            "transitions",
            "fp32_val_loss",
            "reference",
            "inference_val_loss_fp32",
            "inference_gap",
            "rolled_back",
            "device",
            "elites",
        )
        fields = {name: getattr(self, name) for name in names}
        fields["wall_s"] = round(self.wall_s, 3)
        if self.precision_decision is not None:
            fields["precision_source"] = self.precision_decision["source"]
            fields["precision_reason"] = self.precision_decision["reason"]
        return fields


def val_loss_of(
    model: EnsembleDynamics, trainer: FP16Trainer, x: torch.Tensor, y: torch.Tensor, *, autocast: bool = True
) -> float:
    """Validation loss of ``model`` on raw ``(x, y)`` (on the model's device),
    under ``trainer``'s autocast unless ``autocast`` is False: the mean over
    all members (not only the elites, so that a model and its FP32 reference
    are compared on the same thing) of each member's squared error of its
    normalised mean, plus the done head's cross-entropy (`member_losses`)."""
    model.eval()
    with torch.no_grad(), trainer.autocast() if autocast else contextlib.nullcontext():
        return float(member_losses(model, model.normalise_x(x), model.normalise_y(y)).mean())


def inference_gap_of(
    model: EnsembleDynamics, trainer: FP16Trainer, val_loss: float, x: torch.Tensor, y: torch.Tensor
) -> tuple[float, Optional[float]]:
    """The inference-side precision gap of the current weights: their
    validation loss without autocast, and ``(val_loss - that) / that`` (None
    when undefined; 0 for FP32, which has no autocast). One forward over the
    validation set: cheap enough for every call."""
    if trainer.precision.name == "fp32":
        return val_loss, 0.0
    fp32_eval = val_loss_of(model, trainer, x, y, autocast=False)
    gap = (val_loss - fp32_eval) / fp32_eval if fp32_eval > 0 and math.isfinite(val_loss) else None
    return fp32_eval, gap


def on_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``; to CUDA from pinned host memory, so the copy runs asynchronously."""
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


@dataclass
class _CallData:
    """One `train()` call's data on the model's device, moved there once per call."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor


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
      `genesis_fp16.training.guarded.GuardedTraining`: the precision follows settings,
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
            `guard=UNGUARDED` (from `genesis_fp16.training.guarded`) trains without one:
            no rollback, no canary.
        precision: asks for a precision instead of settings and profile.
        device: where the model lives: ``auto`` (CUDA when torch sees it,
            else the CPU), ``cpu``, ``cuda``, ``cuda:N`` or a `torch.device`;
            left out, the setting ``GENESIS_FP16_DEVICE``. A device that is not
            there follows ``GENESIS_FP16_ON_UNSUPPORTED``: ``error`` raises
            `genesis_fp16.base.device.DeviceUnavailableError`, ``fallback`` runs on
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

    report = TrainReport

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        *,
        buffer: Optional[ReplayBuffer] = None,
        agent: str = "world_model",
        data_agent: str = "se_darwin",
        guard: Union[Guard, GuardChoice] = DEFAULT_GUARD,
        settings: Optional[Settings] = None,
        precision: Union[PrecisionRequest, str, None] = None,
        device: DeviceArg = None,
        ensemble: int = DEFAULT_ENSEMBLE,
        elites: Optional[int] = None,
        hidden: int = DEFAULT_HIDDEN,
        layers: int = DEFAULT_LAYERS,
        probabilistic: bool = True,
        done_head: bool = False,
        lr: float = 1e-3,
        batch_size: int = 256,
        val_fraction: float = 0.1,
        seed: int = 0,
        checkpoint_dir: Union[str, Path, None] = None,
        max_transitions: Optional[int] = 50_000,
        decision: Optional[PrecisionDecision] = None,
    ) -> None:
        check_options(batch_size, val_fraction)
        super().__init__(
            "world_model", agent, settings=settings, device=device, guard=guard, precision=precision, decision=decision
        )
        self.buffer = buffer
        self.data_agent = data_agent
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.seed = seed
        self.lr = lr
        self.max_transitions = max_transitions
        self.model = EnsembleDynamics(
            obs_dim,
            act_dim,
            ensemble=ensemble,
            elites=elites,
            hidden=hidden,
            layers=layers,
            probabilistic=probabilistic,
            done_head=done_head,
            generator=torch_generator(seed, "world_model.init"),
        ).to(self.device)
        self.optimizer = fused_adam(self.model.parameters(), lr, self.device)  # a window skips a step on the device
        self._generator = torch_generator(seed, "world_model.batches")  # on the CPU: the same draws on every device
        self._data: Optional[_CallData] = None
        self._train_through(
            self.model,
            self.optimizer,
            checkpoint_dir=checkpoint_dir,
            sample=(sample_batch(self.model, self.batch_size, self.device), ensemble_loss),
        )  # a measured auto

    def _dataset(
        self, trajectories: Sequence[Trajectory]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(x_train, y_train, x_val, y_val)``; see `infrastructure.dynamics.training_data`."""
        return training_data(trajectories, seed=self.seed, val_fraction=self.val_fraction, done=self.model.done_head)

    # -- checkpoints: the learner's, with the sampler and the architecture ---------------------------
    def checkpoint_extra(self) -> dict[str, Any]:
        """The batch sampler's state too, so a loaded model trains on as this one would; and the architecture."""
        return {
            **super().checkpoint_extra(),
            "sampler_state": self._generator.get_state(),
            "architecture": self.model.spec.as_dict(),
        }

    def check_checkpoint(self, payload: dict[str, Any], source: str) -> None:
        """Another architecture (or the single network of earlier versions) is refused before anything changes."""
        check_architecture(payload, self.model.spec, source)

    check_extra = staticmethod(check_checkpoint_extra)

    def restored(self, extra: dict[str, Any]) -> None:
        self.trained = extra.get("trained", True)
        if extra.get("sampler_state") is not None:
            self._generator.set_state(extra["sampler_state"].cpu())

    # -- training ---------------------------------------------------------------
    async def train(
        self,
        steps: int = 800,
        *,
        trajectories: Optional[Sequence[Trajectory]] = None,
        save: bool = True,
        on_step: Optional[StepFn] = None,
    ) -> TrainReport:
        """Train for `steps` optimizer steps on the replay buffer's data (or on
        `trajectories`) in a worker thread; returns a `TrainReport`. Bad input
        (`steps < 1`, sizes that do not fit the model, fewer than 2 transitions)
        raises `ValueError`, NaN or inf data `NonFiniteDataError`, before anything
        is trained or written. `save` writes a checkpoint at the end of the call
        (recorded as good with a guard, when the run was healthy). ``on_step(done)`` is told the steps done after
        each one (a caller's progress)."""
        if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 1:
            raise ValueError(
                f"WorldModel.train: steps={steps!r}: expected a positive number of optimizer steps (e.g. 800)"
            )
        check_options(self.batch_size, self.val_fraction)
        async with self._lock:
            if trajectories is None:
                if self.buffer is None:
                    raise ValueError("WorldModel.train: no replay buffer and no trajectories given")
                trajectories = await self.buffer.asample(self.data_agent, max_transitions=self.max_transitions)
            if not trajectories:
                raise ValueError(
                    f"WorldModel.train: no trajectories for agent {self.data_agent!r} in the replay buffer"
                )
            trajectories = list(trajectories)
            check_sizes(trajectories, self.model.obs_dim, self.model.act_dim)
            return await self._train_in_thread(self._train_sync, trajectories, int(steps), save, on_step=on_step)

    def _train_sync(self, trajectories: list[Trajectory], steps: int, save: bool) -> TrainReport:
        """``steps`` optimizer steps on ``trajectories`` (checked by the caller), then the validation, the elites,
        the checkpoint and the report."""
        started = time.perf_counter()
        data = _CallData(*(on_device(t, self.device) for t in self._dataset(trajectories)))  # once per call
        self._data = data
        try:
            report = self._guarded_call(
                started, steps, save, transitions=len(data.x_train) + len(data.x_val), trajectories=len(trajectories)
            )
        finally:
            self._data = None
        self._log.info("world_model.trained", **report.log_fields())
        return report

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        return ensemble_loss(model, batch)

    def prepare(self, model: torch.nn.Module) -> None:
        """The normaliser fitted to this call's data, on the model, its FP32 reference and restored weights alike."""
        assert self._data is not None
        model.fit_normaliser(self._data.x_train, self._data.y_train)

    def batches(self, steps: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Each member on its own bootstrap of this call's data (one network: the data as it is); the indices come
        from the CPU generator, so every device draws the same batches."""
        assert self._data is not None
        model = self.model
        xn_tr, yn_tr = model.normalise_x(self._data.x_train), model.normalise_y(self._data.y_train)
        n, members = len(xn_tr), model.members
        boot = bootstrap(n, members, self._generator)
        rows = (
            batch_rows(boot, n, members, self.batch_size, self._generator).to(self.device, non_blocking=True)
            for _ in range(steps)
        )
        return ((xn_tr[r], yn_tr[r]) for r in rows)

    def validation(self) -> Any:
        assert self._data is not None
        return partial(val_loss_of, x=self._data.x_val, y=self._data.y_val)

    def after_call(self, call: CallReport) -> dict[str, Any]:
        """The inference gap (recorded where the canaries are) and the elites: the members with the lowest FP32
        validation loss."""
        assert self._data is not None
        model, trainer, val_loss = self.model, self.training.trainer, float(call.val_loss)  # type: ignore[arg-type]
        inference_fp32, inference_gap = inference_gap_of(model, trainer, val_loss, self._data.x_val, self._data.y_val)
        if self.guard is not None and trainer.precision.name != "fp32":
            gap = {"val_loss": val_loss, "fp32_val_loss": inference_fp32, "gap": inference_gap}
            self.guard.ledger.record_quality_check(self.agent, "inference_gap", gap, precision=trainer.precision.name)
        model.eval()
        with torch.no_grad():
            model.set_elites(
                member_losses(model, model.normalise_x(self._data.x_val), model.normalise_y(self._data.y_val))
            )
        return {
            "inference_val_loss_fp32": inference_fp32,
            "inference_gap": inference_gap,
            "member_val_loss": [float(v) for v in model.member_val_loss],
            "elites": model.elites,
        }

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
        self,
        *,
        terminated: Optional[TerminationFn] = None,
        project: Optional[ProjectFn] = None,
        seed: int = 0,
        max_disagreement: Optional[float] = None,
    ) -> ModelEnv:
        """A `ModelEnv` stepping rows through this model (see
        `infrastructure.model_env`); `NotTrainedError` before training. It
        does not take the model's lock: step it while no `train()` runs."""
        self._require_trained()
        return ModelEnv(self, terminated=terminated, project=project, seed=seed, max_disagreement=max_disagreement)

    async def rollouts(
        self,
        policy: RolloutPolicy,
        start_obs: npt.ArrayLike,
        horizon: int,
        *,
        terminated: Optional[TerminationFn] = None,
        project: Optional[ProjectFn] = None,
        seed: int = 0,
        max_disagreement: Optional[float] = None,
    ) -> Rollouts:
        """`branched_rollouts` of ``policy`` from the real states ``start_obs
        (N, obs_dim)``, ``horizon`` steps at most, in a worker thread after any
        running `train()`: the transitions (on the model's device) and their
        `RolloutStats`. The same ``seed``, the same draws: pass a fresh one per
        call (e.g. the round) for fresh ones. `NotTrainedError` before training."""
        self._require_trained()
        run = partial(
            branched_rollouts,
            self,
            policy,
            start_obs,
            horizon,
            terminated=terminated,
            project=project,
            seed=seed,
            max_disagreement=max_disagreement,
        )
        async with self._lock:
            with torch_threads(
                self.settings.torch_threads
            ):  # as train() does: process-wide, so it holds in the worker thread
                return await asyncio.to_thread(run)

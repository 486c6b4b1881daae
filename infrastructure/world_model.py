"""An async, learned dynamics model: (observation, action) ->
(next-observation delta, reward); `WorldModel` says how it trains."""

from __future__ import annotations

import asyncio
import math
import numbers
import time
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt
import torch

from genesis_fp16 import registry
from genesis_fp16.canary import CANARY_SUFFIX, SHADOW_SUFFIX, canary_due, fp32_reference
from genesis_fp16.policy import resolve_policy
from genesis_fp16.rollout import RolloutLedger
from genesis_fp16.settings import Settings, load_settings
from genesis_fp16.threads import torch_threads
from genesis_fp16.telemetry import get_logger
from genesis_fp16.trainer import FP16Trainer

from .dynamics import (DynamicsMLP, NonFiniteDataError, NotTrainedError, PolicyFn, ProjectFn, TerminationFn, check_options,
                       check_sizes, features, imagined_returns, mse_loss, training_data)
from .replay_buffer import ReplayBuffer
from .trajectory import Trajectory
from .world_model_types import Guard, GuardVerdict, ShadowGapLedger, TrainReport, TrainRun, inference_gap_of, val_loss_of

__all__ = ["DynamicsMLP", "Guard", "GuardVerdict", "NonFiniteDataError", "NotTrainedError", "ShadowGapLedger", "TrainReport",
           "WorldModel", "features"]

FaultFn = Callable[[int, torch.Tensor], torch.Tensor]


class WorldModel:
    """Learned dynamics for one environment: (observation, action) ->
    (next-observation delta, reward[, termination]).

    * The label never enters the inputs: training and prediction both call
      `features` (observation and action only).
    * `await train()` runs in a worker thread (torch releases the GIL in its
      kernels, so the event loop keeps running); concurrent calls are
      serialised by an `asyncio.Lock`.
    * It trains through `registry.trainer_for(agent, ...)`: the precision
      follows settings, the agent's profile and the rollout ledger. A `guard`
      (`genesis_fp16.guard.RollbackGuard`) watches each trainer; a rollback
      rebuilds it (FP32, as the ledger now says) and restores the last good
      checkpoint.
    * An FP32 reference trains beside it on the same batches: all along in
      rollout stage `shadow`, every `guard.canary_every`-th call in stage `on`
      (the canary); the guard compares the validation losses.

    Args:
        obs_dim: observation size.
        act_dim: action size.
        buffer: where `train()` reads `data_agent`'s trajectories from.
        agent: the name the precision policy is resolved for (settings, profile, ledger).
        guard: an optional rollback guard attached to each trainer.
        precision: asks for a precision instead of settings and profile.
        done_head: also learn termination (a 0/1 logit) for imagined rollouts.
        checkpoint_dir: default `<state_dir>/world_model`.
        max_transitions: the most recent transitions `train()` reads from `buffer`.
    """

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        *,
        buffer: Optional[ReplayBuffer] = None,
        agent: str = "world_model",
        data_agent: str = "se_darwin",
        guard: Optional[Guard] = None,
        settings: Optional[Settings] = None,
        precision: Optional[str] = None,
        hidden: int = 64,
        done_head: bool = False,
        lr: float = 1e-3,
        batch_size: int = 256,
        val_fraction: float = 0.1,
        seed: int = 0,
        checkpoint_dir: Union[str, Path, None] = None,
        max_transitions: Optional[int] = 50_000,
    ) -> None:
        check_options(batch_size, val_fraction)
        self.settings = settings or load_settings()
        self.buffer = buffer
        self.agent = agent
        self.data_agent = data_agent
        self.guard = guard
        self.requested_precision = precision
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.seed = seed
        self.lr = lr
        self.max_transitions = max_transitions
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else Path(self.settings.state_dir) / "world_model"
        torch.manual_seed(seed)
        self.model = DynamicsMLP(obs_dim, act_dim, hidden, done_head=done_head)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.trainer: Optional[FP16Trainer] = None
        self.trained = False
        self._lock = asyncio.Lock()
        self._handled_trip: Optional[GuardVerdict] = None
        self._shadow: Optional[tuple[DynamicsMLP, FP16Trainer]] = None
        self._on_calls = 0  # training calls in rollout stage on, in reduced precision: the canary's schedule
        self._generator = torch.Generator().manual_seed(seed)
        self._log = get_logger("infrastructure.world_model", agent=agent)
        self.history: list[TrainReport] = []

    # -- trainer --------------------------------------------------------------
    def _build_trainer(self) -> FP16Trainer:
        trainer = registry.trainer_for(self.agent, self.model, self.optimizer, settings=self.settings, precision=self.requested_precision)
        if self.guard is not None:
            self.guard.attach(trainer)
        return trainer

    def _current_trainer(self) -> FP16Trainer:
        if self.trainer is None:
            self.trainer = self._build_trainer()
        return self.trainer

    def _policy_changed(self, trainer: FP16Trainer) -> bool:
        """Whether settings, profile or ledger now resolve to another trainer
        config or rollout stage than ``trainer``'s (``trainer_for`` sets its
        ``policy``)."""
        policy = resolve_policy(self.agent, self.settings, precision=self.requested_precision)
        current = trainer.policy
        return policy.config != current.config or policy.stage != current.stage

    @property
    def precision(self) -> str:
        """The precision training runs in now (`fp32`, `bf16`, ...), as settings, profile and ledger resolve it."""
        return self._current_trainer().precision.name

    def _dataset(self, trajectories: Sequence[Trajectory]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(x_train, y_train, x_val, y_val)``; see `infrastructure.dynamics.training_data`."""
        return training_data(trajectories, seed=self.seed, val_fraction=self.val_fraction, done=self.model.done_head)

    # -- checkpoints ------------------------------------------------------------
    @property
    def checkpoint_path(self) -> Path:
        """Where `save()` and `load()` go without a path: `<checkpoint_dir>/<agent>.pt`."""
        return self.checkpoint_dir / f"{self.agent}.pt"

    def save(self, path: Union[str, Path, None] = None) -> Path:
        """Write weights, normaliser, optimizer and scaler state atomically to
        `path` (default `checkpoint_path`); returns the path written."""
        # the batch sampler's state too, so a loaded model trains on as this one would
        extra = {"trained": self.trained, "agent": self.agent, "sampler_state": self._generator.get_state()}
        return self._current_trainer().save_checkpoint(path or self.checkpoint_path, extra=extra)

    def load(self, path: Union[str, Path, None] = None) -> Path:
        """Restore what `save()` wrote to `path` (default `checkpoint_path`,
        read with `weights_only=True`); the model then predicts, imagines and
        trains on from it. Returns the path read; raises `CheckpointError`
        for a missing or unreadable file or one of another model size."""
        path = Path(path or self.checkpoint_path)
        extra = self._current_trainer().load_checkpoint(path, restore_rng=False)
        self.trained = bool(extra.get("trained", True))
        if isinstance(extra.get("sampler_state"), torch.Tensor):
            self._generator.set_state(extra["sampler_state"])
        return path

    def _owns_checkpoint(self, path: Union[str, Path, None]) -> bool:
        """Whether ``path`` is one of this model's checkpoints (in its checkpoint directory)."""
        return path is not None and Path(path).resolve().parent == self.checkpoint_dir.resolve()

    # -- training ---------------------------------------------------------------
    async def train(
        self,
        steps: int = 800,
        *,
        trajectories: Optional[Sequence[Trajectory]] = None,
        fault: Optional[FaultFn] = None,
        save: bool = True,
    ) -> TrainReport:
        """Train for `steps` optimizer steps on the replay buffer's data (or on
        `trajectories`) in a worker thread; returns a `TrainReport`. Bad input
        (`steps < 1`, sizes that do not fit the model, fewer than 2 transitions)
        raises `ValueError`, NaN or inf data `NonFiniteDataError`, before anything
        is trained or written. `fault(step, loss) -> loss` is called on each
        step's loss before the backward (a test hook: return a NaN loss to
        rehearse a storm). `save` writes a checkpoint at the end of the call
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
                report = await asyncio.to_thread(self._train_sync, trajectories, int(steps), fault, save)
            self.history.append(report)
            return report

    def _train_sync(self, trajectories: list[Trajectory], steps: int, fault: Optional[FaultFn], save: bool) -> TrainReport:
        started = time.perf_counter()
        x_tr, y_tr, x_val, y_val = self._dataset(trajectories)
        trainer = self._begin_run()
        run = TrainRun(skipped_from=trainer.skipped_steps)
        losses = self._optimise(run, x_tr, y_tr, steps, fault)
        finite = [float(v) for v in losses[-50:] if math.isfinite(float(v))]
        train_loss = float(np.mean(finite)) if finite else float("nan")
        val_loss = val_loss_of(self.model, self._current_trainer(), x_val, y_val)
        fp32_val_loss = shadow_gap = None
        if run.reference is not None:
            fp32_val_loss = val_loss_of(*run.reference, x_val, y_val)
            shadow_gap = (val_loss - fp32_val_loss) / fp32_val_loss if fp32_val_loss > 0 else None
            if run.reference_kind == "shadow":
                self._record_shadow_gap(val_loss, fp32_val_loss)  # a canary's gap the guard records
        decision = None
        if self.guard is not None:
            decision = self.guard.check(
                self._current_trainer(), val_loss=val_loss, fp32_val_loss=fp32_val_loss, reference=run.reference_kind or "shadow"
            )
            if decision.action == "rollback" and not run.rolled_back:
                self._roll_back(run, decision, self.guard)
                val_loss = val_loss_of(self.model, self._current_trainer(), x_val, y_val)  # the restored weights'
        inference_fp32, inference_gap = inference_gap_of(self.model, self._current_trainer(), val_loss, x_val, y_val)
        if self.guard is not None and self._current_trainer().precision.name != "fp32":  # recorded where the canaries are
            gap = {"val_loss": val_loss, "fp32_val_loss": inference_fp32, "gap": inference_gap}
            self.guard.ledger.record_quality_check(self.agent, "inference_gap", gap, precision=self._current_trainer().precision.name)
        self.trained = True
        checkpoint = str(self.save()) if save else None
        healthy = decision is None or decision.action != "rollback"
        if checkpoint is not None and self.guard is not None and healthy and math.isfinite(val_loss):
            self.guard.record_good_checkpoint(checkpoint)
        trainer = self._current_trainer()
        report = TrainReport(
            train_loss=train_loss,
            val_loss=val_loss,
            precision=trainer.precision.name,
            steps=steps,
            skipped_steps=run.skipped_before + trainer.skipped_steps - run.skipped_from,
            wall_s=time.perf_counter() - started,
            transitions=len(x_tr) + len(x_val),
            trajectories=len(trajectories),
            fp32_val_loss=fp32_val_loss,
            shadow_gap=shadow_gap,
            reference=run.reference_kind if fp32_val_loss is not None else None,
            inference_val_loss_fp32=inference_fp32,
            inference_gap=inference_gap,
            rolled_back=run.rolled_back,
            rollback_reason=run.rollback_reason,
            checkpoint=checkpoint,
            guard_decision=decision.as_dict() if decision is not None else None,
            events=run.events,
        )
        self._log.info("world_model.trained", **report.log_fields())
        return report

    def _begin_run(self) -> FP16Trainer:
        """The trainer for a new run: rebuilt when the policy changed (e.g. the
        ledger rolled the agent back since the last run), else the current one
        with the guard's judgement reset. The guard gets a last good checkpoint
        of this model's own before the first step."""
        if self.trainer is None or self._policy_changed(self.trainer):
            self.trainer = self._build_trainer()
        elif self.guard is not None:
            self.guard.reset()
        if self.trainer.policy.stage == "on" and self.trainer.precision.name != "fp32":
            self._on_calls += 1
        if self.guard is not None and not self._owns_checkpoint(self.guard.last_good_checkpoint):
            # none yet, or another model's (the ledger keeps one per agent name, across
            # runs): a rollback must never load weights trained on another run's data
            self.guard.record_good_checkpoint(self.save(self.checkpoint_dir / f"{self.agent}.initial.pt"))
        return self.trainer

    def _optimise(self, run: TrainRun, x_tr: torch.Tensor, y_tr: torch.Tensor, steps: int, fault: Optional[FaultFn]) -> list[torch.Tensor]:
        """``steps`` optimizer steps on random batches; the FP32 reference
        (shadow or canary) takes the same batches. A guard trip rolls back at
        once and training goes on from the restored weights."""
        self.model.fit_normaliser(x_tr, y_tr)
        xn_tr, yn_tr = self.model.normalise_x(x_tr), self.model.normalise_y(y_tr)
        run.reference_kind, run.reference = self._reference_pair()
        if run.reference is not None:
            run.reference[0].fit_normaliser(x_tr, y_tr)  # same statistics, so both see the same normalised batches
        losses: list[torch.Tensor] = []
        n = len(xn_tr)
        for step in range(steps):
            idx = torch.randint(n, (min(self.batch_size, n),), generator=self._generator)
            batch = (xn_tr[idx], yn_tr[idx])
            trainer = self._current_trainer()
            loss = trainer.training_step(batch, mse_loss)
            if fault is not None:
                loss = fault(step, loss)
            trainer.backward_and_step(loss)
            losses.append(loss.detach())
            # Hand the GIL over now rather than at the interpreter's 5 ms forced
            # switch: with tiny tensors this thread is mostly Python overhead,
            # and the event loop should not wait for it.
            time.sleep(0)
            if run.reference is not None:
                reference_trainer = run.reference[1]
                reference_trainer.backward_and_step(reference_trainer.training_step(batch, mse_loss))
            trip = self.guard.tripped if self.guard is not None else None
            if self.guard is not None and trip is not None and trip is not self._handled_trip:
                self._handled_trip = trip
                self._roll_back(run, trip, self.guard)
                self.model.fit_normaliser(x_tr, y_tr)  # the restored weights train on this run's batches
                run.reference = run.reference_kind = None  # the main model is FP32 now; a reference adds nothing
        return losses

    def _roll_back(self, run: TrainRun, decision: GuardVerdict, guard: Guard) -> None:
        """Rebuild the trainer through the registry (the ledger now says
        rolled_back, so it is FP32) and restore the last good checkpoint into
        it (weights and optimizer state); the guard then watches the new trainer."""
        run.rollback_reason = f"{decision.severity}: {decision.reason}"
        run.skipped_before += self._current_trainer().skipped_steps - run.skipped_from
        last_good = guard.last_good_checkpoint
        self.trainer = self._build_trainer()
        if last_good and Path(last_good).exists():
            self.trainer.load_checkpoint(last_good, restore_rng=False)
            run.events.append(f"restored {last_good}")
        run.skipped_from = self.trainer.skipped_steps
        guard.reset()
        precision = self.trainer.precision.name
        self._log.warning("world_model.rolled_back", reason=run.rollback_reason, precision=precision, checkpoint=str(last_good))
        run.events.append(f"rolled back to {precision}: {run.rollback_reason}")

    # -- FP32 references: shadow and canary ------------------------------------------
    def _reference_pair(self) -> tuple[Optional[str], Optional[tuple[DynamicsMLP, FP16Trainer]]]:
        """``(kind, (model, trainer))`` of this call's FP32 reference, trained on
        the same batches: in rollout stage ``shadow`` one copy kept for the whole
        stage; in stage ``on`` a fresh copy of the current weights and optimizer
        state every ``guard.canary_every``-th call (the canary; needs a guard,
        which judges it); else ``(None, None)``."""
        trainer = self._current_trainer()
        stage = trainer.policy.stage
        if stage == "shadow":
            if self._shadow is None:
                self._shadow = fp32_reference(self.model, self.optimizer, trainer, f"{self.agent}{SHADOW_SUFFIX}")
            return "shadow", self._shadow
        if stage == "on" and self.guard is not None and trainer.precision.name != "fp32" and canary_due(self._on_calls, self.guard.canary_every):
            return "canary", fp32_reference(self.model, self.optimizer, trainer, f"{self.agent}{CANARY_SUFFIX}")
        return None, None

    def _record_shadow_gap(self, val_loss: float, fp32_val_loss: float) -> None:
        ledger: ShadowGapLedger = self.guard.ledger if self.guard is not None else RolloutLedger(settings=self.settings)
        ledger.record_shadow_gap(self.agent, val_loss, fp32_val_loss, self._current_trainer().precision.name)

    # -- prediction -------------------------------------------------------------------
    def _require_trained(self) -> None:
        if not self.trained:
            raise NotTrainedError("WorldModel: call `await train()` (or load a checkpoint) before predict/imagine")

    def predict_sync(self, obs: npt.ArrayLike, action: npt.ArrayLike) -> tuple[torch.Tensor, torch.Tensor]:
        """`(next_obs, reward)` for observations `(N, obs_dim)` and actions
        `(N, act_dim)`, in FP32; `NotTrainedError` before training."""
        self._require_trained()
        return self.model.predict_next(torch.as_tensor(obs, dtype=torch.float32), torch.as_tensor(action, dtype=torch.float32))

    async def predict(self, obs: npt.ArrayLike, action: npt.ArrayLike) -> tuple[torch.Tensor, torch.Tensor]:
        """`(next_obs, reward)`, FP32 tensors `(N, obs_dim)` and `(N,)`, for
        observations `(N, obs_dim)` and actions `(N, act_dim)`: `predict_sync`
        in a worker thread, after any running `train()`. Raises
        `NotTrainedError` before the first `train()` or `load()`."""
        async with self._lock:
            return await asyncio.to_thread(self.predict_sync, obs, action)

    def observed_region(self, spread: float = 4.0) -> tuple[torch.Tensor, torch.Tensor]:
        """(low, high) per observation dimension: the training data's mean
        -/+ ``spread`` standard deviations (the normaliser's statistics), the
        region where the model's predictions rest on data. Imagination may
        clamp rollouts into it where the observation space is unbounded."""
        self._require_trained()
        return self.model.observed_region(spread)

    def imagine(
        self,
        policy: PolicyFn,
        params: npt.ArrayLike,
        start_obs: npt.ArrayLike,
        horizon: int,
        *,
        project: Optional[ProjectFn] = None,
        discount: float = 1.0,
        terminated: Optional[TerminationFn] = None,
    ) -> torch.Tensor:
        """Predicted returns of P candidate policies from S start observations:
        a (P, S) tensor. One batched model forward per time step for all P*S
        rollouts. Imagination runs in FP32: errors compound over ``horizon``
        steps, and inference is cheap next to real episodes.

        ``params`` is (P, D); ``start_obs`` is (S, obs_dim), or (obs_dim,) for
        one start state (the result is then (P, 1)). A rollout stops at
        ``terminated(obs)``, else a ``done_head`` model's survival probability weighs it."""
        self._require_trained()
        return imagined_returns(self.model, policy, params, start_obs, horizon, project=project, discount=discount, terminated=terminated)

    async def aimagine(
        self, policy: PolicyFn, params: npt.ArrayLike, start_obs: npt.ArrayLike, horizon: int, *,
        project: Optional[ProjectFn] = None, discount: float = 1.0, terminated: Optional[TerminationFn] = None,
    ) -> torch.Tensor:
        """`imagine` in a worker thread, after any running `train()`; the same
        arguments, the same `(P, S)` returns, the same `NotTrainedError`."""
        async with self._lock:
            return await asyncio.to_thread(self.imagine, policy, params, start_obs, horizon, project=project, discount=discount, terminated=terminated)


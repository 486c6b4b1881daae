"""An async, learned dynamics model: (observation, action) -> (next-observation
delta, reward).

What the system this replaces got wrong, and what is done here instead:

* The label never enters the inputs: :func:`features` takes the observation
  and the action only, and it is the one function both training and
  prediction call.
* ``await train()`` runs the optimisation in a worker thread
  (``asyncio.to_thread``); torch releases the GIL inside its kernels, so the
  event loop keeps running. Concurrent ``train()`` calls are serialised by an
  ``asyncio.Lock``.
* It trains through ``registry.trainer_for(agent, ...)``, so the precision
  follows settings, the agent's profile and the rollout ledger.
* Non-finite data is refused with an error naming the trajectory.

Imagined rollouts (:meth:`WorldModel.imagine`) run many candidate policies
from many start states at once: one batched forward per time step.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import math
import numbers
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
import torch
from torch import nn

from genesis_fp16 import registry
from genesis_fp16.telemetry import get_logger

from .replay_buffer import ReplayBuffer, Trajectory

FaultFn = Callable[[int, torch.Tensor], torch.Tensor]
PolicyFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (params [P,D], obs [P,S,obs]) -> actions [P,S,act]
ProjectFn = Callable[[torch.Tensor], torch.Tensor]


class NonFiniteDataError(ValueError):
    """A trajectory holds NaN or inf; the message names it."""


class NotTrainedError(RuntimeError):
    """predict/imagine before the first train()."""


def features(obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """The model's raw inputs: observation and action, nothing else. Training
    and prediction both go through this function (and then the same
    normaliser inside :class:`DynamicsMLP`)."""
    return torch.cat([obs, action], dim=-1)


def targets(obs: torch.Tensor, next_obs: torch.Tensor, reward: torch.Tensor) -> torch.Tensor:
    """What the model learns to predict: the observation delta and the reward."""
    return torch.cat([next_obs - obs, reward.reshape(*obs.shape[:-1], 1)], dim=-1)


class DynamicsMLP(nn.Module):
    """MLP on normalised features; the normaliser statistics are buffers, so
    they travel with every checkpoint."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int = 64) -> None:
        super().__init__()
        self.obs_dim, self.act_dim = obs_dim, act_dim
        n_in, n_out = obs_dim + act_dim, obs_dim + 1
        self.net = nn.Sequential(nn.Linear(n_in, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, n_out))
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

    def forward(self, x_norm: torch.Tensor) -> torch.Tensor:
        return self.net(x_norm)

    def normalise_x(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.x_mean) / self.x_std

    def normalise_y(self, y: torch.Tensor) -> torch.Tensor:
        return (y - self.y_mean) / self.y_std

    def predict_raw(self, x: torch.Tensor) -> torch.Tensor:
        """Un-normalised prediction (delta obs, reward) for raw features."""
        return self.net(self.normalise_x(x)).float() * self.y_std + self.y_mean


@dataclass
class TrainReport:
    train_loss: float
    val_loss: float
    precision: str
    steps: int
    skipped_steps: int
    wall_s: float
    transitions: int
    trajectories: int
    fp32_val_loss: Optional[float] = None
    shadow_gap: Optional[float] = None
    rolled_back: bool = False
    rollback_reason: Optional[str] = None
    checkpoint: Optional[str] = None
    guard_decision: Optional[dict[str, Any]] = None
    events: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mse(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return ((model(x).float() - y) ** 2).mean()  # loss in float32, as the AMP docs advise


def check_finite(trajectories: Sequence[Trajectory]) -> None:
    for traj in trajectories:
        for name in ("obs", "action", "reward", "next_obs"):
            values = getattr(traj, name)
            if not np.isfinite(values).all():
                bad = int(np.argwhere(~np.isfinite(values))[0][0])
                raise NonFiniteDataError(
                    f"{traj.label}: non-finite {name} at transition {bad}; "
                    "refusing to train on it (fix the source, or delete the trajectory from the replay buffer)"
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
    """One uniform draw per transition from a generator seeded by (seed, key);
    a transition validates when its draw is under the validation fraction, so
    it stays on its side in every later training run."""
    return np.random.default_rng([seed, key]).random(length)


class WorldModel:
    """Learned dynamics for one environment.

    buffer: where transitions come from (``data_agent``'s trajectories).
    agent: the name the precision policy is resolved for (settings, profile, ledger).
    guard: an optional ``RollbackGuard`` (genesis_fp16.guard) attached to each trainer.
    """

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        *,
        buffer: Optional[ReplayBuffer] = None,
        agent: str = "world_model",
        data_agent: str = "se_darwin",
        guard: Any = None,
        settings: Any = None,
        precision: Optional[str] = None,
        hidden: int = 64,
        lr: float = 1e-3,
        batch_size: int = 256,
        val_fraction: float = 0.1,
        seed: int = 0,
        checkpoint_dir: Union[str, Path, None] = None,
        max_transitions: Optional[int] = 50_000,
    ) -> None:
        from genesis_fp16.settings import load_settings

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
        self.model = DynamicsMLP(obs_dim, act_dim, hidden)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.trainer: Any = None
        self.trained = False
        self._lock = asyncio.Lock()
        self._handled_trip: Any = None
        self._shadow: Optional[tuple[nn.Module, Any]] = None
        self._generator = torch.Generator().manual_seed(seed)
        self._log = get_logger("infrastructure.world_model", agent=agent)
        self.history: list[TrainReport] = []

    # -- trainer --------------------------------------------------------------
    def _build_trainer(self) -> Any:
        trainer = registry.trainer_for(self.agent, self.model, self.optimizer, settings=self.settings, precision=self.requested_precision)
        if self.guard is not None:
            self.guard.attach(trainer)
        return trainer

    def _policy_changed(self) -> bool:
        """Whether settings, profile or ledger now resolve to another trainer
        config or rollout stage than the current trainer's."""
        from genesis_fp16.policy import resolve_policy

        policy = resolve_policy(self.agent, self.settings, precision=self.requested_precision)
        current = getattr(self.trainer, "policy", None)
        return current is None or policy.config != current.config or policy.stage != current.stage

    @property
    def precision(self) -> str:
        if self.trainer is None:
            self.trainer = self._build_trainer()
        return self.trainer.precision.name

    # -- data -------------------------------------------------------------------
    def _dataset(self, trajectories: Sequence[Trajectory]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Features and targets, split into train/validation by
        :func:`validation_draws`. Trajectories are put in a canonical order
        first (generation, then data key), so the data set and the batches
        drawn from it depend on the trajectories alone: not on row ids, the
        order the buffer returned them in, or what else the state dir holds."""
        check_finite(trajectories)
        keyed = sorted(((traj.generation, data_key(traj), k) for k, traj in enumerate(trajectories)))
        xs, ys, draws = [], [], []
        for _, key, k in keyed:
            traj = trajectories[k]
            obs, act = torch.from_numpy(np.array(traj.obs, dtype=np.float32)), torch.from_numpy(np.array(traj.action, dtype=np.float32))
            nxt, rew = torch.from_numpy(np.array(traj.next_obs, dtype=np.float32)), torch.from_numpy(np.array(traj.reward, dtype=np.float32))
            xs.append(features(obs, act))
            ys.append(targets(obs, nxt, rew))
            draws.append(validation_draws(key, len(traj.obs), self.seed))
        x, y, u = torch.cat(xs).float(), torch.cat(ys).float(), np.concatenate(draws)
        val = u < self.val_fraction
        if not 0 < val.sum() < len(val):
            # too few transitions for the fraction to land on both sides: the k lowest draws validate
            k = min(max(1, round(len(val) * self.val_fraction)), len(val) - 1)
            val = np.zeros(len(val), dtype=bool)
            val[np.argsort(u, kind="stable")[:k]] = True
        val_t = torch.from_numpy(val)
        return x[~val_t], y[~val_t], x[val_t], y[val_t]

    # -- checkpoints ------------------------------------------------------------
    @property
    def checkpoint_path(self) -> Path:
        return self.checkpoint_dir / f"{self.agent}.pt"

    def save(self, path: Union[str, Path, None] = None) -> Path:
        if self.trainer is None:
            self.trainer = self._build_trainer()
        # the batch sampler's state too, so a loaded model trains on as this one would
        extra = {"trained": self.trained, "agent": self.agent, "sampler_state": self._generator.get_state()}
        return self.trainer.save_checkpoint(path or self.checkpoint_path, extra=extra)

    def load(self, path: Union[str, Path, None] = None) -> dict[str, Any]:
        if self.trainer is None:
            self.trainer = self._build_trainer()
        extra = self.trainer.load_checkpoint(path or self.checkpoint_path, restore_rng=False)
        self.trained = bool(extra.get("trained", True))
        if isinstance(extra.get("sampler_state"), torch.Tensor):
            self._generator.set_state(extra["sampler_state"])
        return extra

    # -- training ---------------------------------------------------------------
    async def train(
        self,
        steps: int = 800,
        *,
        trajectories: Optional[Sequence[Trajectory]] = None,
        fault: Optional[FaultFn] = None,
        save: bool = True,
    ) -> TrainReport:
        """Train for ``steps`` optimizer steps on the replay buffer's data (or
        on ``trajectories``) in a worker thread; returns a :class:`TrainReport`.
        Bad input (``steps < 1``, trajectories whose sizes do not match the
        model, fewer than 2 transitions) raises ``ValueError`` before anything
        is trained or written."""
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
            self._check_sizes(trajectories)
            report = await asyncio.to_thread(self._train_sync, trajectories, int(steps), fault, save)
            self.history.append(report)
            return report

    def _check_sizes(self, trajectories: Sequence[Trajectory]) -> None:
        built = (self.model.obs_dim, self.model.act_dim)
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

    def _owns_checkpoint(self, path: Any) -> bool:
        """Whether ``path`` is one of this model's checkpoints (in its checkpoint directory)."""
        return path is not None and Path(path).resolve().parent == self.checkpoint_dir.resolve()

    def _restore_after_trip(self, reason: str, events: list[str]) -> None:
        """Rebuild the trainer through the registry (the ledger now says
        rolled_back, so it is FP32) and restore the last good checkpoint into
        it (weights and optimizer state)."""
        last_good = getattr(self.guard, "last_good_checkpoint", None) if self.guard is not None else None
        self.trainer = self._build_trainer()
        if last_good and Path(last_good).exists():
            self.trainer.load_checkpoint(last_good, restore_rng=False)
            events.append(f"restored {last_good}")
        reset = getattr(self.guard, "reset", None)
        if reset is not None:
            reset()  # the guard now watches the new trainer
        self._log.warning("world_model.rolled_back", reason=reason, precision=self.trainer.precision.name, checkpoint=str(last_good))
        events.append(f"rolled back to {self.trainer.precision.name}: {reason}")

    def _val_loss(self, model: nn.Module, trainer: Any, x: torch.Tensor, y: torch.Tensor) -> float:
        model.eval()
        with torch.no_grad(), trainer.autocast():
            value = float(_mse(model, (model.normalise_x(x), model.normalise_y(y))))
        return value

    def _train_sync(self, trajectories: list[Trajectory], steps: int, fault: Optional[FaultFn], save: bool) -> TrainReport:
        started = time.perf_counter()
        events: list[str] = []
        x_tr, y_tr, x_val, y_val = self._dataset(trajectories)
        if self.trainer is None or self._policy_changed():
            self.trainer = self._build_trainer()  # e.g. the ledger rolled the agent back since the last run
        elif self.guard is not None and getattr(self.guard, "reset", None) is not None:
            self.guard.reset()  # a new training run: judge it afresh
        if self.guard is not None and not self._owns_checkpoint(getattr(self.guard, "last_good_checkpoint", None)):
            # none yet, or another model's (the ledger keeps one per agent name, across
            # runs): a rollback must never load weights trained on another run's data
            self.guard.record_good_checkpoint(self.save(self.checkpoint_dir / f"{self.agent}.initial.pt"))
        self.model.fit_normaliser(x_tr, y_tr)
        xn_tr, yn_tr = self.model.normalise_x(x_tr), self.model.normalise_y(y_tr)
        shadow = self._shadow_pair()
        if shadow is not None:
            shadow[0].fit_normaliser(x_tr, y_tr)  # same statistics, so both see the same normalised batches
        start_skipped = self.trainer.skipped_steps
        skipped_before_trip = 0
        rolled_back, rollback_reason = False, None
        losses: list[float] = []
        n = len(xn_tr)
        for step in range(steps):
            idx = torch.randint(n, (min(self.batch_size, n),), generator=self._generator)
            batch = (xn_tr[idx], yn_tr[idx])
            loss = self.trainer.training_step(batch, _mse)
            if fault is not None:
                loss = fault(step, loss)
            self.trainer.backward_and_step(loss)
            losses.append(loss.detach())
            # Hand the GIL over now rather than at the interpreter's 5 ms forced
            # switch: with tiny tensors this thread is mostly Python overhead,
            # and the event loop should not wait for it.
            time.sleep(0)
            if shadow is not None:
                s_model, s_trainer = shadow
                s_trainer.backward_and_step(s_trainer.training_step(batch, _mse))
            trip = getattr(self.guard, "tripped", None) if self.guard is not None else None
            if trip is not None and trip is not self._handled_trip:
                self._handled_trip = trip
                rolled_back, rollback_reason = True, f"{getattr(trip, 'severity', '?')}: {getattr(trip, 'reason', trip)}"
                skipped_before_trip += self.trainer.skipped_steps - start_skipped
                self._restore_after_trip(rollback_reason, events)
                start_skipped = self.trainer.skipped_steps
                self.model.fit_normaliser(x_tr, y_tr)
                shadow = None  # the main model is FP32 now; a shadow adds nothing
        finite = [float(v) for v in losses[-50:] if math.isfinite(float(v))]
        train_loss = float(np.mean(finite)) if finite else float("nan")
        val_loss = self._val_loss(self.model, self.trainer, x_val, y_val)
        fp32_val_loss = shadow_gap = None
        if shadow is not None:
            s_model, s_trainer = shadow
            fp32_val_loss = self._val_loss(s_model, s_trainer, x_val, y_val)
            shadow_gap = (val_loss - fp32_val_loss) / fp32_val_loss if fp32_val_loss > 0 else None
            self._record_shadow_gap(val_loss, fp32_val_loss)
        decision = None
        if self.guard is not None:
            decision = self.guard.check(self.trainer, val_loss=val_loss, fp32_val_loss=fp32_val_loss)
            if getattr(decision, "action", None) == "rollback" and not rolled_back:
                rolled_back, rollback_reason = True, f"{getattr(decision, 'severity', '?')}: {getattr(decision, 'reason', '')}"
                skipped_before_trip += self.trainer.skipped_steps - start_skipped
                self._restore_after_trip(rollback_reason, events)
                start_skipped = self.trainer.skipped_steps
                val_loss = self._val_loss(self.model, self.trainer, x_val, y_val)
        self.trained = True
        checkpoint = None
        if save:
            checkpoint = str(self.save())
            healthy = decision is None or getattr(decision, "action", None) != "rollback"
            if self.guard is not None and healthy and math.isfinite(val_loss):
                self.guard.record_good_checkpoint(checkpoint)
        report = TrainReport(
            train_loss=train_loss,
            val_loss=val_loss,
            precision=self.trainer.precision.name,
            steps=steps,
            skipped_steps=skipped_before_trip + self.trainer.skipped_steps - start_skipped,
            wall_s=time.perf_counter() - started,
            transitions=len(x_tr) + len(x_val),
            trajectories=len(trajectories),
            fp32_val_loss=fp32_val_loss,
            shadow_gap=shadow_gap,
            rolled_back=rolled_back,
            rollback_reason=rollback_reason,
            checkpoint=checkpoint,
            guard_decision=_decision_dict(decision),
            events=events,
        )
        self._log.info(
            "world_model.trained",
            train_loss=report.train_loss,
            val_loss=report.val_loss,
            precision=report.precision,
            steps=steps,
            skipped_steps=report.skipped_steps,
            wall_s=round(report.wall_s, 3),
            transitions=report.transitions,
            fp32_val_loss=fp32_val_loss,
            rolled_back=rolled_back,
        )
        return report

    # -- shadow mode --------------------------------------------------------------
    def _shadow_pair(self) -> Optional[tuple[nn.Module, Any]]:
        """In rollout stage ``shadow`` an FP32 copy trains on the same batches."""
        stage = getattr(getattr(self.trainer, "policy", None), "stage", None)
        if stage != "shadow":
            return None
        if self._shadow is None:
            model = copy.deepcopy(self.model)
            optimizer = torch.optim.Adam(model.parameters(), lr=self.lr)
            optimizer.load_state_dict(self.optimizer.state_dict())
            trainer = registry.create_trainer("fp32", model, optimizer, self.trainer.config, name=f"{self.agent}.fp32_shadow")
            self._shadow = (model, trainer)
        return self._shadow

    def _record_shadow_gap(self, val_loss: float, fp32_val_loss: float) -> None:
        ledger = getattr(self.guard, "ledger", None) if self.guard is not None else None
        if ledger is None:
            try:
                from genesis_fp16 import rollout

                ledger_cls = getattr(rollout, "RolloutLedger", None)
                ledger = ledger_cls(settings=self.settings) if ledger_cls is not None else None
            except Exception as exc:  # the ledger is optional here; say why it was not written
                self._log.warning("world_model.shadow_gap_unrecorded", error=str(exc))
                ledger = None
        record = getattr(ledger, "record_shadow_gap", None)
        if record is not None:
            record(self.agent, val_loss, fp32_val_loss, self.trainer.precision.name)

    # -- prediction -------------------------------------------------------------------
    def _require_trained(self) -> None:
        if not self.trained:
            raise NotTrainedError("WorldModel: call `await train()` (or load a checkpoint) before predict/imagine")

    def predict_sync(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(next_obs, reward) for batches of observations and actions (FP32)."""
        self._require_trained()
        obs, action = torch.as_tensor(obs, dtype=torch.float32), torch.as_tensor(action, dtype=torch.float32)
        self.model.eval()
        with torch.no_grad():
            out = self.model.predict_raw(features(obs, action))
        return obs + out[..., :-1], out[..., -1]

    async def predict(self, obs: Any, action: Any) -> tuple[torch.Tensor, torch.Tensor]:
        async with self._lock:
            return await asyncio.to_thread(self.predict_sync, obs, action)

    def imagine(
        self,
        policy: PolicyFn,
        params: Any,
        start_obs: Any,
        horizon: int,
        *,
        project: Optional[ProjectFn] = None,
        discount: float = 1.0,
    ) -> torch.Tensor:
        """Predicted returns of P candidate policies from S start observations:
        a (P, S) tensor. One batched model forward per time step for all P*S
        rollouts. Imagination runs in FP32: errors compound over ``horizon``
        steps, and inference is cheap next to real episodes.

        ``params`` is (P, D); ``start_obs`` is (S, obs_dim), or (obs_dim,) for
        one start state (the result is then (P, 1))."""
        self._require_trained()
        params = torch.as_tensor(np.asarray(params), dtype=torch.float32)
        start = torch.as_tensor(np.asarray(start_obs), dtype=torch.float32)
        obs_dim = self.model.obs_dim
        if start.ndim not in (1, 2) or start.shape[-1] != obs_dim:
            raise ValueError(
                f"WorldModel.imagine: start_obs of shape {tuple(start.shape)}: expected (S, {obs_dim}) or ({obs_dim},) "
                "for one start state, observations of the environment this model was trained on"
            )
        if params.ndim != 2:
            raise ValueError(f"WorldModel.imagine: params of shape {tuple(params.shape)}: expected (P, D), one row per candidate policy")
        if isinstance(horizon, bool) or not isinstance(horizon, numbers.Integral) or horizon < 1:
            raise ValueError(f"WorldModel.imagine: horizon={horizon!r}: expected at least 1 time step")
        start = start.reshape(-1, obs_dim)
        n_p, n_s = params.shape[0], start.shape[0]
        obs = start.unsqueeze(0).expand(n_p, n_s, start.shape[1]).contiguous()
        total = torch.zeros(n_p, n_s)
        weight = 1.0
        self.model.eval()
        with torch.no_grad():
            for _ in range(horizon):
                action = policy(params, obs)
                out = self.model.predict_raw(features(obs, action))
                obs = obs + out[..., :-1]
                if project is not None:
                    obs = project(obs)
                total += weight * out[..., -1]
                weight *= discount
        return total

    async def aimagine(self, policy: PolicyFn, params: Any, start_obs: Any, horizon: int, **kwargs: Any) -> torch.Tensor:
        async with self._lock:
            return await asyncio.to_thread(self.imagine, policy, params, start_obs, horizon, **kwargs)


def _decision_dict(decision: Any) -> Optional[dict[str, Any]]:
    if decision is None:
        return None
    if hasattr(decision, "as_dict"):
        return decision.as_dict()
    return {k: getattr(decision, k, None) for k in ("severity", "reason", "action")}

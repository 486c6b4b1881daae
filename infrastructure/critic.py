"""A twin-Q critic of one deterministic policy, for the CEM-RL loop (issue 38).

CMA-ES searches over small deterministic policies; this critic learns Q of
the search's mean policy from real transitions (the replay buffer) and short
model rollouts, and copies of the mean are refined by ascending `value`.

Design (TD3, Fujimoto et al. 2018; CleanRL's ``td3_continuous_action.py``
was read for the update):

* Twin Qs with clipped double-Q targets and target-policy smoothing: the
  policies are deterministic, so there is no entropy term (SAC's) and no
  actor of the critic's own: ``target_policy`` is the policy valued, fixed for
  a `train()` call, applied once to every next observation of the call.
* Training goes through `genesis_fp16.training.guarded.GuardedTraining` (precision
  from settings, profile and ledger; a rollback guard, canaries, an FP32
  shadow). The FP32 reference trains a copy with the same loss, so the TD
  targets are computed OUTSIDE the loss, in FP32 under ``no_grad`` with the
  critic's own target network: a step's batch is ``(inputs, y)`` and its loss
  ``mse(q1, y) + mse(q2, y)`` (`critic_net.td_loss`).
* The target network is a lagged (Polyak, ``tau``) FP32 copy of the twins,
  kept across calls, in checkpoints, and reset from the restored weights
  after a rollback.
* Normaliser and value scale: `critic_net` (fitted per call, functions kept).
* Batches and smoothing noise come from a seeded CPU generator: same seed,
  same data, same weights, on any device.
"""

from __future__ import annotations

import copy
import numbers
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

import numpy as np
import numpy.typing as npt
import torch
from torch.func import functional_call

from genesis_fp16.base.device import DeviceArg
from genesis_fp16.base.seeds import torch_generator
from genesis_fp16.base.settings import Settings
from genesis_fp16.precision.decision import PrecisionDecision
from genesis_fp16.precision.request import PrecisionRequest
from genesis_fp16.training.guarded import DEFAULT_GUARD, Guard, GuardChoice, Verdict
from genesis_fp16.training.trainer import FP16Trainer, StepHook, fused_adam

from .critic_net import (
    CriticSpec,
    TwinQ,
    check_critic_payload,
    check_spec,
    check_transitions,
    compute_targets,
    normaliser_stats,
    smoothing_noise,
    td_loss,
)
from .dynamics import NonFiniteDataError
from .transitions import Transitions
from .learner import GuardedCallReport, GuardedLearner, StepFn

__all__ = ["Critic", "CriticReport", "NonFiniteDataError", "Transitions", "compute_targets"]

# The default size, by scripts/bench_critic.py (torch 2.13 CPU, AMX-BF16 host, one
# thread, batch 256): 64 units learn the bench's one-step tasks to within 1%
# (Pendulum sizes) and as well as 128 or 256 (HalfCheetah sizes, 4096
# transitions: data-limited) at 1.56-1.58 ms a step against 2.2 (128) and 4.2-4.3
# (256); BF16 does not pay at 64 or 128 (0.86-0.94x FP32), only at 256 (1.14x).
DEFAULT_HIDDEN = 64
DEFAULT_LAYERS = 2
VAL_FRACTION = 0.1

PolicyFn = Callable[[torch.Tensor], torch.Tensor]
"""``observations [N, obs_dim] -> actions [N, act_dim]`` (on the critic's device)."""


@dataclass
class CriticReport(GuardedCallReport):
    """What one `Critic.train()` call did: ``train_loss`` (mean of the last 50
    steps' TD loss) and ``val_loss`` (the TD loss on the held-out tenth),
    both in value units (`critic_net`); ``precision`` what runs now;
    ``skipped_steps``; ``fp32_val_loss`` / ``shadow_gap`` / ``reference``
    where an FP32 reference trained; ``rollback`` (the first rollback's
    verdict), ``guard_decision``, ``events`` and ``checkpoint`` what the guard
    did and what was written."""

    steps: int
    train_loss: float
    val_loss: float
    precision: str
    skipped_steps: int
    wall_s: float
    transitions: int
    fp32_val_loss: Optional[float] = None
    shadow_gap: Optional[float] = None
    reference: Optional[str] = None
    rollback: Optional[Verdict] = None
    guard_decision: Optional[Verdict] = None
    checkpoint: Optional[str] = None
    events: list[str] = field(default_factory=list)
    device: Optional[str] = None
    precision_decision: Optional[dict[str, Any]] = None


def _val_loss(model: TwinQ, trainer: FP16Trainer, x: torch.Tensor, y: torch.Tensor) -> float:
    """The TD loss on the held-out rows under ``trainer``'s autocast (`finish_call`'s ``val_fn``)."""
    model.eval()
    with torch.no_grad(), trainer.autocast():
        return float(td_loss(model, (x, y)))


@dataclass
class _CallData:
    """One `train()` call's data on the critic's device."""

    train: Transitions
    val: Transitions
    next_act: torch.Tensor
    val_next: torch.Tensor
    stats: list[torch.Tensor]


class Critic(GuardedLearner):
    """Twin-Q critic (TD3 targets) of a deterministic policy; see the module's docstring.

    Args:
        obs_dim, act_dim: the env's sizes.
        action_low, action_high: the env's action box (actions are clipped
            into it and scaled onto [-1, 1] for the network).
        agent: the name the precision policy and the guard are resolved for
            (the loop passes ``critic.<task id>``).
        settings, precision, guard, device: as `infrastructure.world_model.WorldModel`'s.
        hidden, layers, activation: the twins' MLP (``silu`` or ``relu``).
        gamma, tau: discount; Polyak rate of the target network per step.
        lr, batch_size: Adam's learning rate; transitions per step.
        target_noise, noise_clip: target-policy smoothing, in fractions of
            the half action range (TD3's 0.2 and 0.5).
        seed: initial weights, batches, noise and the validation split.
        checkpoint_dir: default ``<state_dir>/critic``.
    """

    report = CriticReport

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        *,
        action_low: npt.ArrayLike,
        action_high: npt.ArrayLike,
        agent: str = "critic",
        settings: Optional[Settings] = None,
        precision: Union[PrecisionRequest, str, None] = None,
        guard: Union[Guard, GuardChoice] = DEFAULT_GUARD,
        device: DeviceArg = None,
        hidden: int = DEFAULT_HIDDEN,
        layers: int = DEFAULT_LAYERS,
        activation: str = "silu",
        gamma: float = 0.99,
        tau: float = 0.005,
        lr: float = 1e-3,
        batch_size: int = 256,
        target_noise: float = 0.2,
        noise_clip: float = 0.5,
        seed: int = 0,
        checkpoint_dir: Union[str, Path, None] = None,
        decision: Optional[PrecisionDecision] = None,
    ) -> None:
        low, high = (torch.as_tensor(np.asarray(v, dtype=np.float32)).reshape(-1) for v in (action_low, action_high))
        check_spec(obs_dim, act_dim, hidden, layers, activation, low, high)
        problems = [
            f"{name}={value!r}: expected {want}"
            for name, value, ok, want in (
                ("gamma", gamma, 0.0 <= gamma < 1.0, "a discount in [0, 1), e.g. 0.99"),
                ("tau", tau, 0.0 < tau <= 1.0, "a Polyak rate in (0, 1], e.g. 0.005"),
                ("lr", lr, lr > 0.0, "a positive learning rate, e.g. 1e-3"),
                (
                    "batch_size",
                    batch_size,
                    not isinstance(batch_size, bool) and isinstance(batch_size, numbers.Integral) and batch_size >= 1,
                    "a positive number of transitions per step, e.g. 256",
                ),
                (
                    "target_noise",
                    target_noise,
                    target_noise >= 0.0,
                    "a non-negative fraction of the half action range, e.g. 0.2",
                ),
                (
                    "noise_clip",
                    noise_clip,
                    noise_clip >= 0.0,
                    "a non-negative fraction of the half action range, e.g. 0.5",
                ),
            )
            if not ok
        ]
        if problems:
            raise ValueError("Critic: " + "; ".join(problems))
        super().__init__(
            "critic", agent, settings=settings, device=device, guard=guard, precision=precision, decision=decision
        )
        self.gamma, self.tau, self.lr, self.batch_size = float(gamma), float(tau), float(lr), int(batch_size)
        self.target_noise, self.noise_clip, self.seed = float(target_noise), float(noise_clip), seed
        self.spec = CriticSpec(
            int(obs_dim), int(act_dim), int(hidden), int(layers), activation, tuple(low.tolist()), tuple(high.tolist())
        )
        self.model = TwinQ(self.spec, torch_generator(seed, "critic.init")).to(self.device)
        self.target = copy.deepcopy(self.model).float().requires_grad_(False)
        self.low, self.high = low.to(self.device), high.to(self.device)
        self.optimizer = fused_adam(self.model.parameters(), lr, self.device)  # a window skips a step on the device
        self._generator = torch_generator(seed, "critic.batches")
        self._data: Optional[_CallData] = None
        g = torch_generator(
            0, "critic.auto_sample"
        )  # a workload sample for a measured auto; the run's streams untouched
        sample = (
            torch.randn(self.batch_size, self.spec.obs_dim + self.spec.act_dim, generator=g).to(self.device),
            torch.randn(self.batch_size, generator=g).to(self.device),
        )
        self._train_through(self.model, self.optimizer, checkpoint_dir=checkpoint_dir, sample=(sample, td_loss))

    # -- values ----------------------------------------------------------------------
    def q_values(self, obs: torch.Tensor, act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q1, q2)``, each ``[N]``, in FP32 for raw observations ``[N, obs_dim]``
        and actions ``[N, act_dim]`` (on the critic's device); differentiable
        with respect to ``obs`` and ``act``, never accumulating gradients into
        the critic's own weights."""
        state = {k: v.detach() for k, v in self.model.named_parameters()}
        state.update(self.model.named_buffers())
        q = functional_call(self.model, state, (self.model.inputs(obs, act),))
        q = q * self.model.q_scale + self.model.q_offset
        return q[0], q[1]

    def value(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        """``min(q1, q2)`` ``[N]``: what the actor refinement ascends (differentiable w.r.t. ``act``), computed on
        the critic's device and returned on the inputs' (the refinement runs on the host)."""
        q1, q2 = self.q_values(obs.to(self.device), act.to(self.device))
        return torch.minimum(q1, q2).to(obs.device)

    # -- checkpoints: the learner's, with the spec, the target network and the sampler ----------------
    def checkpoint_extra(self) -> dict[str, Any]:
        """The twins' spec, the target network and the sampler state beside the trainer's."""
        return {
            **super().checkpoint_extra(),
            "critic": self.spec.as_dict(),
            "target": {k: v.detach().clone() for k, v in self.target.state_dict().items()},
            "sampler_state": self._generator.get_state(),
        }

    def check_checkpoint(self, payload: dict[str, Any], source: str) -> None:
        """A world model's checkpoint, or a critic of another size or action box, is refused whole."""
        check_critic_payload(payload, self.spec, {k: v.shape for k, v in self.target.state_dict().items()}, source)

    def restored(self, extra: dict[str, Any]) -> None:
        self.target.load_state_dict(extra["target"])
        self._generator.set_state(extra["sampler_state"].cpu())
        self.trained = bool(extra.get("trained", True))

    # -- training --------------------------------------------------------------------------
    async def train(
        self,
        data: Transitions,
        target_policy: PolicyFn,
        steps: int,
        *,
        save: bool = True,
        on_step: Optional[StepFn] = None,
    ) -> CriticReport:
        """``steps`` TD3 critic steps on ``data`` valuing ``target_policy``, in a
        worker thread (one call at a time). Bad input raises before anything
        is trained: `ValueError` for ``steps < 1`` or transitions of other
        sizes, `NonFiniteDataError` for NaN or inf. ``save`` writes a
        checkpoint at the end (recorded as good when the call was healthy).
        ``on_step(done)`` is told the steps done after each one (a caller's progress)."""
        if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 1:
            raise ValueError(f"Critic.train: steps={steps!r}: expected a positive number of optimizer steps (e.g. 500)")
        check_transitions(data, self.spec.obs_dim, self.spec.act_dim)
        async with self._lock:
            return await self._train_in_thread(self._train_sync, data, target_policy, int(steps), save, on_step=on_step)

    def _policy_actions(self, policy: PolicyFn, next_obs: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            act = torch.as_tensor(policy(next_obs), dtype=torch.float32, device=self.device)
        if act.shape != (len(next_obs), self.spec.act_dim) or not bool(torch.isfinite(act).all()):
            raise ValueError(
                f"Critic.train: target_policy gave actions of shape {tuple(act.shape)} (finite: "
                f"{bool(torch.isfinite(act).all())}); expected finite actions of shape ({len(next_obs)}, "
                f"{self.spec.act_dim})"
            )
        return act

    def _targets(self, data: Transitions, next_act: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        noise = smoothing_noise(len(rows), self.model.act_half, self.target_noise, self.noise_clip, self._generator).to(
            self.device
        )
        y = compute_targets(
            data.rew[rows],
            data.terminal[rows],
            data.next_obs[rows],
            next_act[rows],
            noise,
            self.target.q,
            gamma=self.gamma,
            low=self.low,
            high=self.high,
        )
        return (y - self.model.q_offset) / self.model.q_scale

    @torch.no_grad()
    def _reset_target(self) -> None:
        self.target.load_state_dict(self.model.state_dict())

    @torch.no_grad()
    def _polyak(self, taken: torch.Tensor) -> None:
        """The target moves ``tau`` towards the twins after a step taken (``taken`` 1.0), not after a skipped one
        (0.0): a device flag, so the step's outcome is never read back."""
        model, target = [p.float() for p in self.model.parameters()], list(self.target.parameters())
        # target += w (model - target) with a device weight: _foreach_lerp_ reads a tensor weight back to the host
        step = torch._foreach_sub(model, target)
        torch._foreach_mul_(step, taken * self.tau)
        torch._foreach_add_(target, step)

    def _train_sync(self, data: Transitions, policy: PolicyFn, steps: int, save: bool) -> CriticReport:
        started = time.perf_counter()
        data = data.to(self.device)
        policy_act = self._policy_actions(policy, data.next_obs)  # pi(s') once: the policy is fixed for the call
        n_val = max(1, int(round(len(data) * VAL_FRACTION)))
        order = torch.randperm(len(data), generator=self._generator).to(self.device)
        self._data = _CallData(
            train=data.rows(order[n_val:]),
            val=data.rows(order[:n_val]),
            next_act=policy_act[order[n_val:]],
            val_next=policy_act[order[:n_val]],
            stats=[s.to(self.device) for s in normaliser_stats(data, self.gamma)],
        )
        try:
            report = self._guarded_call(started, steps, save, transitions=len(data))
        finally:
            self._data = None
        self.model.train()  # _val_loss left it in eval mode
        self._log.info(
            "critic.trained",
            steps=steps,
            train_loss=report.train_loss,
            val_loss=report.val_loss,
            precision=report.precision,
            skipped_steps=report.skipped_steps,
            rolled_back=report.rolled_back,
            wall_s=round(report.wall_s, 3),
            transitions=len(data),
            device=report.device,
        )
        return report

    # the TD3 step: the loss on precomputed targets, the normaliser refitted per call, the target network following
    # each step taken (masked on the device), made anew after a rollback, and giving the held-out targets
    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        return td_loss(model, batch)

    def prepare(self, model: torch.nn.Module) -> None:
        assert self._data is not None
        model.refit(*self._data.stats)

    def batches(self, steps: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Made once `prepare` refitted the twins; lazily: each step's targets come from the target network as the
        step before left it."""
        data = self._data
        assert data is not None
        self.target.refit(*data.stats)  # the target's function kept, its units this call's
        if not self.trained:
            self._reset_target()
        train = data.train
        x_train, n = self.model.inputs(train.obs, train.act), min(self.batch_size, len(train))
        rows = (torch.randint(len(train), (n,), generator=self._generator).to(self.device) for _ in range(steps))
        return ((x_train[r], self._targets(train, data.next_act, r)) for r in rows)

    def validation(self) -> Any:
        data = self._data
        assert data is not None
        val = data.val
        return partial(
            _val_loss,
            y=self._targets(val, data.val_next, torch.arange(len(val), device=self.device)),
            x=self.model.inputs(val.obs, val.act),
        )

    def step_hook(self) -> Optional[StepHook]:
        return self._polyak

    def on_rollback(self) -> None:
        self._reset_target()

"""PPO's rollback guard, as the world model has it: P0 on a non-finite
streak (live, from the trainer's events), P1/P2 on overflow rates after each
iteration, the rollout ledger and a last good checkpoint; plus a policy
canary on a held batch that compares the reduced-precision forward with FP32
(KL of the taken actions, max |log-prob delta|, max |value delta|; thresholds
``canary_kl``, ``canary_logp_delta``, ``canary_value_delta`` in the profile).

A rollback rebuilds the trainer through ``registry.trainer_for`` (FP32 now:
the ledger says ``rolled_back``) and restores the last good checkpoint.
Checkpoints are written only while the trainer is in reduced precision (an
FP32 trainer has nothing to roll back to).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

import torch

from genesis_fp16 import registry
from genesis_fp16.canary import canary_due, policy_gap
from genesis_fp16.guard import GuardDecision, RollbackGuard
from genesis_fp16.settings import Settings, load_settings
from genesis_fp16.telemetry import get_logger
from genesis_fp16.trainer import FP16Trainer

from .policy import ActorCritic

HELD_ROWS = 256  # the held batch: the first rollout's first rows, fixed for the run


class PPOGuard:
    """Watches one PPO run's trainers and builds them (`build_trainer`).
    ``save(path)`` writes a checkpoint of the run (weights, optimizer,
    normalisation statistics); ``load(path, trainer=...)`` restores one into a trainer."""

    def __init__(
        self,
        agent: str,
        net: ActorCritic,
        optimizer: torch.optim.Optimizer,
        precision: str,
        overrides: dict[str, Any],
        save: Callable[[Path], Path],
        load: Callable[..., Any],
        *,
        seed: int = 0,
        settings: Optional[Settings] = None,
    ) -> None:
        self.agent = agent
        self.net = net
        self.settings = settings or load_settings()
        self.guard = RollbackGuard(agent, settings=self.settings)
        self._optimizer, self._precision, self._overrides = optimizer, precision, overrides
        self._save, self._load = save, load
        self.checkpoint = Path(self.settings.state_dir) / "ppo" / f"{agent}.seed{seed}.last_good.pt"
        self.held: Optional[dict[str, torch.Tensor]] = None
        self.rollbacks: list[str] = []
        self.canaries: list[dict[str, float]] = []
        self._log = get_logger("agents.ppo", agent=agent)

    def build_trainer(self) -> FP16Trainer:
        """The trainer the policy gives now: settings, profile, then the ledger (FP32 once rolled back)."""
        return registry.trainer_for(
            self.agent, self.net, self._optimizer, settings=self.settings, precision=self._precision, overrides=self._overrides
        )

    def watch(self, trainer: FP16Trainer) -> None:
        """Attach the guard; in reduced precision, the current weights are the first good checkpoint."""
        self.guard.attach(trainer)
        if trainer.precision.name != "fp32":
            self.guard.record_good_checkpoint(self._save(self.checkpoint))

    def hold(self, data: dict[str, torch.Tensor]) -> None:
        """Keep the first rollout's first rows as the canary's held batch."""
        if self.held is None:
            self.held = {k: data[k][:HELD_ROWS].detach().clone() for k in ("obs", "act")}

    # -- during an update ---------------------------------------------------------------
    def after_step(self, trainer: FP16Trainer) -> FP16Trainer:
        """After each optimizer step: the trainer to go on with (a new FP32 one after a P0 trip)."""
        trip = self.guard.tripped
        if trip is not None and self.guard.trainer is trainer:
            return self._roll_back(trip)
        return trainer

    # -- after an iteration ------------------------------------------------------------
    def after_iteration(self, trainer: FP16Trainer, iteration: int) -> FP16Trainer:
        """P1/P2 on the run's statistics, the policy canary when due; a healthy
        reduced-precision iteration becomes the last good checkpoint. An FP32
        trainer has nothing to roll back: nothing is judged or written."""
        if trainer.precision.name == "fp32":
            return trainer
        decision = self.guard.check(trainer)
        if decision.action != "rollback" and canary_due(iteration, self.guard.canary_every):
            decision = self._policy_canary(trainer)
        if decision.action == "rollback":
            return self._roll_back(decision)
        self.guard.record_good_checkpoint(self._save(self.checkpoint))
        return trainer

    def _policy_canary(self, trainer: FP16Trainer) -> GuardDecision:
        """Log-probs and values of the held batch with and without autocast."""
        if self.held is None:
            raise RuntimeError("PPOGuard: the policy canary needs a held batch; call hold(data) with the first rollout's data first")
        obs, act = self.held["obs"], self.held["act"]
        was_training = self.net.training
        self.net.eval()
        try:
            with torch.no_grad():
                with trainer.autocast():
                    out, value = self.net(obs)
                    logp, _ = self.net.log_prob_entropy(out, act, with_entropy=False)
                out32, value32 = self.net(obs)
                logp32, _ = self.net.log_prob_entropy(out32, act, with_entropy=False)
        finally:
            self.net.train(was_training)
        gap = policy_gap(logp, logp32, value, value32)
        self.canaries.append(gap)
        return self.guard.check_policy_canary(trainer, **gap)

    def _roll_back(self, decision: GuardDecision) -> FP16Trainer:
        """The FP32 trainer to go on with, the last good checkpoint restored into it."""
        trainer, checkpoint = self.guard.recover(self.build_trainer, lambda t, path: self._load(path, trainer=t))
        restored = str(checkpoint) if checkpoint is not None else None
        reason = f"{decision.severity}: {decision.reason}"
        self.rollbacks.append(reason)
        self._log.warning("ppo.rolled_back", reason=reason, precision=trainer.precision.name, checkpoint=restored)
        return trainer

"""PPO's rollback guard: `genesis_fp16.training.guarded.GuardedTraining` (P0 on a
non-finite streak, live; P1/P2 on the run's statistics after each iteration;
rollbacks to FP32 and the last good checkpoint) plus a policy canary: every
``canary_every``-th reduced-precision iteration, the held batch's forward with
and without autocast (KL of the taken actions, max |log-prob delta|, max
|value delta| against the profile's ``canary_*`` thresholds). Checkpoints are
written only while the trainer is in reduced precision.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

import torch

from genesis_fp16.rollout.canary import policy_gap
from genesis_fp16.rollout.guard import RollbackGuard
from genesis_fp16.training.guarded import CallReport, GuardedTraining, Verdict
from genesis_fp16.base.settings import Settings, load_settings
from genesis_fp16.base.telemetry import get_logger
from genesis_fp16.training.trainer import FP16Trainer


HELD_ROWS = 256  # the held batch: the first rollout's first rows, fixed for the run


class PPOGuard:
    """One PPO run's `GuardedTraining` (``training``), the held batch and the policy canary; ``save(path)`` and
    ``load(path, trainer=...)`` write and restore the run's checkpoints (weights, optimizer, normalisers)."""

    def __init__(
        self,
        agent: str,
        net: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        precision: str,
        overrides: dict[str, Any],
        save: Callable[[Path], Path],
        load: Callable[..., Any],
        *,
        seed: int = 0,
        settings: Optional[Settings] = None,
        sample: Optional[tuple[Any, Callable[[torch.nn.Module, Any], torch.Tensor]]] = None,
    ) -> None:
        self.agent, self.net = agent, net
        self.settings = settings or load_settings()
        self.guard = RollbackGuard(agent, settings=self.settings)
        self.checkpoint = Path(self.settings.state_dir) / "ppo" / f"{agent}.seed{seed}.last_good.pt"
        self.training = GuardedTraining(
            agent,
            net,
            optimizer,
            settings=self.settings,
            precision=precision,
            overrides=overrides,
            guard=self.guard,
            checkpoint_dir=self.checkpoint.parent,
            good_name=self.checkpoint.name,
            checkpoint_every=0,
            save=save,
            load=lambda trainer, path: load(path, trainer=trainer),
            fp32_reference=False,
            sample=sample,
        )
        self.held: Optional[dict[str, torch.Tensor]] = None
        self.canaries: list[dict[str, float]] = []
        self._iteration: Optional[CallReport] = None
        self._rollbacks_before = 0
        self._log = get_logger("agents.ppo", agent=agent)

    @property
    def trainer(self) -> FP16Trainer:
        """The trainer in use (an FP32 one after a rollback)."""
        return self.training.trainer

    @property
    def rollbacks(self) -> list[str]:
        """``"<severity>: <reason>"`` of each rollback, oldest first."""
        return [f"{d.severity}: {d.reason}" for d in self.training.rollbacks]

    def hold(self, data: dict[str, torch.Tensor]) -> None:
        """Keep the first rollout's first rows as the canary's held batch."""
        if self.held is None:
            self.held = {k: data[k][:HELD_ROWS].detach().clone() for k in ("obs", "act")}

    def start(self) -> None:
        """Before the first update: in reduced precision, the current weights are the first good checkpoint."""
        if self.training.reduced:
            self.training.save_good_checkpoint()

    def begin_iteration(self) -> None:
        """Before an iteration's update: one training call of `GuardedTraining` (its canary count)."""
        self._rollbacks_before = len(self.training.rollbacks)
        self._iteration = self.training.begin_call()

    def step(self, batch: Any, loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor]) -> bool:
        """One optimizer step (`GuardedTraining.step`); a P0 trip is rolled back before this returns."""
        return self.training.step(batch, loss_fn)

    def end_iteration(self) -> None:
        """P1/P2 on the run's statistics, the policy canary when due; a healthy reduced-precision iteration becomes
        the last good checkpoint (an FP32 trainer has nothing to roll back: nothing is judged or written)."""
        due = self._iteration is not None and self._iteration.canary_due
        self._iteration = None
        if self.training.reduced:
            report = self.training.finish_call()
            if not report.rolled_back and due:
                self._policy_canary()
        new = self.training.rollbacks[self._rollbacks_before :]
        last_good = self.guard.last_good_checkpoint if new else None  # a ledger query: only when there is news
        for decision in new:
            self._log.warning(
                "ppo.rolled_back",
                reason=f"{decision.severity}: {decision.reason}",
                precision=self.trainer.precision.name,
                checkpoint=str(last_good) if last_good is not None else None,
            )
        if not new and self.training.reduced:
            self.training.save_good_checkpoint()

    def _policy_canary(self) -> Verdict:
        """Log-probs and values of the held batch with and without autocast."""
        if self.held is None:
            raise RuntimeError(
                "PPOGuard: the policy canary needs a held batch; call hold(data) with the first rollout's data first"
            )
        trainer = self.trainer
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
        return self.training.check_policy_canary(**gap)

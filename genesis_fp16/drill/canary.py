"""The canary scenarios: a model whose reduced-precision path is quietly
worse (no NaN, no overflow) is caught by the FP32 canary in stage ``on``, and
a healthy one is not.

A "training call" here is what ``WorldModel.train()`` does for the canary:
``STEPS`` optimizer steps on random batches; on every ``canary_every``-th
call an FP32 copy (`genesis_fp16.canary.fp32_reference`) takes the same
batches from the same weights, and the guard compares the validation losses
(``check(..., reference="canary")``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import nn

from ..canary import canary_due, fp32_reference
from ..guard import GuardDecision, RollbackGuard
from ..trainer import FP16Trainer
from .common import ScenarioResult, drill_data, model_and_optimizer, mse

if TYPE_CHECKING:
    from .runner import Drill

STEPS = 10  # optimizer steps per training call
HEALTHY_CANARIES = 50


def quantise_under_autocast(module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
    """The injected fault, a forward hook: the outputs are rounded to steps of
    0.5 whenever autocast is on, i.e. on the reduced-precision path only.
    Finite, no overflow: only the canary can see it."""
    if torch.is_autocast_enabled(output.device.type):
        return torch.round(output * 2) / 2
    return output


class CanaryRun:
    """One agent in stage on, trained call by call with the canary's schedule."""

    def __init__(self, drill: "Drill", agent: str, **thresholds: Any) -> None:
        self.drill, self.agent = drill, agent
        drill.ledger.enable(agent, actor="drill", reason=f"drill: {agent}")
        self.model, self.optimizer = model_and_optimizer()
        self.guard = RollbackGuard(agent, settings=drill.settings, ledger=drill.ledger, thresholds=thresholds or None)
        self.trainer = drill._trainer(agent, self.model, self.optimizer)
        self.guard.attach(self.trainer)
        self.x, self.y = drill.batch
        self.x_val, self.y_val = drill_data(seed=1)
        self.generator = torch.Generator().manual_seed(0)
        self.calls = 0
        self.canaries = 0
        self.alarms = 0

    def _val_loss(self, model: nn.Module, trainer: FP16Trainer) -> float:
        model.eval()
        with torch.no_grad(), trainer.autocast():
            return float(mse(model, (self.x_val, self.y_val)))

    def train_call(self) -> GuardDecision:
        """One training call; the guard's decision on it (a canary call is judged against FP32)."""
        self.calls += 1
        reference: Optional[tuple[nn.Module, FP16Trainer]] = None
        if self.trainer.precision.name != "fp32" and canary_due(self.calls, self.guard.canary_every):
            reference = fp32_reference(self.model, self.optimizer, self.trainer, f"{self.agent}.fp32_canary")
        for _ in range(STEPS):
            idx = torch.randint(len(self.x), (16,), generator=self.generator)
            batch = (self.x[idx], self.y[idx])
            self.trainer.backward_and_step(self.trainer.training_step(batch, mse))
            if reference is not None:
                reference[1].backward_and_step(reference[1].training_step(batch, mse))
        val_loss = self._val_loss(self.model, self.trainer)
        if reference is None:
            return self.guard.check(self.trainer, val_loss=val_loss)
        self.canaries += 1
        fp32_val_loss = self._val_loss(*reference)
        self.alarms += val_loss > self.guard.thresholds["canary_val_loss_ratio"] * fp32_val_loss  # what the guard calls an alarm
        return self.guard.check(self.trainer, val_loss=val_loss, fp32_val_loss=fp32_val_loss, reference="canary")

    def save_good(self) -> None:
        path = self.trainer.save_checkpoint(self.drill.state_dir / f"{self.agent}.good.pt")
        self.guard.record_good_checkpoint(path)


def silent_degradation(drill: "Drill") -> ScenarioResult:
    """Stage on, a fault injected after healthy calls: caught within
    2 x canary_every calls, ledger rolled_back, last good checkpoint restored,
    next trainer FP32."""
    run = CanaryRun(drill, "drill_silent_degradation")
    every = run.guard.canary_every
    healthy = max(1, every - 2)  # the fault starts between canaries, not on one
    for _ in range(healthy):
        decision = run.train_call()
        run.save_good()
    good_weights = {k: v.clone() for k, v in run.model.state_dict().items()}
    hook = run.model.register_forward_hook(quantise_under_autocast)
    delay = None
    try:
        for call in range(1, 2 * every + 1):
            decision = run.train_call()
            if decision.action == "rollback":
                delay = call
                break
    finally:
        hook.remove()
    checks: dict[str, Any] = {
        "canary_every": every, "healthy_calls": healthy, "detection_delay_calls": delay, "canaries": run.canaries,
        "alarms": run.alarms, "severity": decision.severity, "reason": decision.reason,
        "ledger_stage": drill.ledger.stage(run.agent), "nonfinite": run.trainer.get_stats()["nonfinite_losses"],
        "overflow_rate": run.trainer.get_stats()["overflow_rate"],
    }
    # what WorldModel does on a rollback: rebuild through the policy, restore the last good checkpoint
    trainer = drill._trainer(run.agent, run.model, run.optimizer)
    trainer.load_checkpoint(run.guard.last_good_checkpoint, restore_rng=False)
    checks["precision_after"] = trainer.precision.name
    checks["weights_restored"] = all(torch.equal(good_weights[k], v) for k, v in run.model.state_dict().items())
    passed = (
        delay is not None and delay <= 2 * every and decision.severity == "P1" and "canary" in decision.reason
        and checks["ledger_stage"] == "rolled_back" and checks["precision_after"] == "fp32" and checks["weights_restored"]
        and checks["nonfinite"] == 0 and checks["overflow_rate"] == 0
    )
    detail = (f"fault after {healthy} healthy calls caught {delay} calls later (limit {2 * every}; canary_every {every}), "
              f"{run.alarms} alarms in {run.canaries} canaries, ledger {checks['ledger_stage']}, "
              f"restored={checks['weights_restored']}, next trainer {checks['precision_after']}")
    return ScenarioResult("silent_degradation", bool(passed), detail, 0.0, checks)


def healthy_control(drill: "Drill") -> ScenarioResult:
    """A healthy reduced-precision model through HEALTHY_CANARIES canaries
    (one per call): no rollback; the false-alarm count is reported."""
    run = CanaryRun(drill, "drill_healthy_control", canary_every=1)
    rollbacks = 0
    while run.canaries < HEALTHY_CANARIES:
        rollbacks += run.train_call().action == "rollback"
    checks = {"canaries": run.canaries, "false_alarms": run.alarms, "rollbacks": rollbacks,
              "ledger_stage": drill.ledger.stage(run.agent), "precision": run.trainer.precision.name}
    passed = rollbacks == 0 and checks["ledger_stage"] == "on"
    detail = (f"{run.canaries} canaries on a healthy {checks['precision']} model: {run.alarms} false alarms, "
              f"{rollbacks} rollbacks, ledger {checks['ledger_stage']}")
    return ScenarioResult("healthy_control", bool(passed), detail, 0.0, checks)

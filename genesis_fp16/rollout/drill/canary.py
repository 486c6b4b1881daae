"""The canary scenarios: a model whose reduced-precision path is quietly
worse (no NaN, no overflow) is caught by the FP32 canary in stage ``on``, and
a healthy one is not.

Each agent trains through `genesis_fp16.training.guarded.GuardedTraining`, as the
world model does: a "training call" is ``STEPS`` optimizer steps on random
batches between ``begin_call`` and ``finish_call``; on every
``canary_every``-th call an FP32 copy takes the same batches from the same
weights, the guard compares the validation losses, and a confirmed gap is
rolled back through ``guard.recover()``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from genesis_fp16.rollout.guard import RollbackGuard
from genesis_fp16.training.guarded import CallReport, GuardedTraining
from genesis_fp16.base.seeds import torch_generator
from genesis_fp16.training.trainer import FP16Trainer
from genesis_fp16.rollout.drill.common import (
    REDUCED,
    DrillScratch,
    ScenarioResult,
    drill_data,
    model_and_optimizer,
    mse,
)

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

    def __init__(self, drill: DrillScratch, agent: str, **thresholds: Any) -> None:
        self.drill, self.agent = drill, agent
        drill.ledger.enable(agent, actor="drill", reason=f"drill: {agent}")
        self.model, optimizer = model_and_optimizer()
        self.guard = RollbackGuard(agent, settings=drill.settings, ledger=drill.ledger, thresholds=thresholds or None)
        self.training = GuardedTraining(
            agent,
            self.model,
            optimizer,
            settings=drill.settings,
            precision=REDUCED,
            guard=self.guard,
            checkpoint_dir=drill.state_dir,
            good_name=f"{agent}.good.pt",
            checkpoint_every=0,
        )
        self.x, self.y = drill.batch
        self.x_val, self.y_val = drill_data(seed=1)
        self.generator = torch_generator(0, "drill.canary")
        self.canaries = 0
        self.stats: dict[str, Any] = {}  # the reduced-precision trainer's statistics at the end of the last call

    def _val_loss(self, model: nn.Module, trainer: FP16Trainer) -> float:
        model.eval()
        with torch.no_grad(), trainer.autocast():
            return float(mse(model, (self.x_val, self.y_val)))

    def train_call(self) -> CallReport:
        """One training call; its report (a canary call is judged against FP32)."""
        self.training.begin_call()
        for _ in range(STEPS):
            idx = torch.randint(len(self.x), (16,), generator=self.generator)
            self.training.step((self.x[idx], self.y[idx]), mse)
        self.stats = self.training.trainer.get_stats()
        report = self.training.finish_call(self._val_loss)
        if report.reference == "canary" and report.fp32_val_loss is not None:
            self.canaries += 1
        return report

    @property
    def alarms(self) -> int:
        """Canaries the guard called an alarm (its records in the ledger)."""
        return sum(bool(c["alarm"]) for c in self.drill.ledger.quality_checks(self.agent, kind="canary"))


def silent_degradation(drill: DrillScratch) -> ScenarioResult:
    """Stage on, a fault injected after healthy calls: caught within
    2 x canary_every calls, ledger rolled_back, last good checkpoint restored,
    next trainer FP32."""
    run = CanaryRun(drill, "drill_silent_degradation")
    every = run.guard.canary_every
    healthy = max(1, every - 2)  # the fault starts between canaries, not on one
    for _ in range(healthy):
        report = run.train_call()
        run.training.save_good_checkpoint()
    good_weights = {k: v.clone() for k, v in run.model.state_dict().items()}
    hook = run.model.register_forward_hook(quantise_under_autocast)
    delay = None
    try:
        for call in range(1, 2 * every + 1):
            report = run.train_call()
            if report.rolled_back:
                delay = call
                break
    finally:
        hook.remove()
    decision = report.decision
    checks: dict[str, Any] = {
        "canary_every": every,
        "healthy_calls": healthy,
        "detection_delay_calls": delay,
        "canaries": run.canaries,
        "alarms": run.alarms,
        "severity": decision.severity if decision else None,
        "reason": decision.reason if decision else None,
        "ledger_stage": drill.ledger.stage(run.agent),
        "nonfinite": run.stats["nonfinite_losses"],
        "overflow_rate": run.stats["overflow_rate"],
        "restored": report.restored,
        "precision_after": run.training.trainer.precision.name,
        "weights_restored": all(torch.equal(good_weights[k], v) for k, v in run.model.state_dict().items()),
    }
    passed = (
        delay is not None
        and delay <= 2 * every
        and checks["severity"] == "P1"
        and "canary" in (checks["reason"] or "")
        and checks["ledger_stage"] == "rolled_back"
        and checks["precision_after"] == "fp32"
        and checks["weights_restored"]
        and checks["nonfinite"] == 0
        and checks["overflow_rate"] == 0
    )
    detail = (
        f"fault after {healthy} healthy calls caught {delay} calls later (limit {2 * every}; canary_every {every}), "
        f"{run.alarms} alarms in {run.canaries} canaries, ledger {checks['ledger_stage']}, "
        f"restored={checks['weights_restored']}, next trainer {checks['precision_after']}"
    )
    return ScenarioResult("silent_degradation", bool(passed), detail, 0.0, checks)


def healthy_control(drill: DrillScratch) -> ScenarioResult:
    """A healthy reduced-precision model through HEALTHY_CANARIES canaries
    (one per call): no rollback; the false-alarm count is reported."""
    run = CanaryRun(drill, "drill_healthy_control", canary_every=1)
    rollbacks = 0
    while run.canaries < HEALTHY_CANARIES:
        rollbacks += run.train_call().rolled_back
    checks = {
        "canaries": run.canaries,
        "false_alarms": run.alarms,
        "rollbacks": rollbacks,
        "ledger_stage": drill.ledger.stage(run.agent),
        "precision": run.training.trainer.precision.name,
    }
    passed = rollbacks == 0 and checks["ledger_stage"] == "on"
    detail = (
        f"{run.canaries} canaries on a healthy {checks['precision']} model: {run.alarms} false alarms, "
        f"{rollbacks} rollbacks, ledger {checks['ledger_stage']}"
    )
    return ScenarioResult("healthy_control", bool(passed), detail, 0.0, checks)

"""The decision of a trainer built without one: the seed API.

``FP16Trainer(model, optimizer, FP16TrainingConfig(precision="auto"))`` is
built by hand, with no agent, profile or ledger behind it. Its request is its
config's (`FP16TrainingConfig.request`); this module puts the settings over it
(the kill switch ``ENABLE_FP16_TRAINING=false`` beats every request, the bare
trainer's too, and says so in the decision's reason; with
``GENESIS_FP16_AUTO_PRECISION=rule`` ``auto`` is the flag rule) and decides
through `genesis_fp16.precision.decision.decide`. An ``auto`` that may be
measured waits for the trainer's first batch (`FirstBatch`): it runs the flag
rule's provisional choice until then, and is decided on that batch, on copies
(`genesis_fp16.precision.measure`), the host cache first. The trainer holds
the `FirstBatch` and hands it its first batch; it never decides itself.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch

from genesis_fp16.base.settings import AutoPrecision, PrecisionMode, Settings, load_settings
from genesis_fp16.precision.decision import PrecisionDecision, decide, provisional
from genesis_fp16.precision.measure import CopyTrainer, LossFn, measured_auto
from genesis_fp16.precision.request import PrecisionRequest, Source

KILL_SWITCH_REASON = "kill switch ENABLE_FP16_TRAINING=false"
FIRST_BATCH = "decided at the first batch"


class FirstBatch:
    """A bare trainer's ``auto``, waiting for its first batch to be measured on."""

    def __init__(self, precision: PrecisionRequest, settings: Settings) -> None:
        self.precision, self.settings = precision, settings

    def decide(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        batch: Any,
        loss_fn: LossFn,
        *,
        device: Union[str, torch.device],
        copy_trainer: CopyTrainer,
        when: str = FIRST_BATCH,
    ) -> PrecisionDecision:
        """The decision on ``batch``: the host cache's verdict for this workload, else a measurement on copies
        (``copy_trainer``) written there; the flag rule, saying why, where the workload cannot be measured."""
        found = measured_auto(
            model, optimizer, batch, loss_fn, copy_trainer=copy_trainer, device=device, settings=self.settings
        )
        return decide(
            self.precision, device, measured=found.calibration, cached=found.cached, unmeasured=found.why, when=when
        )

    def unmeasured(self, device: Union[str, torch.device], why: str, when: str = FIRST_BATCH) -> PrecisionDecision:
        """The flag rule's decision, with ``why`` the workload was not measured."""
        return decide(self.precision, device, unmeasured=why, when=when)


def under_settings(precision: PrecisionRequest, settings: Settings) -> PrecisionRequest:
    """``precision`` with the settings over it: switched off by the kill switch, and ``auto`` by the flag rule
    under ``GENESIS_FP16_AUTO_PRECISION=rule``."""
    if not settings.enable_fp16_training:
        precision = precision.switched_off(Source.KILL_SWITCH, KILL_SWITCH_REASON)
    if settings.auto_precision != AutoPrecision.MEASURE:
        precision = precision.replace(measure=False)
    return precision


def bare_decision(
    precision: PrecisionRequest, device: Union[str, torch.device], *, may_measure: bool = True
) -> tuple[PrecisionDecision, Optional[FirstBatch]]:
    """The decision of a trainer built without one, and the `FirstBatch` that decides its ``auto`` (None when the
    decision is final now). ``may_measure`` False (a trainer that cannot copy its model on one rank, FSDP2): the
    flag rule."""
    settings = load_settings(check_names=False)
    precision = under_settings(precision, settings)
    if precision.off or precision.mode != PrecisionMode.AUTO or not precision.measure or not may_measure:
        return decide(precision, device), None
    return provisional(precision, device), FirstBatch(precision, settings)

"""FP32 references for a reduced-precision model: the shadow (stage
``shadow``, kept for the whole rollout stage) and the canary (stage ``on``,
one every ``canary_every`` training calls) are the same thing, an FP32 copy
of the model and its optimizer state trained on the same batches, made by
`fp32_reference`. The rollback guard judges what they measure
(``RollbackGuard.check(..., reference=...)`` and ``check_policy_canary``).
"""

from __future__ import annotations

import copy
from typing import Optional

import torch

from genesis_fp16.base.vocabulary import PrecisionMode
from genesis_fp16.precision.decision import PrecisionDecision
from genesis_fp16.precision.request import Source
from genesis_fp16.training.trainer import FP16Trainer

SHADOW_SUFFIX = ".fp32_shadow"
CANARY_SUFFIX = ".fp32_canary"


def fp32_reference(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, trainer: FP16Trainer, name: str
) -> tuple[torch.nn.Module, FP16Trainer]:
    """An FP32 trainer over a copy of ``model`` and of ``optimizer``'s state
    (moments, step counts), with ``trainer``'s config: from here on it sees what
    the original sees, so any gap between them is precision. The optimizer
    state is deep-copied: ``load_state_dict`` alone may share tensors with the
    original, whose in-place updates would then move both."""
    reference = copy.deepcopy(model)
    ref_optimizer = type(optimizer)(reference.parameters(), **optimizer.defaults)
    ref_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    fp32 = PrecisionDecision(
        PrecisionMode.FP32, Source.EXPLICIT, "the FP32 reference", PrecisionMode.FP32, str(trainer.device)
    )
    return reference, FP16Trainer(reference, ref_optimizer, trainer.config, name=name, decision=fp32)


def canary_due(call: int, every: int) -> bool:
    """Whether training call number ``call`` (1, 2, ...) gets a canary: every
    ``every``-th call, never when ``every`` is 0. The first canary comes at
    call ``every``, so a degradation present from the start is seen twice by
    call ``2 * every`` (what a 2-of-3 confirmation needs)."""
    return every > 0 and call > 0 and call % every == 0


def policy_gap(
    logp: torch.Tensor,
    fp32_logp: torch.Tensor,
    value: Optional[torch.Tensor] = None,
    fp32_value: Optional[torch.Tensor] = None,
) -> dict[str, float]:
    """How far a reduced-precision policy is from FP32 on one held batch:
    ``kl`` (KL(FP32 || reduced) of the taken actions, the k3 estimator
    ``E[(r - 1) - log r]`` with ``r = p_reduced / p_fp32`` under FP32's
    samples; >= 0, as PPO's approx_kl), ``max_logp_delta`` (max |log-prob
    difference|) and ``max_value_delta`` (max |value difference| over
    max(1, max |FP32 value|); 0 without values)."""
    logratio = logp.float() - fp32_logp.float()
    kl = float(((logratio.exp() - 1) - logratio).mean())
    out = {"kl": kl, "max_logp_delta": float(logratio.abs().max())}
    if value is not None and fp32_value is not None:
        scale = max(1.0, float(fp32_value.float().abs().max()))
        out["max_value_delta"] = float((value.float() - fp32_value.float()).abs().max()) / scale
    else:
        out["max_value_delta"] = 0.0
    return out

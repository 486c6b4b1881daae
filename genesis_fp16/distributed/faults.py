"""Fault injection for drills, tests and ``scripts/train_distributed.py``: a
gradient that turns +inf on its way back, while the loss stays finite."""

from __future__ import annotations

from typing import Any, Optional

import torch


class _NonFiniteGrad(torch.autograd.Function):
    """Identity forward; backward makes the chosen features' gradient +inf."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, features: Optional[slice]) -> torch.Tensor:  # type: ignore[override]
        ctx.features = features
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        grad = grad.clone()
        if ctx.features is None:
            grad.fill_(float("inf"))
        else:
            grad[..., ctx.features] = float("inf")
        return grad, None


def inject_inf_grad(x: torch.Tensor, features: Optional[slice] = None) -> torch.Tensor:
    """Return ``x`` unchanged, but the gradient flowing back through it is +inf
    (in ``features`` of the last dimension only, when given). The loss stays
    finite, so only the scaler's overflow check can catch it."""
    return _NonFiniteGrad.apply(x, features)

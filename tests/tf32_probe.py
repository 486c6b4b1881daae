"""An identity op that records the CUDA matmul precision switch in its forward
and its backward: which TF32 setting each pass ran under (on any machine)."""

from __future__ import annotations

import torch


class RecordMatmulPrecision(torch.autograd.Function):
    seen: list = []

    @staticmethod
    def forward(ctx, x):
        RecordMatmulPrecision.seen.append(("forward", torch.backends.cuda.matmul.fp32_precision))
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        RecordMatmulPrecision.seen.append(("backward", torch.backends.cuda.matmul.fp32_precision))
        return grad

"""Every seed the project derives comes from one function, `stream_seed`.

A run has one seed (``--seed``); each random stream it draws from (the
CMA-ES normal draws, the start order, a generation's refinement, the world
model's initial weights, ...) is named, and its seed is a hash of (the run's
seed, the stream's name, its indices). Before this, each site salted the seed
by hand (the seed times a prime plus the generation, ``[seed, 11]``, ``10_000 + seed``):
two sites could pick colliding salts without anyone noticing, and a reader had
to find every site to know which streams exist. A name cannot collide by
accident, and a grep for it finds its one use.

Nothing here seeds torch's global generator (torch's ``manual_seed``): a
library that does so changes the draws of whatever else runs in the process
(the caller's own model, another run's). Modules are initialised from an
explicit `torch.Generator` instead (`init_parameters`).

torch is imported on first use only: the agents' modules that derive seeds
import without it.
"""

from __future__ import annotations

import hashlib
import math
import operator
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = ["init_parameters", "numpy_rng", "stream_seed", "torch_generator"]

SEED_BITS = 63
"""`stream_seed` is below 2^63: every seeding API takes it (``torch.Generator.manual_seed`` a signed 64-bit one)."""


def stream_seed(seed: int, stream: str, *index: int) -> int:
    """The seed of the random stream ``stream`` (a name, e.g. ``"learners.refine"``)
    at ``index`` (e.g. the generation) of a run seeded ``seed``: the first 63 bits
    of BLAKE2b over the three, so it is the same in every process and on every
    platform, and distinct names or indices give unrelated seeds."""
    if not isinstance(stream, str) or not stream:
        raise ValueError(f"stream={stream!r}: expected a non-empty name")
    parts = [str(operator.index(seed)), stream, *(str(operator.index(i)) for i in index)]
    digest = hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8, person=b"genesis-fp16").digest()
    return int.from_bytes(digest, "little") >> (64 - SEED_BITS)


def numpy_rng(seed: int, stream: str, *index: int) -> np.random.Generator:
    """A NumPy generator of the stream (`stream_seed`)."""
    return np.random.default_rng(stream_seed(seed, stream, *index))


def torch_generator(seed: int, stream: str, *index: int) -> "torch.Generator":
    """A private CPU `torch.Generator` of the stream (`stream_seed`); draw on the
    CPU and move the result, so a seed gives the same numbers on every device."""
    import torch

    return torch.Generator().manual_seed(stream_seed(seed, stream, *index))


def init_parameters(module: "torch.nn.Module", generator: "torch.Generator") -> "torch.nn.Module":
    """Re-initialise ``module``'s layers as their own ``reset_parameters`` does,
    with draws from ``generator`` instead of torch's global generator: Linear
    and convolutions (Kaiming-uniform weights, bias uniform within
    1/sqrt(fan_in)), Embedding (normal, the padding row zero) and RNN, LSTM and
    GRU (uniform within 1/sqrt(hidden)). Norm layers start at ones and zeros, as
    they are. A module with parameters of its own of any other kind raises
    TypeError: it would keep draws of the global generator, and the seed would
    not say what the weights are. Returns ``module``."""
    import torch
    from torch import nn

    norms = (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm, nn.modules.batchnorm._NormBase)
    with torch.no_grad():
        for sub in module.modules():
            if isinstance(sub, (nn.Linear, nn.modules.conv._ConvNd)):
                nn.init.kaiming_uniform_(sub.weight, a=math.sqrt(5), generator=generator)
                if sub.bias is not None:
                    fan_in, _ = nn.init._calculate_fan_in_and_fan_out(sub.weight)
                    bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
                    nn.init.uniform_(sub.bias, -bound, bound, generator=generator)
            elif isinstance(sub, nn.Embedding):
                nn.init.normal_(sub.weight, generator=generator)
                if sub.padding_idx is not None:
                    sub.weight[sub.padding_idx].fill_(0)
            elif isinstance(sub, nn.RNNBase):
                bound = 1 / math.sqrt(sub.hidden_size) if sub.hidden_size > 0 else 0.0
                for weight in sub.parameters(recurse=False):
                    nn.init.uniform_(weight, -bound, bound, generator=generator)
            elif not isinstance(sub, norms) and any(True for _ in sub.parameters(recurse=False)):
                raise TypeError(
                    f"init_parameters: {type(sub).__name__} holds parameters of its own and is not a layer "
                    "this knows; initialise it from the generator where it is defined"
                )
    return module

"""A small causal transformer over a byte vocabulary, and the RLHF cast.

The policy and the frozen reference are ``TinyLM``s; the reward model and the
value model are ``ScalarModel``s (a ``TinyLM`` trunk plus a scalar head), as
in RLHF where the critic is its own network. ``cast_copy`` gives a component
whose weights *and* arithmetic run in a dtype: a deep copy, converted, so the
FP32 original is never touched.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class TinyConfig:
    vocab_size: int = 128  # ASCII; data.py maps other bytes to '?'
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    max_len: int = 512  # longest sequence (prompt + generation) the probe and freeze take

    def to_dict(self) -> dict:
        return asdict(self)


def sinusoids(length: int, dim: int) -> torch.Tensor:
    """``[length, dim]`` sine/cosine position codes (Vaswani et al., 2017)."""
    pos = torch.arange(length, dtype=torch.float64).unsqueeze(1)
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(10000.0) / dim))
    out = torch.zeros(length, dim, dtype=torch.float64)
    out[:, 0::2] = torch.sin(pos * freq)
    out[:, 1::2] = torch.cos(pos * freq)
    return out.float()


class Block(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(), nn.Linear(4 * cfg.d_model, cfg.d_model)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        shape = (b, t, self.n_heads, d // self.n_heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        # explicit attention (not SDPA) so every dtype takes the same arithmetic path
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.n_heads)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, cfg: TinyConfig = TinyConfig()) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        # Fixed sinusoidal positions (a non-persistent buffer, not weights):
        # pretraining stays at short windows to stay quick, and a learned
        # table would leave every position past them at its random init.
        # Sinusoids give each position up to max_len a defined, smooth code,
        # and the checkpoint does not depend on max_len.
        self.register_buffer("pos", sinusoids(cfg.max_len, cfg.d_model), persistent=False)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        """Final hidden states ``[B, T, D]`` on the model's device."""
        tokens = tokens.to(self.tok.weight.device)
        t = tokens.shape[1]
        if t > self.cfg.max_len:
            raise ValueError(f"sequence length {t} exceeds the model's max_len {self.cfg.max_len}")
        x = self.tok(tokens) + self.pos[:t]
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, T, V]`` in the module's dtype, on the tokens' device
        (the model's arithmetic runs on its own device; see ``ScalarModel``)."""
        return self.head(self.hidden(tokens)).to(tokens.device)


class ScalarModel(nn.Module):
    """A trunk plus a scalar head, scaled by ``scale``. ``per_token`` gives
    ``[B, T]`` (value model), otherwise the mean-pooled ``[B]`` (reward model).

    ``scale`` is a plain float, not a weight or buffer: casting the model
    would round it (BF16 holds 1e4 as 9984, a -0.16% bias on every value).
    The head's output times ``scale`` is computed in FP32 or wider and rounded
    once to the model's dtype, so the values are what a correctly rounded
    multiply in that dtype gives.

    Like ``TinyLM``, it takes tokens on any device, runs on its own (CPU or
    a GPU) and returns its output on the tokens' device: the forensics data,
    sampling and FP64 metrics stay on the CPU while the models' arithmetic
    runs where ``--device`` puts them (gradients flow back across the copy)."""

    def __init__(self, trunk: TinyLM, per_token: bool, scale: float = 1.0) -> None:
        super().__init__()
        self.trunk = trunk
        self.per_token = per_token
        self.score = nn.Linear(trunk.cfg.d_model, 1)
        self.scale = float(scale)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.trunk.hidden(tokens)
        if not self.per_token:
            if mask is None:
                h = h.mean(dim=1)
            else:
                m = mask.to(h.device, h.dtype).unsqueeze(-1)
                h = (h * m).sum(dim=1) / m.sum(dim=1).clamp_min(1)
        out = self.score(h).squeeze(-1)
        wide = torch.promote_types(out.dtype, torch.float32)
        return (out.to(wide) * self.scale).to(out.dtype).to(tokens.device)


def cast_copy(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A deep copy whose parameters and buffers are in ``dtype``, in eval mode
    with gradients off (an inference/scoring component)."""
    twin = copy.deepcopy(module).to(dtype).eval()
    for p in twin.parameters():
        p.requires_grad_(False)
    return twin


def lm_loss(model: TinyLM, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1]).float()  # loss in FP32, as the AMP docs advise
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))

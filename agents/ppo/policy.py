"""The actor-critic policy: one network, its action distribution, and the
optional ``torch.compile`` wrapper of its forward.

Sampling uses noise drawn for a whole rollout at once from one generator
(Gumbel-max for discrete actions, ``mean + std * eps`` for continuous), so
chunked or per-env inference picks exactly the actions batched inference
picks. There are no ``torch.distributions`` objects: their argument
validation costs more than the forward of a 64-unit MLP.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from genesis_fp16.telemetry import get_logger

Forward = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def numpy_path(*tensors: torch.Tensor) -> bool:
    """Whether NumPy may compute on these tensors in place of torch: float32 on
    the CPU, outside torch.compile (the rule of `tanh`, `_Towers` and the fused
    loss tails in `agents.ppo.loss`)."""
    return not torch.compiler.is_compiling() and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)


def _numpy_tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.tanh(x.detach().numpy()))


class _NumpyTanh(torch.autograd.Function):
    """tanh through NumPy's vectorised kernel, the backward torch's own."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = _numpy_tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


def tanh(x: torch.Tensor) -> torch.Tensor:
    """``torch.tanh``; on a float32 CPU tensor computed by NumPy, whose tanh
    was several times faster than torch 2.13's on the CPU measured (the
    end-to-end effect: docs/PPO.md, "tanh through NumPy"), same values to
    float32 rounding. Other devices and dtypes (autocast's BF16/FP16), and
    code being compiled, use torch's."""
    if not numpy_path(x):
        return torch.tanh(x)
    if x.requires_grad and torch.is_grad_enabled():
        return _NumpyTanh.apply(x)
    return _numpy_tanh(x)


def _tanh_(x: torch.Tensor) -> torch.Tensor:
    """tanh in place, through NumPy (float32 CPU tensors only)."""
    x_np = x.numpy()
    np.tanh(x_np, out=x_np)
    return x


class _Towers(torch.autograd.Function):
    """`ActorCritic.forward` as one autograd node, float32 on the CPU: the same
    ops forward (so the same outputs, bit for bit), and backward the layers'
    gradients written out as a dozen matmuls and tanh-backward passes, where
    autograd would walk about fifteen nodes of a network whose every op costs
    more dispatch than arithmetic. Gradients agree with autograd's to float32
    rounding (``tests/test_ppo_ppo.py``)."""

    @staticmethod
    def forward(ctx: Any, obs: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor,
                wa: torch.Tensor, ba: torch.Tensor, wc: torch.Tensor, bc: torch.Tensor, hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
        h1 = _tanh_(torch.addmm(b1, obs, w1.t()))  # (B, 2H)
        x = h1.view(-1, 2, hidden).transpose(0, 1)  # (2, B, H)
        h2 = _tanh_(torch.baddbmm(b2, x, w2))
        out = torch.addmm(ba, h2[0], wa.t())
        value = torch.addmm(bc, h2[1], wc.t()).squeeze(-1)
        ctx.save_for_backward(obs, h1, h2, w2, wa, wc)
        return out, value

    @staticmethod
    def backward(ctx: Any, g_out: torch.Tensor, g_value: torch.Tensor) -> tuple[Any, ...]:
        obs, h1, h2, w2, wa, wc = ctx.saved_tensors
        g_value = g_value.unsqueeze(-1)  # (B, 1)
        g_h2 = torch.stack((g_out.mm(wa), g_value.mm(wc)))  # (2, B, H)
        g_z2 = torch.ops.aten.tanh_backward(g_h2, h2)
        x = h1.view(-1, 2, h2.shape[-1]).transpose(0, 1)
        g_w2 = torch.bmm(x.transpose(1, 2), g_z2)
        g_b2 = g_z2.sum(1, keepdim=True)
        g_h1 = torch.bmm(g_z2, w2.transpose(1, 2)).transpose(0, 1).reshape(h1.shape)
        g_z1 = torch.ops.aten.tanh_backward(g_h1, h1)
        return (None, g_z1.t().mm(obs), g_z1.sum(0), g_w2, g_b2, g_out.t().mm(h2[0]), g_out.sum(0),
                g_value.t().mm(h2[1]), g_value.sum(0), None)


def _layer(inp: int, out: int, std: float = math.sqrt(2)) -> nn.Linear:
    layer = nn.Linear(inp, out)
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, 0.0)
    return layer


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs (two tanh layers each, orthogonal init),
    the shape of SB3's default ``MlpPolicy`` so the benchmark compares like
    with like. The two towers are computed together: one matmul for both first
    layers (weights stacked) and one batched matmul for both second layers.
    That is exactly two independent MLPs (no weight is shared), with about
    half the kernel launches: a 64-unit MLP is launch-bound, not FLOP-bound
    (measured in docs/PPO.md)."""

    def __init__(self, obs_dim: int, act_dim: int, discrete: bool, hidden: int = 64) -> None:
        super().__init__()
        self.discrete = discrete
        self.hidden = hidden
        # rows [0:hidden] are the actor's first layer, rows [hidden:] the critic's
        self.w1 = nn.Parameter(torch.empty(2 * hidden, obs_dim))
        self.b1 = nn.Parameter(torch.zeros(2 * hidden))
        self.w2 = nn.Parameter(torch.empty(2, hidden, hidden))  # [actor, critic], (in, out)
        self.b2 = nn.Parameter(torch.zeros(2, 1, hidden))
        self.actor_head = _layer(hidden, act_dim, 0.01)
        self.critic_head = _layer(hidden, 1, 1.0)
        for block in (self.w1[:hidden], self.w1[hidden:]):
            nn.init.orthogonal_(block, math.sqrt(2))
        for i in range(2):
            nn.init.orthogonal_(self.w2.data[i], math.sqrt(2))
        self.log_std = nn.Parameter(torch.zeros(act_dim), requires_grad=not discrete)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(actor output: logits or mean, value). Training in float32 on the CPU
        (outside autocast and torch.compile) goes through `_Towers`: the same
        outputs, one autograd node."""
        if (torch.is_grad_enabled() and self.w1.requires_grad and not torch.is_autocast_enabled("cpu")
                and numpy_path(obs, self.w1)):
            return _Towers.apply(obs, self.w1, self.b1, self.w2, self.b2, self.actor_head.weight, self.actor_head.bias,
                                 self.critic_head.weight, self.critic_head.bias, self.hidden)
        h = tanh(torch.addmm(self.b1, obs, self.w1.t()))  # (B, 2H)
        h = h.view(-1, 2, self.hidden).transpose(0, 1)  # (2, B, H)
        h = tanh(torch.baddbmm(self.b2, h, self.w2))
        # F.linear, not the modules' __call__: hook dispatch costs more than these matmuls
        out = F.linear(h[0], self.actor_head.weight, self.actor_head.bias)
        return out, F.linear(h[1], self.critic_head.weight, self.critic_head.bias).squeeze(-1)

    def log_prob_entropy(
        self, out: torch.Tensor, actions: torch.Tensor, with_entropy: bool = True
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Log-probability of ``actions`` under the actor output ``out`` and the
        entropy (None when not asked for), in float32."""
        out = out.float()
        if self.discrete:
            logp_all = torch.log_softmax(out, dim=-1)
            logp = logp_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
            entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
            return logp, entropy
        log_std = self.log_std.float().expand_as(out)
        std = log_std.exp()
        logp = (-((actions - out) ** 2) / (2 * std * std) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        entropy = (0.5 + 0.5 * math.log(2 * math.pi) + log_std).sum(-1) if with_entropy else None
        return logp, entropy

    def actor(self, obs: torch.Tensor) -> torch.Tensor:
        """The actor's output alone (logits or mean): the rollout's per-step
        forward. The values and log-probabilities of a rollout come from one
        `forward` over all of it afterwards (the policy does not change
        during a rollout), so each step runs half the network in five ops."""
        h = self.hidden
        x = tanh(torch.addmm(self.b1[:h], obs, self.w1[:h].t()))
        x = tanh(torch.addmm(self.b2[0, 0], x, self.w2[0]))
        return F.linear(x, self.actor_head.weight, self.actor_head.bias)

    def rollout_actor(self, perturbation: torch.Tensor) -> Callable[[torch.Tensor, int], torch.Tensor]:
        """``step(obs, t)``: ``pick(actor(obs), perturbation[t])`` for step ``t`` of
        one rollout on the CPU in float32, bit for bit, with less per-step work:
        the weights are taken as views once (the policy does not change during a
        rollout), tanh runs in place, no new tensor but the matmuls' outputs.
        (``F.linear`` with a bias is ``addmm`` with the transposed weight.)"""
        h = self.hidden
        with torch.no_grad():
            w1, b1 = self.w1[:h].t(), self.b1[:h]
            w2, b2 = self.w2[0], self.b2[0, 0]
            w3, b3 = self.actor_head.weight.t(), self.actor_head.bias
        pert = perturbation.float()

        def step(obs: torch.Tensor, t: int) -> torch.Tensor:
            with torch.inference_mode():
                x = _tanh_(torch.addmm(b2, _tanh_(torch.addmm(b1, obs, w1)), w2))
                out = torch.addmm(b3, x, w3)
                return torch.argmax(out.add_(pert[t]), dim=-1) if self.discrete else out.add_(pert[t])

        return step

    def perturbation(self, noise: torch.Tensor) -> torch.Tensor:
        """What sampling adds to the actor output, from pre-drawn noise
        (uniform for discrete actions: Gumbel noise, whose argmax with the
        logits is a categorical sample; standard normal for continuous ones:
        scaled by the standard deviation). Computed once for a whole rollout."""
        if self.discrete:
            return -torch.log(-torch.log(noise.clamp(1e-20, 1.0 - 1e-7)))
        return self.log_std.float().exp() * noise

    def pick(self, out: torch.Tensor, perturbation: torch.Tensor) -> torch.Tensor:
        """Actions from the actor output and this step's `perturbation`: deterministic given the noise."""
        if self.discrete:
            return torch.argmax(out.float() + perturbation, dim=-1)
        return out.float() + perturbation


class CompiledFallback:
    """Calls ``torch.compile(fn)``; if compiling or running it raises, logs the
    reason once and runs ``fn`` eagerly from then on."""

    def __init__(self, fn: Callable[..., Any], mode: str, name: str) -> None:
        self.eager = fn
        self.name = name
        self.mode = mode
        self.failed_reason: Optional[str] = None
        try:
            self.compiled: Optional[Callable[..., Any]] = torch.compile(fn, mode=mode)
        except Exception as exc:  # noqa: BLE001 - any failure means: run eagerly
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        self.compiled = None
        self.failed_reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        get_logger("agents.ppo").warning("ppo.compile_fallback", function=self.name, mode=self.mode, reason=self.failed_reason)

    @property
    def active(self) -> bool:
        return self.compiled is not None

    def __call__(self, *args: Any) -> Any:
        if self.compiled is not None:
            try:
                return self.compiled(*args)
            except Exception as exc:  # noqa: BLE001
                self._fail(exc)
        return self.eager(*args)

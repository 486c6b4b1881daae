"""PPO's loss for one minibatch, two ways that give the same numbers:

* `ppo_loss`: written with torch ops; autograd records about 40 nodes and
  replays them backward. Any precision (autocast), any forward (a compiled one).
* `fused_ppo_loss`: the same forward, but the gradient of every parameter is
  written out (`FusedPPOLoss`, one autograd node). A 64-unit actor-critic is
  launch-bound: on a CPU each torch op costs microseconds of dispatch
  whatever its size, so fewer ops in the backward is what makes the update
  faster (measured in docs/PPO.md). FP32 only: under autocast, and for the
  clipped value loss, `ppo_loss` runs (`can_fuse`).

``tests/test_ppo_loss.py`` checks the two give the same loss, diagnostics and
gradients (discrete and continuous actions, clipped and unclipped ratios,
advantage normalisation on and off, an entropy bonus).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from .policy import ActorCritic

Diagnostics = dict[str, torch.Tensor]
LOG_2PI = math.log(2 * math.pi)


@dataclass(frozen=True)
class LossSettings:
    """The config values the loss reads (``PPOConfig``'s of the same names)."""

    clip_coef: float
    vf_coef: float
    ent_coef: float
    norm_adv: bool
    clip_vloss: bool

    @classmethod
    def of(cls, cfg: Any) -> "LossSettings":
        return cls(float(cfg.clip_coef), float(cfg.vf_coef), float(cfg.ent_coef), bool(cfg.norm_adv), bool(cfg.clip_vloss))


def can_fuse(settings: LossSettings) -> bool:
    """Whether `fused_ppo_loss` computes this loss here: FP32 (no autocast
    active on any device type the loss could run on) and no value clipping."""
    return not settings.clip_vloss and not torch.is_autocast_enabled("cpu") and not torch.is_autocast_enabled("cuda")


def _normalised(adv: torch.Tensor, on: bool) -> torch.Tensor:
    return (adv - adv.mean()) / (adv.std() + 1e-8) if on else adv


def ppo_loss(
    net: ActorCritic, forward: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]], mb: dict[str, torch.Tensor], s: LossSettings,
) -> tuple[torch.Tensor, Diagnostics]:
    """(loss, diagnostics) through autograd; the diagnostics are detached
    scalars: pg_loss, v_loss, entropy, approx_kl."""
    out, value = forward(mb["obs"])
    newlogp, entropy = net.log_prob_entropy(out, mb["act"])
    logratio = newlogp - mb["logp"]
    ratio = logratio.exp()
    adv = _normalised(mb["adv"], s.norm_adv)
    pg_loss = -torch.min(adv * ratio, adv * ratio.clamp(1 - s.clip_coef, 1 + s.clip_coef)).mean()
    value = value.float()
    if s.clip_vloss:
        v_unclipped = (value - mb["ret"]) ** 2
        v_clipped = mb["val"] + torch.clamp(value - mb["val"], -s.clip_coef, s.clip_coef)
        v_loss = 0.5 * torch.max(v_unclipped, (v_clipped - mb["ret"]) ** 2).mean()
    else:
        v_loss = 0.5 * (value - mb["ret"]).square().mean()
    entropy = entropy.mean()
    loss = pg_loss + s.vf_coef * v_loss
    if s.ent_coef:
        loss = loss - s.ent_coef * entropy
    with torch.no_grad():
        approx_kl = ((ratio - 1) - logratio).mean()
    return loss, {"pg_loss": pg_loss.detach(), "v_loss": v_loss.detach(), "entropy": entropy.detach(), "approx_kl": approx_kl}


class FusedPPOLoss(torch.autograd.Function):
    """The PPO loss of an `ActorCritic` as one autograd node. ``forward``
    runs the network as `ActorCritic.forward` does (the same ops, so the
    same numbers) and keeps what the backward needs; ``backward`` computes
    the gradient of each parameter with a few matmuls (the chain rule
    through the heads, the second layers (batched) and the first layer).
    Returns the loss and, not differentiable, the four diagnostics stacked."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, obs: torch.Tensor, act: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, ret: torch.Tensor,
        w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor, wa: torch.Tensor, ba: torch.Tensor,
        wc: torch.Tensor, bc: torch.Tensor, log_std: torch.Tensor, discrete: bool, s: LossSettings,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n, hidden = obs.shape[0], w2.shape[1]
        h1 = torch.tanh(torch.addmm(b1, obs, w1.t()))  # (B, 2H)
        h2 = torch.tanh(torch.baddbmm(b2, h1.view(n, 2, hidden).transpose(0, 1), w2))  # (2, B, H)
        out = torch.addmm(ba, h2[0], wa.t())
        value = torch.addmm(bc, h2[1], wc.t()).squeeze(-1)
        if discrete:
            logp_all = torch.log_softmax(out, dim=-1)
            logp = logp_all.gather(-1, act.unsqueeze(-1)).squeeze(-1)
            probs = logp_all.exp()
            entropy_each = -(probs * logp_all).sum(-1)
            diff = None
        else:
            std = log_std.exp()
            diff = (act - out) / std  # (B, A): the standardised action
            logp = (-0.5 * diff.square() - log_std).sum(-1) - 0.5 * LOG_2PI * out.shape[-1]
            entropy_each = (0.5 + 0.5 * LOG_2PI + log_std).sum().expand(n)
            probs = logp_all = None
        logratio = logp - old_logp
        ratio = logratio.exp()
        a = _normalised(adv, s.norm_adv)
        unclipped, clipped = a * ratio, a * ratio.clamp(1 - s.clip_coef, 1 + s.clip_coef)
        pg_loss = -torch.min(unclipped, clipped).mean()
        verr = value - ret
        v_loss = 0.5 * verr.square().mean()
        entropy = entropy_each.mean()
        loss = pg_loss + s.vf_coef * v_loss - s.ent_coef * entropy
        approx_kl = ((ratio - 1) - logratio).mean()
        # d pg_loss / d logp: the unclipped term's gradient where it is the smaller one or the ratio is inside the clip
        # range (there both terms are equal and both carry the gradient; torch.min splits it, the halves add up)
        inside = (ratio >= 1 - s.clip_coef) & (ratio <= 1 + s.clip_coef)
        g_logp = torch.where(inside | (unclipped < clipped), a * ratio, torch.zeros_like(ratio)).mul_(-1.0 / n)
        ctx.save_for_backward(obs, w2, wa, wc, h1, h2, g_logp, verr, probs, logp_all, diff, log_std, act)
        ctx.discrete, ctx.s, ctx.n = discrete, s, n
        diagnostics = torch.stack([pg_loss, v_loss, entropy, approx_kl]).detach()
        ctx.mark_non_differentiable(diagnostics)
        return loss, diagnostics

    @staticmethod
    def backward(ctx: Any, g_loss: torch.Tensor, _g_diag: Optional[torch.Tensor]) -> tuple[Optional[torch.Tensor], ...]:
        obs, w2, wa, wc, h1, h2, g_logp, verr, probs, logp_all, diff, log_std, act = ctx.saved_tensors
        s, n = ctx.s, ctx.n
        g_logp = g_logp * g_loss
        g_value = verr * (s.vf_coef / n) * g_loss  # (B,)
        g_log_std = None
        if ctx.discrete:
            # d logp / d out = onehot(act) - p;  d entropy / d out = -p (log p + H)
            g_out = probs * (-g_logp).unsqueeze(-1)
            g_out.scatter_add_(-1, act.unsqueeze(-1), g_logp.unsqueeze(-1))
            if s.ent_coef:
                entropy_each = -(probs * logp_all).sum(-1, keepdim=True)
                g_out += (probs * (logp_all + entropy_each)) * (s.ent_coef / n) * g_loss
        else:
            std = log_std.exp()
            # d logp / d mean = diff / std;  d logp / d log_std = diff^2 - 1;  d entropy_mean / d log_std = 1
            g_out = diff / std * g_logp.unsqueeze(-1)
            g_log_std = (diff.square() - 1).mul_(g_logp.unsqueeze(-1)).sum(0) - s.ent_coef * g_loss
        g_wa, g_ba = g_out.t() @ h2[0], g_out.sum(0)
        g_wc, g_bc = g_value.unsqueeze(0) @ h2[1], g_value.sum().reshape(1)
        g_h2 = torch.stack([g_out @ wa, g_value.unsqueeze(-1) * wc])  # (2, B, H)
        g_z2 = g_h2.mul_(1 - h2.square())
        hidden = w2.shape[1]
        h1_t = h1.view(n, 2, hidden).transpose(0, 1)  # (2, B, H)
        g_w2 = torch.bmm(h1_t.transpose(1, 2), g_z2)  # (2, H, H)
        g_b2 = g_z2.sum(1, keepdim=True)  # (2, 1, H)
        g_h1 = torch.bmm(g_z2, w2.transpose(1, 2)).transpose(0, 1).reshape(n, 2 * hidden)
        g_z1 = g_h1.mul_(1 - h1.square())
        g_w1, g_b1 = g_z1.t() @ obs, g_z1.sum(0)
        return (None, None, None, None, None, g_w1, g_b1, g_w2, g_b2, g_wa, g_ba, g_wc, g_bc, g_log_std, None, None)


def fused_ppo_loss(net: ActorCritic, mb: dict[str, torch.Tensor], s: LossSettings) -> tuple[torch.Tensor, Diagnostics]:
    """`ppo_loss` of ``net`` through `FusedPPOLoss`: the same (loss, diagnostics)."""
    act = mb["act"].long() if net.discrete else mb["act"]
    loss, diag = FusedPPOLoss.apply(
        mb["obs"], act, mb["logp"], mb["adv"], mb["ret"], net.w1, net.b1, net.w2, net.b2, net.actor_head.weight, net.actor_head.bias,
        net.critic_head.weight, net.critic_head.bias, net.log_std, net.discrete, s,
    )
    return loss, dict(zip(("pg_loss", "v_loss", "entropy", "approx_kl"), diag.unbind()))

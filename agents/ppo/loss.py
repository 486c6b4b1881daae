"""PPO's loss for one minibatch: the clipped surrogate, the value loss
(optionally clipped) and the entropy bonus, with per-minibatch advantage
normalisation. ``pg_loss + vf_coef * MSE(value, return) - ent_coef * entropy``,
as Stable-Baselines3 writes it (CleanRL halves the MSE: its ``vf_coef`` 0.5 is
0.25 here); with separate actor and critic networks the weight reaches the
policy's step only through the global gradient-norm clip. Written for few ops: a 64-unit network is launch-bound, so
every op in the forward (and its node in the backward) shows in updates/s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .policy import ActorCritic, Forward

Diagnostics = dict[str, torch.Tensor]


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


def _normalised(adv: torch.Tensor, on: bool) -> torch.Tensor:
    return (adv - adv.mean()) / (adv.std() + 1e-8) if on else adv


def ppo_loss(
    net: ActorCritic, forward: Forward, mb: dict[str, torch.Tensor], s: LossSettings,
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
        v_loss = torch.max(v_unclipped, (v_clipped - mb["ret"]) ** 2).mean()
    else:
        v_loss = (value - mb["ret"]).square().mean()  # SB3's value loss, the plain MSE (CleanRL halves it)
    entropy = entropy.mean()
    loss = pg_loss + s.vf_coef * v_loss
    if s.ent_coef:
        loss = loss - s.ent_coef * entropy
    with torch.no_grad():
        approx_kl = ((ratio - 1) - logratio).mean()
    return loss, {"pg_loss": pg_loss.detach(), "v_loss": v_loss.detach(), "entropy": entropy.detach(), "approx_kl": approx_kl}

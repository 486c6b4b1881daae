"""PPO's loss for one minibatch: the clipped surrogate, the value loss
(optionally clipped) and the entropy bonus, with per-minibatch advantage
normalisation. ``pg_loss + vf_coef * MSE(value, return) - ent_coef * entropy``,
as Stable-Baselines3 writes it (CleanRL halves the MSE: its ``vf_coef`` 0.5 is
0.25 here); with separate actor and critic networks the weight reaches the
policy's step only through the global gradient-norm clip. Written for few ops: a 64-unit network is launch-bound, so
every op in the forward (and its node in the backward) shows in updates/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .policy import ActorCritic, Forward, numpy_path

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


_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
_DIAGNOSTICS = ("pg_loss", "v_loss", "entropy", "approx_kl")


_add = np.add.reduce  # sums as np.add.reduce and np.dot: ndarray.mean and .std are Python-level wrappers, several us each


def _ppo_terms(
    logp: np.ndarray, logp_old: np.ndarray, adv: np.ndarray, v: np.ndarray, ret: np.ndarray, s: LossSettings,
) -> tuple[float, float, float, np.ndarray, np.ndarray]:
    """The policy-independent part of the fused loss, from the new log-probabilities:
    (pg_loss, v_loss, approx_kl, active, vd). ``active`` is d(-pg_loss * n)/d logp: the
    normalised advantage times the ratio where the unclipped term is the minimum (ties
    included: torch splits a tie's gradient and the clamp passes its share inside the
    range), else 0; ``vd`` the value error."""
    n = v.shape[0]
    logratio = logp - logp_old
    ratio = np.exp(logratio)
    if s.norm_adv:
        centred = adv - _add(adv) / n
        adv = centred / (math.sqrt(float(np.dot(centred, centred)) / (n - 1)) + 1e-8)  # torch's std: the unbiased one
    unclipped = adv * ratio
    clipped = adv * np.minimum(np.maximum(ratio, 1 - s.clip_coef), 1 + s.clip_coef)
    pg_loss = -float(_add(np.minimum(unclipped, clipped))) / n
    vd = v - ret
    v_loss = float(np.dot(vd, vd)) / n
    approx_kl = (float(_add(ratio)) - n - float(_add(logratio))) / n
    unclipped *= unclipped <= clipped
    return pg_loss, v_loss, approx_kl, unclipped, vd


def _outputs(
    ctx: Any, pg_loss: float, v_loss: float, entropy: float, approx_kl: float, s: LossSettings,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The node's outputs: the loss, and the diagnostics (not differentiable)."""
    diagnostics = torch.from_numpy(np.array([pg_loss, v_loss, entropy, approx_kl], dtype=np.float32))
    ctx.mark_non_differentiable(diagnostics)
    loss = pg_loss + s.vf_coef * v_loss - s.ent_coef * entropy
    return torch.tensor(loss, dtype=torch.float32), diagnostics


def _backward_terms(active: np.ndarray, vd: np.ndarray, gl: float, s: LossSettings) -> tuple[np.ndarray, torch.Tensor]:
    """(d loss / d logp, d loss / d value) for an upstream gradient ``gl``."""
    n = vd.shape[0]
    return active * np.float32(-gl / n), torch.from_numpy(vd * np.float32(gl * 2.0 * s.vf_coef / n))


class _GaussianLossTail(torch.autograd.Function):
    """The loss from the network's outputs on for a Gaussian policy (log-prob,
    ratio, clipped surrogate, value MSE, entropy bonus) as one autograd node:
    NumPy on the float32 CPU arrays forward, the gradients with respect to the
    mean, the value and ``log_std`` written out backward. The unfused loss is
    about 30 small torch ops forward and 25 autograd nodes backward, each
    costing more dispatch than arithmetic at minibatch 256; this is about 25
    NumPy calls. The values and gradients agree with the unfused loss to
    float32 rounding (``tests/test_ppo_loss.py``)."""

    @staticmethod
    def forward(ctx: Any, mean: torch.Tensor, value: torch.Tensor, log_std: torch.Tensor, act: torch.Tensor,
                logp_old: torch.Tensor, adv: torch.Tensor, ret: torch.Tensor, s: LossSettings) -> tuple[torch.Tensor, torch.Tensor]:
        mu, ls = mean.detach().numpy(), log_std.detach().numpy()
        d = act.numpy() - mu
        inv_var = np.exp(-2.0 * ls)
        dz = d * d
        dz *= inv_var
        logp = _add(dz, axis=1)
        logp *= -0.5
        logp -= _add(ls) + _HALF_LOG_2PI * ls.size
        pg_loss, v_loss, approx_kl, active, vd = _ppo_terms(logp, logp_old.numpy(), adv.numpy(), value.detach().numpy(), ret.numpy(), s)
        ctx.saved = (d, inv_var, dz, active, vd, s)
        return _outputs(ctx, pg_loss, v_loss, float(_add(ls)) + (0.5 + _HALF_LOG_2PI) * ls.size, approx_kl, s)

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor, _grad_diagnostics: Any) -> tuple[Any, ...]:
        d, inv_var, dz, active, vd, s = ctx.saved
        gl = float(grad_loss)
        g, d_value = _backward_terms(active, vd, gl, s)
        d_mean = g[:, None] * inv_var  # d logp / d mean = (a - mean) / var
        d_mean *= d
        d_log_std = np.dot(g, dz) - (_add(g) + np.float32(gl * s.ent_coef))  # sum_i g_i (dz_ij - 1) - ent_coef
        return (torch.from_numpy(d_mean), d_value, torch.from_numpy(d_log_std.astype(np.float32, copy=False)),
                None, None, None, None, None)


class _CategoricalLossTail(torch.autograd.Function):
    """`_GaussianLossTail` for a categorical policy: the log-softmax of the
    logits, the taken actions' log-probabilities and the entropy in NumPy
    forward, the gradient with respect to the logits and the value written out
    backward (d logp / d z = onehot - p; d entropy / d z = -p (log p + H))."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, value: torch.Tensor, act: torch.Tensor, logp_old: torch.Tensor,
                adv: torch.Tensor, ret: torch.Tensor, s: LossSettings) -> tuple[torch.Tensor, torch.Tensor]:
        z = logits.detach().numpy()
        rows, taken = np.arange(z.shape[0]), act.numpy().astype(np.int64)
        shifted = z - np.maximum.reduce(z, axis=1)[:, None]
        e = np.exp(shifted)
        total = _add(e, axis=1)
        logp_all = shifted - np.log(total)[:, None]
        p = e / total[:, None]
        entropy = -_add(p * logp_all, axis=1)
        pg_loss, v_loss, approx_kl, active, vd = _ppo_terms(logp_all[rows, taken], logp_old.numpy(), adv.numpy(),
                                                           value.detach().numpy(), ret.numpy(), s)
        ctx.saved = (rows, taken, p, logp_all, entropy, active, vd, s)
        return _outputs(ctx, pg_loss, v_loss, float(_add(entropy)) / z.shape[0], approx_kl, s)

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor, _grad_diagnostics: Any) -> tuple[Any, ...]:
        rows, taken, p, logp_all, entropy, active, vd, s = ctx.saved
        gl = float(grad_loss)
        g, d_value = _backward_terms(active, vd, gl, s)
        d_logits = p * -g[:, None]
        d_logits[rows, taken] += g
        if s.ent_coef:
            d_logits += p * (logp_all + entropy[:, None]) * np.float32(gl * s.ent_coef / vd.shape[0])
        return torch.from_numpy(d_logits), d_value, None, None, None, None, None


def _fused(out: torch.Tensor, value: torch.Tensor, s: LossSettings) -> bool:
    """Whether a fused tail serves this call: `numpy_path` (autocast's BF16/FP16, other devices and compiled
    code keep the unfused ops) and no value clipping."""
    return not s.clip_vloss and numpy_path(out, value)


def ppo_loss(
    net: ActorCritic, forward: Forward, mb: dict[str, torch.Tensor], s: LossSettings,
) -> tuple[torch.Tensor, Diagnostics]:
    """(loss, diagnostics) through autograd; the diagnostics are detached
    scalars: pg_loss, v_loss, entropy, approx_kl. In float32 on the CPU it
    goes through `_GaussianLossTail` or `_CategoricalLossTail` (same values
    and gradients, fewer ops); the rest through `unfused_loss`."""
    out, value = forward(mb["obs"])
    if _fused(out, value, s):
        if net.discrete:
            loss, diag = _CategoricalLossTail.apply(out, value, mb["act"], mb["logp"], mb["adv"], mb["ret"], s)
        else:
            loss, diag = _GaussianLossTail.apply(out, value, net.log_std, mb["act"], mb["logp"], mb["adv"], mb["ret"], s)
        return loss, dict(zip(_DIAGNOSTICS, diag.unbind()))
    return unfused_loss(net, out, value, mb, s)


def unfused_loss(
    net: ActorCritic, out: torch.Tensor, value: torch.Tensor, mb: dict[str, torch.Tensor], s: LossSettings,
) -> tuple[torch.Tensor, Diagnostics]:
    """The loss in torch ops from the network's outputs ``out`` and ``value``: every
    policy, precision and device."""
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

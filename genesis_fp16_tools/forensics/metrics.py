"""H1-H4 metrics on the same tokens as their reference values.

H1, H2 and H4 compare a configuration with an FP64 ground truth (the probe
and replay; the sweep's H2 compares with its FP32 reward model, since its
masters are FP32). H3's stagnation compares the value model with itself,
before and after one optimizer step on one fixed batch.

Conventions: ``tokens`` is ``[B, T]``; log-probabilities are of the *taken*
tokens only, ``[B, T-1]`` (position t predicts token t+1), with a ``[B, T-1]``
boolean mask. Nothing here is measured over the whole vocabulary.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

NEAR_ZERO = 1e-3  # |log ratio| below this counts as "near zero" (documented in FORENSICS.md)


# -- log-probabilities and KL (H1) ---------------------------------------------


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``log_softmax`` in ``dtype`` (default: the logits' dtype) over
    ``logits[:, :-1]``, gathered at ``tokens[:, 1:]``: ``[B, T-1]`` in ``dtype``."""
    if logits.shape[:2] != tokens.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and tokens {tuple(tokens.shape)} disagree on [B, T]")
    lg = logits[:, :-1]
    if dtype is not None:
        lg = lg.to(dtype)
    logp = torch.log_softmax(lg, dim=-1)
    return logp.gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)


def _wide(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float64 else x.float()


def kl_k1(x: torch.Tensor) -> torch.Tensor:
    """k1 = x, for x = logp_policy - logp_ref on samples from the policy."""
    return _wide(x)


def kl_k3(x: torch.Tensor) -> torch.Tensor:
    """k3 = exp(-x) - 1 + x for x = logp_policy - logp_ref, samples from the
    policy: unbiased for KL(policy || reference) and >= 0. Computed as
    ``expm1(-x) + x`` in FP32 or wider (expm1 keeps small |x| accurate).
    Not exp(x) - 1 - x, which estimates chi^2 - KL."""
    x = _wide(x)
    return torch.expm1(-x) + x


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    m = mask.to(torch.float64)
    return float((values.to(torch.float64) * m).sum() / m.sum().clamp_min(1))


def kl_report(x: torch.Tensor, x64: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """H1: the configuration's log ratio ``x`` (any dtype) against the FP64 one."""
    kl = masked_mean(kl_k3(x), mask)
    kl64 = masked_mean(kl_k3(x64), mask)
    sel = mask.bool()
    xs, x64s = x[sel].to(torch.float64), x64[sel]
    return {
        "kl_fp64": kl64,
        "kl_penalty_mean": kl,
        "kl_abs_err": abs(kl - kl64),
        "kl_rel_err": abs(kl - kl64) / kl64 if kl64 > 0 else float("nan"),
        "kl_k1_mean": masked_mean(kl_k1(x), mask),
        "kl_k1_fp64": masked_mean(x64, mask),
        "log_ratio_near_zero_frac": float((xs.abs() < NEAR_ZERO).double().mean()) if xs.numel() else float("nan"),
        "log_ratio_near_zero_frac_fp64": float((x64s.abs() < NEAR_ZERO).double().mean())
        if xs.numel()
        else float("nan"),
        "log_ratio_exact_zero_frac": float((xs == 0).double().mean()) if xs.numel() else float("nan"),
        "log_ratio_abs_err_mean": float((xs - x64s).abs().mean()) if xs.numel() else float("nan"),
    }


# -- spacing (H2, H3) ----------------------------------------------------------


def ulp(values: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Spacing at each value in ``dtype`` (default: the values' dtype): for v
    rounded to dtype, ``nextafter(|v|, inf) - |v|`` in that dtype, returned
    as FP64. BF16 at 1e4 gives 64; FP16 at 1000 gives 0.5."""
    dtype = dtype or values.dtype
    a = values.to(dtype).abs()
    up = torch.nextafter(a, torch.full_like(a, math.inf))
    return up.to(torch.float64) - a.to(torch.float64)


def _median(x: torch.Tensor) -> float:
    return float(x.to(torch.float64).median()) if x.numel() else float("nan")


def kendall_tau(a: np.ndarray, b: np.ndarray) -> float:
    """Kendall tau-b (ties in either ranking handled); NaN when undefined."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    i, j = np.triu_indices(len(a), k=1)
    da, db = np.sign(a[i] - a[j]), np.sign(b[i] - b[j])
    n0 = len(i)
    n1, n2 = int((da == 0).sum()), int((db == 0).sum())
    denom = math.sqrt((n0 - n1) * (n0 - n2))
    return float((da * db).sum() / denom) if denom > 0 else float("nan")


def reward_report(rewards: torch.Tensor, rewards_truth: torch.Tensor) -> dict[str, float]:
    """H2 on a batch of sequence rewards (in the reward model's dtype) against
    the reference reward model's rewards on the same sequences (FP64 in the
    probe and replay; FP32 in the sweep, whose masters are FP32). Resolution is the
    ULP of each reward, not the gap between sorted values (which is spread)."""
    u = ulp(rewards)
    r64 = rewards.to(torch.float64)
    f = rewards_truth.to(torch.float64)
    i, j = np.triu_indices(len(r64), k=1)
    r_np, f_np = r64.numpy(), f.numpy()
    new_ties = (r_np[i] == r_np[j]) & (f_np[i] != f_np[j])
    return {
        "reward_resolution_median": _median(u),
        "reward_resolution_rel_median": _median(u / r64.abs().clamp_min(torch.finfo(torch.float64).tiny)),
        "reward_tie_rate": float(new_ties.mean()) if len(i) else float("nan"),
        "reward_kendall_tau": kendall_tau(r_np, f_np),
        "reward_abs_err_mean": float((r64 - f).abs().mean()),
    }


def stagnation_rate(before: torch.Tensor, after: torch.Tensor, mask: Optional[torch.Tensor] = None) -> float:
    """Fraction of positions of ONE fixed probe batch whose value is bitwise
    unchanged across one optimizer step (``before`` and ``after`` must come
    from the same inputs)."""
    if before.shape != after.shape:
        raise ValueError(
            f"before {tuple(before.shape)} and after {tuple(after.shape)}: stagnation needs the same probe batch"
        )
    same = before == after
    finite = torch.isfinite(before) & torch.isfinite(after)
    if mask is not None:
        same, finite = same[mask.bool()], finite[mask.bool()]
    # a value that became NaN/inf did not "move" (NaN != NaN): it diverged, which
    # classify_failure reports; stagnation is over finite pairs only
    same = same[finite]
    return float(same.double().mean()) if same.numel() else float("nan")


def applied_stagnation(steps: list[dict]) -> float:
    """Mean ``value_stagnation_rate`` over the sweep steps whose value update
    was applied (``value_step_ok``). A step the gradient scaler skipped (an
    FP16 overflow) leaves every value unchanged, which is the skip, not
    rounding; it is counted apart. NaN when no step was applied."""
    rates = [
        s["value_stagnation_rate"]
        for s in steps
        if s.get("value_step_ok") and s.get("value_stagnation_rate") is not None
    ]
    return sum(rates) / len(rates) if rates else float("nan")


def skipped_value_steps(steps: list[dict]) -> int:
    return sum(s.get("value_step_ok") is False for s in steps)


def value_report(before: torch.Tensor, after: torch.Tensor, mask: Optional[torch.Tensor] = None) -> dict[str, float]:
    """H3 on the value model's outputs (its dtype) for a fixed probe batch,
    before and after one optimizer step."""
    sel = before if mask is None else before[mask.bool()]
    finfo = torch.finfo(before.dtype)
    return {
        "value_quant_step_median": _median(ulp(sel)),
        "value_abs_median": _median(sel.abs()),
        "value_stagnation_rate": stagnation_rate(before, after, mask),
        "value_headroom": float(finfo.max / max(float(sel.abs().max()), finfo.tiny)) if sel.numel() else float("nan"),
    }


# -- accumulation (H4) -----------------------------------------------------------


def accumulated_error(logp: torch.Tensor, logp64: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Signed per-token log-prob error summed along each sequence in FP64:
    ``[B, T-1]`` running sums (position t = error of the first t+1 tokens)."""
    err = (logp.to(torch.float64) - logp64.to(torch.float64)) * mask.to(torch.float64)
    return err.cumsum(dim=1)


def loglog_slope(lengths: np.ndarray, errors: np.ndarray) -> float:
    """Least-squares slope of log(error) on log(length); positive entries only.
    Independent per-token errors give ~0.5 (a random walk), a systematic bias ~1."""
    lengths, errors = np.asarray(lengths, dtype=np.float64), np.asarray(errors, dtype=np.float64)
    ok = (lengths > 0) & (errors > 0) & np.isfinite(errors)
    if ok.sum() < 2:
        return float("nan")
    return float(np.polyfit(np.log(lengths[ok]), np.log(errors[ok]), 1)[0])


def accum_report(
    logp: torch.Tensor, logp64: torch.Tensor, mask: torch.Tensor, prefix: str = "accum_err"
) -> dict[str, float]:
    """``<prefix>_final``: mean over sequences of |sum of per-token error| at
    the last token; ``<prefix>_slope``: log-log slope of the mean |running
    sum| against prefix length, over lengths 1, 2, 4, ..."""
    if bool((mask == mask[:1]).all()):
        # the same positions are scored in every row (a prompt then a
        # generation): lengths count scored tokens, not prompt positions
        cols = mask[0].bool()
        logp, logp64, mask = logp[:, cols], logp64[:, cols], mask[:, cols]
    cum = accumulated_error(logp, logp64, mask).abs()
    n = cum.shape[1]
    lengths = [L for L in (2**k for k in range(0, 20)) if L <= n]
    curve = [float(cum[:, L - 1].mean()) for L in lengths]
    return {
        f"{prefix}_final": float(cum[:, -1].mean()),
        f"{prefix}_slope": loglog_slope(np.array(lengths), np.array(curve)),
    }


# -- failure taxonomy ---------------------------------------------------------------

FAILURES = ("nan", "diverged", "kl_collapse", "value_overflow_danger")


def classify_failure(
    *,
    tensors: dict[str, torch.Tensor],
    kl: Optional[float] = None,
    kl_fp64: Optional[float] = None,
    exact_zero_frac: Optional[float] = None,
    values: Optional[torch.Tensor] = None,
    value_dtype: Optional[torch.dtype] = None,
    values_after: Optional[torch.Tensor] = None,
) -> Optional[dict[str, str]]:
    """The first failure that applies, or None.

    * ``nan``: any named tensor holds a NaN or an infinity.
    * ``diverged``: the values after the optimizer step (``values_after``) hold
      a NaN or an infinity although the values before were finite.
    * ``kl_collapse``: the FP64 KL is material (> 1e-4) but the configuration's
      estimate is under a tenth of it, or 90% of log ratios are exactly zero.
    * ``value_overflow_danger``: the largest |value| is within 4x of the value
      dtype's largest finite number.
    """
    for name, t in tensors.items():
        if t is not None and not bool(torch.isfinite(t).all()):
            return {"kind": "nan", "detail": f"{name} holds non-finite values"}
    if values_after is not None:
        bad = int((~torch.isfinite(values_after)).sum())
        if bad:
            return {
                "kind": "diverged",
                "detail": f"{bad} of {values_after.numel()} values are non-finite after one optimizer step",
            }
    if kl is not None and kl_fp64 is not None and kl_fp64 > 1e-4 and kl < 0.1 * kl_fp64:
        return {"kind": "kl_collapse", "detail": f"kl estimate {kl:.3g} < 0.1 x fp64 kl {kl_fp64:.3g}"}
    if exact_zero_frac is not None and exact_zero_frac > 0.9:
        return {"kind": "kl_collapse", "detail": f"{exact_zero_frac:.0%} of log ratios are exactly zero"}
    if values is not None and values.numel():
        dtype = value_dtype or values.dtype
        vmax = float(values.abs().max())
        limit = torch.finfo(dtype).max / 4
        if vmax > limit:
            return {
                "kind": "value_overflow_danger",
                "detail": f"max |value| {vmax:.4g} > {limit:.4g} (finfo({dtype}).max / 4)",
            }
    return None

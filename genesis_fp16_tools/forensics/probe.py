"""The static probe: policy samples scored by every configuration against FP64.

For each sequence length, prompts from held-out text are continued by the FP32
policy (samples from the policy, as k3 needs); then each configuration
re-scores the same tokens with cast copies of policy, reference, reward and
value, and every H1-H4 metric is computed against the FP64 models on the same
tokens, over the generated (masked) positions only.
"""

from __future__ import annotations

import dataclasses
import datetime
import platform
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from genesis_fp16.precision.capability import cpu_name
from genesis_fp16.base.seeds import torch_generator
from genesis_fp16_tools.forensics.configs import ComponentPrecisions
from genesis_fp16_tools.forensics.metrics import (
    accum_report,
    classify_failure,
    kl_report,
    reward_report,
    token_logprobs,
    value_report,
)
from genesis_fp16_tools.forensics.model import ScalarModel, TinyLM, cast_copy
from genesis_fp16_tools.forensics.pretrain import Assets
from genesis_fp16_tools.forensics import data

PROMPT_LEN = 8
VALUE_LR = 1e-4  # one Adam step of the value model on the probe batch (H3)
VALUE_EPS = 1e-6  # Adam eps; the moments are FP32 (value_update)


@torch.no_grad()
def generate(
    model: TinyLM, prompts: torch.Tensor, total_len: int, generator: torch.Generator, temperature: float = 1.0
) -> torch.Tensor:
    """Sample continuations to ``total_len`` tokens (no KV cache: tiny model)."""
    tokens = prompts
    while tokens.shape[1] < total_len:
        logits = model(tokens)[:, -1].float() / temperature
        nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)
        tokens = torch.cat([tokens, nxt], dim=1)
    return tokens


def generated_mask(tokens: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """``[B, T-1]``: True where position t predicts a generated token (t+1 >= prompt_len)."""
    b, t = tokens.shape
    pos = torch.arange(t - 1).unsqueeze(0).expand(b, -1)
    return pos + 1 >= prompt_len


@dataclass
class Truth:
    """FP64 ground truth (log-probs and rewards) on one batch of tokens, and
    the FP64 logits of policy and reference (for the rounding floor; frozen
    files do not store them, ``with_logits`` recomputes them)."""

    tokens: torch.Tensor
    mask: torch.Tensor
    lp64: torch.Tensor
    lr64: torch.Tensor
    rewards64: torch.Tensor
    assets_sha256: Optional[str] = None  # of the models the truth was computed with
    logits64_policy: Optional[torch.Tensor] = None
    logits64_ref: Optional[torch.Tensor] = None

    @property
    def x64(self) -> torch.Tensor:
        return self.lp64 - self.lr64


@torch.no_grad()
def fp64_logits(assets: Assets, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of FP64 copies of the policy and the reference."""
    return cast_copy(assets.policy, torch.float64)(tokens), cast_copy(assets.reference, torch.float64)(tokens)


def with_logits(assets: Assets, truth: Truth) -> Truth:
    """``truth`` with the FP64 logits of ``assets`` on its tokens."""
    pol, ref = fp64_logits(assets, truth.tokens)
    return dataclasses.replace(truth, logits64_policy=pol, logits64_ref=ref)


@torch.no_grad()
def ground_truth(assets: Assets, tokens: torch.Tensor, mask: torch.Tensor) -> Truth:
    pol, ref = fp64_logits(assets, tokens)
    lp64 = token_logprobs(pol, tokens)
    lr64 = token_logprobs(ref, tokens)
    if not bool((lp64 - lr64)[mask].abs().gt(0).any()):
        raise RuntimeError("policy and reference give identical log-probs: the probe needs two different models")
    rewards64 = cast_copy(assets.reward, torch.float64)(tokens)
    return Truth(tokens, mask, lp64, lr64, rewards64, logits64_policy=pol, logits64_ref=ref)


def value_update(
    vm: ScalarModel, tokens: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor, return_scale: float
) -> torch.Tensor:
    """One Adam step of ``vm`` on a fixed batch; returns the values before it.

    "Pure" means the weights and activations stay in the model's dtype: no FP32
    master weights survive the step, so an update below half a spacing of a
    weight is lost when the new weight is rounded back (the H3 mechanism). The
    two parts of the optimizer arithmetic that would otherwise underflow are
    kept out of the low dtype, as mixed-precision practice does:

    * Adam's moments live in FP32: in FP16 ``(1 - beta2) * g^2`` underflows to
      0 for almost every parameter and the step becomes ``lr * g / eps``
      (jumps of ~0.5 for an intended ~1e-4).
    * The loss is scaled dynamically (largest power of two <= 2^24 whose
      gradients are all finite) and the gradient unscaled in FP32: with a
      return scale of 3e4 over 32x128 tokens ``dL/dvalue`` (~1e-8) is below
      FP16's smallest subnormal and would be exactly 0.

    The step is computed in FP32 from the current (exactly representable)
    weights and rounded back to the model's dtype.
    """
    params = list(vm.parameters())
    masters = [p.detach().float().clone() for p in params]  # this step only
    opt = torch.optim.Adam(masters, lr=VALUE_LR, eps=VALUE_EPS)
    scale = 2.0**24 if params[0].dtype == torch.float16 else 1.0
    while True:
        vm.zero_grad(set_to_none=True)
        values = vm(tokens)[:, :-1]
        err = (values.float() - targets) / return_scale  # loss in FP32, scale-free
        loss = (err.pow(2) * mask).sum() / mask.sum()
        (loss * scale).backward()
        grads = [torch.zeros_like(m) if p.grad is None else p.grad.float() / scale for p, m in zip(params, masters)]
        if scale <= 1.0 or all(bool(torch.isfinite(g).all()) for g in grads):
            break
        scale /= 2  # an overflow in the scaled backward: retry smaller
    for m, g in zip(masters, grads):
        m.grad = g
    opt.step()
    with torch.no_grad():
        for p, m in zip(params, masters):
            p.copy_(m)  # rounds to the model's dtype
    vm.zero_grad(set_to_none=True)
    return values.detach().clone()


def value_step(
    assets: Assets,
    dtype: torch.dtype,
    tokens: torch.Tensor,
    mask: torch.Tensor,
    targets: torch.Tensor,
    return_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Values of one FIXED probe batch before and after one Adam step of a
    value model whose weights are in ``dtype`` (pure: see ``value_update``)."""
    vm = assets.value_model(return_scale).to(dtype).train()
    before = value_update(vm, tokens, mask, targets, return_scale)
    with torch.no_grad():
        after = vm(tokens)[:, :-1]
    return before, after


def score_config(assets: Assets, cfg: ComponentPrecisions, truth: Truth, return_scale: float) -> dict:
    """Every H1-H4 metric of one configuration on the truth's tokens."""
    tokens, mask = truth.tokens, truth.mask
    if truth.logits64_policy is None or truth.logits64_ref is None:
        truth = with_logits(assets, truth)
    # each log-softmax in the wider of its model's dtype and the KL dtype; the
    # subtraction in the wider of the two (H1 lives here)
    lp_dtype, lr_dtype = cfg.logprob_dtype("policy"), cfg.logprob_dtype("reference")
    with torch.no_grad():
        pol = cast_copy(assets.policy, cfg.dtype("policy"))
        ref = cast_copy(assets.reference, cfg.dtype("reference"))
        lp = token_logprobs(pol(tokens), tokens, dtype=lp_dtype)
        lr = token_logprobs(ref(tokens), tokens, dtype=lr_dtype)
        x = lp - lr
        rewards = cast_copy(assets.reward, cfg.dtype("reward"))(tokens)
        # a perfect model in the same dtype: the exact logits, rounded, then
        # the same log-softmax; what a model drifts beyond this is its own
        # arithmetic's error, not its output's rounding
        lp_floor = token_logprobs(truth.logits64_policy.to(cfg.dtype("policy")), tokens, dtype=lp_dtype)
        lr_floor = token_logprobs(truth.logits64_ref.to(cfg.dtype("reference")), tokens, dtype=lr_dtype)
    row: dict = {}
    row.update(kl_report(x, truth.x64, mask))
    row.update(accum_report(lr, truth.lr64, mask, "accum_err"))  # H4: reference drift
    row["accum_err_rounding_floor"] = accum_report(lr_floor, truth.lr64, mask, "floor")["floor_final"]
    row.update(accum_report(lp, truth.lp64, mask, "policy_accum_err"))
    row["policy_accum_err_rounding_floor"] = accum_report(lp_floor, truth.lp64, mask, "floor")["floor_final"]
    seq_x = (x.to(torch.float64) * mask).sum(1)
    seq_x64 = (truth.x64 * mask).sum(1)
    row["seq_log_ratio_fp64_mean"] = float(seq_x64.mean())
    row["seq_log_ratio_abs_err_mean"] = float((seq_x - seq_x64).abs().mean())
    row.update(reward_report(rewards, truth.rewards64))
    targets = (truth.rewards64.float() * return_scale).unsqueeze(1).expand_as(mask).contiguous()
    before, after = value_step(assets, cfg.dtype("value"), tokens, mask, targets, return_scale)
    row.update(value_report(before, after, mask))
    failure = classify_failure(
        tensors={"log_ratio": x, "rewards": rewards, "values": before},
        kl=row["kl_penalty_mean"],
        kl_fp64=row["kl_fp64"],
        exact_zero_frac=row["log_ratio_exact_zero_frac"],
        values=before,
        value_dtype=cfg.dtype("value"),
        values_after=after[mask],
    )
    row["failure"] = failure["kind"] if failure else None
    row["failure_detail"] = failure["detail"] if failure else None
    return row


def run_meta(command: str) -> dict:
    return {
        "command": command,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch_version": str(torch.__version__),
        "device": "cpu",
        "cpu": cpu_name(),
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
    }


def probe(
    assets: Assets,
    configs: list[ComponentPrecisions],
    num_prompts: int = 8,
    seq_lengths: tuple[int, ...] = (32, 64),
    seed: int = 0,
    return_scale: float = 1000.0,
    progress: Optional[Callable[[str], None]] = None,
) -> list[dict]:
    rows = []
    for seq_len in seq_lengths:
        if seq_len <= PROMPT_LEN + 1 or seq_len > assets.reference.cfg.max_len:
            raise ValueError(f"sequence length {seq_len} must be in ({PROMPT_LEN + 1}, {assets.reference.cfg.max_len}]")
        g = torch_generator(seed, "forensics.probe", seq_len)
        prompts = data.sample_windows("heldout", num_prompts, PROMPT_LEN, g)
        tokens = generate(assets.policy, prompts, seq_len, g)
        truth = ground_truth(assets, tokens, generated_mask(tokens, PROMPT_LEN))
        for cfg in configs:
            started = time.perf_counter()
            row = {"config": cfg.name, "seq_len": seq_len, "num_prompts": num_prompts, "return_scale": return_scale}
            row.update({f"dtype_{c}": getattr(cfg, c) for c in ("policy", "reference", "reward", "value", "kl")})
            row.update(score_config(assets, cfg, truth, return_scale))
            row["seconds"] = time.perf_counter() - started
            rows.append(row)
            if progress:
                progress(f"{cfg.name} L={seq_len}")
    return rows


__all__ = ["probe", "score_config", "ground_truth", "generate", "generated_mask", "Truth", "run_meta"]

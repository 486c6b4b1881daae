"""PPO with a KL penalty, per precision configuration and seed.

One run, top to bottom, per step:

1. cast copies of the policy (rollout), value, reference and reward models in
   their configured dtypes; the policy samples continuations of prompts;
2. old log-probs and reference log-probs in the KL dtype (never narrower
   than the model's), the per-token
   penalty ``beta * k3`` (k3 in FP32), the sequence reward at the last token,
   values; GAE (gamma 1, lambda 0.95) in FP32;
3. FP64 ground truth of the same log ratio (the tiny model makes this cheap),
   and the failure taxonomy: a NaN, a KL collapse or a value overflow danger
   ends the run cleanly with the reason recorded;
4. one clipped-PPO update of the policy and one value update, each through
   ``FP16Trainer`` on FP32 master weights with autocast in the component's
   dtype (FP16: gradient scaler, growth interval 400 as in Precision-RL,
   unscale before clipping); pure-half weights cannot be unscaled by torch's
   GradScaler, so the masters stay FP32 and the copies carry the dtype;
5. value stagnation: the value copy's outputs on one FIXED probe batch before
   and after the update (a value update the FP16 scaler skipped is counted
   apart, not as stagnation).

Each finished run is one JSON file written atomically under
``<out>/runs/``; a restarted sweep skips the files that exist, so a killed
sweep resumes at the run it was in.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Optional

import torch

from genesis_fp16.base.storage import atomic_write_text
from genesis_fp16.base.seeds import torch_generator
from genesis_fp16.base.telemetry import get_logger
from genesis_fp16.training.trainer import FP16Trainer, FP16TrainingConfig
from genesis_fp16_tools.forensics.configs import ComponentPrecisions
from genesis_fp16_tools.forensics.metrics import (
    applied_stagnation,
    classify_failure,
    kl_k3,
    masked_mean,
    reward_report,
    skipped_value_steps,
    stagnation_rate,
    token_logprobs,
    ulp,
)
from genesis_fp16_tools.forensics.model import cast_copy
from genesis_fp16_tools.forensics.pretrain import Assets, reward_target
from genesis_fp16_tools.forensics.probe import PROMPT_LEN, generate, generated_mask
from genesis_fp16_tools.forensics import data

log = get_logger("genesis_fp16_tools.forensics")


@dataclass(frozen=True)
class SweepArgs:
    max_steps: int = 60
    """PPO iterations per run."""
    batch: int = 16
    """Prompts per iteration."""
    gen_len: int = 32
    """Generated tokens per prompt."""
    beta: float = 0.05
    """KL penalty coefficient on the per-token k3."""
    return_scale: float = 1000.0
    """Rewards (and so returns and values) are multiplied by this (H3 magnitude)."""
    policy_lr: float = 3e-4
    value_lr: float = 1e-4
    clip: float = 0.2
    growth_interval: int = 400
    """Gradient scaler growth interval for FP16 (Precision-RL's value)."""

    @classmethod
    def quick(cls) -> "SweepArgs":
        return cls(max_steps=15, batch=8, gen_len=24)


def run_name(cfg: ComponentPrecisions, seed: int, value_lr: Optional[float] = None) -> str:
    """``<config>__seed<n>``, or ``<config>__vlr<lr>__seed<n>`` in a sweep over value lrs."""
    return f"{cfg.name}__seed{seed}" if value_lr is None else f"{cfg.name}__vlr{value_lr:g}__seed{seed}"


def _trainer(model: torch.nn.Module, lr: float, precision: str, args: SweepArgs, name: str) -> FP16Trainer:
    device = next(model.parameters()).device
    cfg = FP16TrainingConfig(
        enabled=precision != "fp32",
        precision=precision,
        max_grad_norm=1.0,
        growth_interval=args.growth_interval,
        on_unsupported="error",  # a forensic run must measure what it names
        device=str(device),  # the masters live where Assets.to put them
    )
    return FP16Trainer(model, torch.optim.Adam(model.parameters(), lr=lr), cfg, name=name)


def _gae(rewards: torch.Tensor, values: torch.Tensor, lam: float = 0.95) -> torch.Tensor:
    adv = torch.zeros_like(rewards)
    last = torch.zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        nxt = values[:, t + 1] if t + 1 < rewards.shape[1] else torch.zeros(rewards.shape[0])
        delta = rewards[:, t] + nxt - values[:, t]
        last = delta + lam * last
        adv[:, t] = last
    return adv


def run_one(
    assets: Assets,
    cfg: ComponentPrecisions,
    seed: int,
    args: SweepArgs,
    progress: Optional[Callable[[int], None]] = None,
) -> dict:
    # every draw of a run (prompts, sampling) comes from it: the models are copies, not new
    g = torch_generator(seed, "forensics.sweep.run")
    started = time.perf_counter()
    policy = copy.deepcopy(assets.policy).train()
    value = assets.value_model(args.return_scale).train()
    ptrain = _trainer(policy, args.policy_lr, cfg.policy, args, f"forensics.policy.{cfg.name}")
    vtrain = _trainer(value, args.value_lr, cfg.value, args, f"forensics.value.{cfg.name}")
    ref = cast_copy(assets.reference, cfg.dtype("reference"))
    rew = cast_copy(assets.reward, cfg.dtype("reward"))
    ref64 = cast_copy(assets.reference, torch.float64)
    total = PROMPT_LEN + args.gen_len
    probe_tokens = data.sample_windows("heldout", args.batch, total, torch_generator(0, "forensics.sweep.probe_tokens"))
    probe_mask = generated_mask(probe_tokens, PROMPT_LEN)
    steps: list[dict] = []
    failure = None
    for step in range(args.max_steps):
        t0 = time.perf_counter()
        pol_c = cast_copy(policy, cfg.dtype("policy"))
        val_c = cast_copy(value, cfg.dtype("value"))
        with torch.no_grad():
            tokens = generate(pol_c, data.sample_windows("train", args.batch, PROMPT_LEN, g), total, g)
            mask = generated_mask(tokens, PROMPT_LEN)
            old_lp = token_logprobs(pol_c(tokens), tokens, dtype=cfg.logprob_dtype("policy"))
            ref_lp = token_logprobs(ref(tokens), tokens, dtype=cfg.logprob_dtype("reference"))
            x = old_lp - ref_lp
            x64 = token_logprobs(cast_copy(policy, torch.float64)(tokens), tokens) - token_logprobs(
                ref64(tokens), tokens
            )
            k3 = kl_k3(x) * mask
            rewards = rew(tokens)
            rewards_fp32 = assets.reward(tokens)
            values = val_c(tokens)[:, :-1]
            probe_before = val_c(probe_tokens)[:, :-1]
        kl, kl64 = masked_mean(kl_k3(x), mask), masked_mean(kl_k3(x64), mask)
        exact_zero = float((x[mask] == 0).double().mean())
        failure = classify_failure(
            tensors={"log_ratio": x, "rewards": rewards, "values": values},
            kl=kl,
            kl_fp64=kl64,
            exact_zero_frac=exact_zero,
            values=values,
            value_dtype=cfg.dtype("value"),
        )
        record = {
            "step": step,
            "true_reward": float(reward_target(tokens[:, PROMPT_LEN:]).mean()),
            "model_reward": float(rewards.float().mean()),
            "kl": kl,
            "kl_fp64": kl64,
            "kl_abs_err": abs(kl - kl64),
            "log_ratio_exact_zero_frac": exact_zero,
            "value_quant_step_median": float(ulp(values[mask]).median()),
        }
        h2 = reward_report(rewards, rewards_fp32)
        record.update({k: h2[k] for k in ("reward_resolution_median", "reward_tie_rate", "reward_kendall_tau")})
        if failure:
            record["failure"] = failure["kind"]
            steps.append(record)
            failure = dict(failure, step=step)
            log.warning("forensics.run_failed", config=cfg.name, seed=seed, **failure)
            break
        # token rewards: -beta*k3 everywhere, plus the sequence reward at the last token
        tok_r = (-args.beta * k3 * args.return_scale).float()
        tok_r[:, -1] += rewards.float() * args.return_scale
        v32 = values.float() * mask
        adv = _gae(tok_r * mask, v32) * mask
        returns = adv + v32
        norm_adv = (adv - adv[mask].mean()) / (adv[mask].std() + 1e-8) * mask
        old32 = old_lp.float()
        # the update's loss and its gradient scaler live on the models' device
        dev = next(policy.parameters()).device
        tokens_d, mask_d, norm_adv, old32, returns = (t.to(dev) for t in (tokens, mask, norm_adv, old32, returns))

        def policy_loss(model, batch):
            new_lp = token_logprobs(model(batch), batch, dtype=torch.float32 if cfg.kl == "fp32" else None).float()
            ratio = torch.exp(new_lp - old32)
            surr = torch.minimum(ratio * norm_adv, ratio.clamp(1 - args.clip, 1 + args.clip) * norm_adv)
            return -(surr * mask_d).sum() / mask_d.sum()

        def value_loss(model, batch):
            v = model(batch)[:, :-1].float()
            return (((v - returns) / args.return_scale).pow(2) * mask_d).sum() / mask_d.sum()

        p_ok = ptrain.backward_and_step(ptrain.training_step(tokens_d, policy_loss))
        v_ok = vtrain.backward_and_step(vtrain.training_step(tokens_d, value_loss))
        with torch.no_grad():
            probe_after = cast_copy(value, cfg.dtype("value"))(probe_tokens)[:, :-1]
        record.update(
            value_stagnation_rate=stagnation_rate(probe_before, probe_after, probe_mask),
            policy_step_ok=p_ok,
            value_step_ok=v_ok,
            policy_scale=ptrain.current_scale,
            seconds=time.perf_counter() - t0,
        )
        steps.append(record)
        if progress:
            progress(step + 1)
    last = steps[-3:]
    summary = {
        "true_reward_first": steps[0]["true_reward"],
        "true_reward_last": sum(s["true_reward"] for s in last) / len(last),
        "kl_last": steps[-1]["kl"],
        "kl_fp64_last": steps[-1]["kl_fp64"],
        "kl_abs_err_mean": sum(s["kl_abs_err"] for s in steps) / len(steps),
        "value_stagnation_rate_mean": applied_stagnation(steps),
        "value_steps_skipped": skipped_value_steps(steps),
        "value_quant_step_median": _mean([s["value_quant_step_median"] for s in steps]),
        "reward_tie_rate_mean": _mean([s["reward_tie_rate"] for s in steps]),
        "reward_kendall_tau_mean": _mean([s["reward_kendall_tau"] for s in steps]),
        "policy_overflow_steps": ptrain.overflow_steps,
        "value_overflow_steps": vtrain.overflow_steps,
        "steps_done": len(steps),
    }
    return {
        "config": cfg.name,
        "dtypes": cfg.to_dict(),
        "seed": seed,
        "args": asdict(args),
        "status": "failed" if failure else "completed",
        "failure": failure,
        "summary": summary,
        "steps": steps,
        "seconds": time.perf_counter() - started,
    }


def _mean(xs: list) -> float:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else float("nan")


def sweep(
    assets: Assets,
    configs: list[ComponentPrecisions],
    seeds: list[int],
    out_dir: Path,
    args: SweepArgs,
    meta: Optional[dict] = None,
    on_run: Optional[Callable[[str, str], None]] = None,
    on_step: Optional[Callable[[int], None]] = None,
    value_lrs: Optional[list[float]] = None,
) -> list[dict]:
    """Run every (config, seed) not already on disk; return all run results.

    ``value_lrs``: run every (config, seed) once per value-model learning rate
    (``args.value_lr`` replaced), for H3's stagnation against the lr."""
    runs_dir = Path(out_dir) / "runs"
    manifest = Path(out_dir) / "sweep.json"
    if manifest.exists():
        previous = json.loads(manifest.read_text())
        if previous.get("args") != asdict(args) or previous.get("value_lrs") != value_lrs:
            raise ValueError(
                f"{out_dir} holds a sweep with other arguments ({previous.get('args')}, value_lrs "
                f"{previous.get('value_lrs')}); "
                "resume it with the same options, or give a new --out"
            )
    runs_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        manifest,
        json.dumps(
            {
                "args": asdict(args),
                "value_lrs": value_lrs,
                "configs": [c.name for c in configs],
                "seeds": seeds,
                "meta": meta or {},
            },
            indent=2,
            sort_keys=True,
        ),
    )
    variants = [(None, args)] if value_lrs is None else [(lr, replace(args, value_lr=lr)) for lr in value_lrs]
    results = []
    for cfg in configs:
        for lr, run_args in variants:
            for seed in seeds:
                name = run_name(cfg, seed, lr)
                path = runs_dir / f"{name}.json"
                if path.exists():
                    results.append(json.loads(path.read_text()))
                    if on_run:
                        on_run(name, "skipped (done)")
                    continue
                results.append(_run_and_save(assets, cfg, seed, run_args, path, name, on_run, on_step))
    return results


def _run_and_save(
    assets: Assets,
    cfg: ComponentPrecisions,
    seed: int,
    args: SweepArgs,
    path: Path,
    name: str,
    on_run: Optional[Callable[[str, str], None]],
    on_step: Optional[Callable[[int], None]],
) -> dict:
    result = run_one(assets, cfg, seed, args, progress=on_step)
    atomic_write_text(path, json.dumps(result, indent=1, sort_keys=True))
    log.info("forensics.run_done", run=name, status=result["status"], seconds=round(result["seconds"], 2))
    if on_run:
        on_run(name, result["status"])
    return result

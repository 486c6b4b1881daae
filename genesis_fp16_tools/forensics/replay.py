"""Freeze FP32 trajectories to disk, then replay them under each configuration.

``freeze`` samples prompts from held-out text and continues them with the FP32
policy; the tokens, the mask, the FP64 rewards and the FP64 log-probs of
policy and reference are written atomically (weights-only payload).
``replay`` re-scores the frozen tokens under each configuration with the
policy and the reference as two different models (it refuses a file whose
log ratio is identically zero), and adds the Precision-RL mismatch curve:
the mean |sequence log-prob error| of the policy against length.
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path
from typing import Callable, Optional

import torch

from genesis_fp16.training.checkpoint import build_payload, load_payload, save_payload
from genesis_fp16_tools.forensics.configs import ComponentPrecisions
from genesis_fp16_tools.forensics.metrics import token_logprobs
from genesis_fp16_tools.forensics.model import cast_copy
from genesis_fp16.base.seeds import torch_generator
from genesis_fp16_tools.forensics.pretrain import Assets
from genesis_fp16_tools.forensics.probe import (
    PROMPT_LEN,
    Truth,
    generate,
    generated_mask,
    ground_truth,
    score_config,
    with_logits,
)
from genesis_fp16_tools.forensics import data


def assets_sha256(assets: Assets) -> str:
    """sha256 over the names, dtypes, shapes and bytes of every tensor of the
    four models: identifies the checkpoint the frozen log-probs came from."""
    h = hashlib.sha256()
    for part, module in (
        ("policy", assets.policy),
        ("reference", assets.reference),
        ("reward", assets.reward),
        ("value", assets.value),
    ):
        for name, t in module.state_dict().items():
            h.update(f"{part}.{name}:{t.dtype}:{tuple(t.shape)}".encode())
            h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def freeze(assets: Assets, path: Path, num_prompts: int = 16, seq_len: int = 96, seed: int = 0) -> Path:
    g = torch_generator(seed, "forensics.replay.freeze")
    prompts = data.sample_windows("heldout", num_prompts, PROMPT_LEN, g)
    tokens = generate(assets.policy, prompts, seq_len, g)
    truth = ground_truth(assets, tokens, generated_mask(tokens, PROMPT_LEN))
    payload = build_payload(
        model={},
        precision="fp32",
        extra={
            "kind": "forensics-trajectories",
            "tokens": tokens,
            "mask": truth.mask,
            "rewards_fp64": truth.rewards64,
            "logp_policy_fp64": truth.lp64,
            "logp_ref_fp64": truth.lr64,
            "prompt_len": PROMPT_LEN,
            "seed": seed,
            "assets": str(assets.path or ""),
            "assets_sha256": assets_sha256(assets),
        },
    )
    return save_payload(path, payload)


def load_trajectories(path: Path) -> Truth:
    extra = load_payload(path)["extra"]
    if extra.get("kind") != "forensics-trajectories":
        raise ValueError(f"{path}: not a frozen trajectory file (made by `genesis-fp16 forensics freeze`)")
    truth = Truth(
        extra["tokens"],
        extra["mask"],
        extra["logp_policy_fp64"],
        extra["logp_ref_fp64"],
        # files frozen before the reward truth was FP64 carry FP32 rewards
        extra["rewards_fp64"] if "rewards_fp64" in extra else extra["rewards_fp32"],
        extra.get("assets_sha256"),
    )
    if not bool(truth.x64[truth.mask].abs().gt(0).any()):
        raise ValueError(
            f"{path}: the policy and reference log-probs are identical; replay needs a reference different from the "
            "policy"
        )
    return truth


@torch.no_grad()
def mismatch_curve(assets: Assets, cfg: ComponentPrecisions, truth: Truth) -> dict[str, list[float]]:
    """Mean over sequences of |sum of (logp_policy_cfg - logp_policy_fp64)| over
    the first L generated tokens, and of the config's sequence log ratio."""
    pol = cast_copy(assets.policy, cfg.dtype("policy"))
    ref = cast_copy(assets.reference, cfg.dtype("reference"))
    lp = token_logprobs(pol(truth.tokens), truth.tokens, dtype=cfg.logprob_dtype("policy")).to(torch.float64)
    lr = token_logprobs(ref(truth.tokens), truth.tokens, dtype=cfg.logprob_dtype("reference")).to(torch.float64)
    cols = truth.mask[0].bool()
    err = (lp - truth.lp64)[:, cols].cumsum(1).abs().mean(0)
    ratio = (lp - lr)[:, cols].cumsum(1).mean(0)
    ratio64 = truth.x64[:, cols].cumsum(1).mean(0)
    return {
        "lengths": list(range(1, int(cols.sum()) + 1)),
        "seq_logp_mismatch": [float(v) for v in err],
        "seq_log_ratio": [float(v) for v in ratio],
        "seq_log_ratio_fp64": [float(v) for v in ratio64],
    }


def replay(
    assets: Assets,
    truth: Truth,
    configs: list[ComponentPrecisions],
    return_scale: float = 1000.0,
    progress: Optional[Callable[[str], None]] = None,
) -> list[dict]:
    if truth.assets_sha256 is None:
        warnings.warn(
            "the trajectory file carries no checkpoint hash (frozen by an older version): cannot check that its FP64 "
            "log-probs came from these models; re-run `forensics freeze` to get one",
            UserWarning,
            stacklevel=2,
        )
    elif truth.assets_sha256 != assets_sha256(assets):
        raise ValueError(
            "the trajectories were frozen from a different checkpoint than the loaded models (sha256 differs); re-run "
            "`forensics freeze` with these models, or load the models they were frozen from"
        )
    truth = with_logits(assets, truth)  # once, for every configuration's rounding floor
    rows = []
    for cfg in configs:
        row = {
            "config": cfg.name,
            "seq_len": int(truth.tokens.shape[1]),
            "num_prompts": int(truth.tokens.shape[0]),
            "return_scale": return_scale,
        }
        row.update(score_config(assets, cfg, truth, return_scale))
        row["curve"] = mismatch_curve(assets, cfg, truth)
        rows.append(row)
        if progress:
            progress(cfg.name)
    return rows

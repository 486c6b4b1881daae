"""Precision configurations: the dtype of each RLHF component.

``policy``, ``reference``, ``reward`` and ``value`` are the dtypes the
component's weights and arithmetic run in (cast copies). ``kl`` is the dtype
of the log-softmax on each model's logits and of the log-ratio subtraction
``x = logp_policy - logp_ref`` (where H1's cancellation happens), never
narrower than the model's own dtype (``logprob_dtype``): an FP32 reference in
a BF16 configuration keeps FP32 log-probs, so ``bf16_fp32_ref`` isolates the
reference, and the subtraction runs in the wider of the two log-prob dtypes.
The k3 estimator itself is always evaluated in FP32 or wider.

Training (sweep): the policy and value keep FP32 master weights trained by
``FP16Trainer`` with autocast in the component's dtype (FP16 with the
gradient scaler); rollout, reference, reward and value predictions use cast
copies refreshed from the masters after every update. Pure-half weights
cannot be unscaled by torch's GradScaler, hence this split.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from genesis_fp16.precision.modes import MODES
from genesis_fp16.base.settings import PrecisionMode

# a component runs in one of the trainer's mixed-precision modes (by its compute
# dtype), or in FP64 for the ground truth
DTYPES: dict[str, torch.dtype] = {
    "fp64": torch.float64,
    **{mode.value: MODES[mode].compute_dtype for mode in (PrecisionMode.FP32, PrecisionMode.BF16, PrecisionMode.FP16)},
}
COMPONENTS = ("policy", "reference", "reward", "value", "kl")


@dataclass(frozen=True)
class ComponentPrecisions:
    name: str
    policy: str
    reference: str
    reward: str
    value: str
    kl: str
    description: str = ""

    def __post_init__(self) -> None:
        bad = {c: getattr(self, c) for c in COMPONENTS if getattr(self, c) not in DTYPES}
        if bad:
            raise ValueError(f"{self.name}: unknown dtype(s) {bad}; expected one of {', '.join(DTYPES)}")

    def dtype(self, component: str) -> torch.dtype:
        return DTYPES[getattr(self, component)]

    def logprob_dtype(self, model: str) -> torch.dtype:
        """The log-softmax dtype of ``model`` (policy or reference): the wider
        of its own dtype and the KL dtype (rounding an FP32 model's logits to
        a narrower KL dtype would bring back the error the FP32 model avoids)."""
        return torch.promote_types(self.dtype(model), self.dtype("kl"))

    def to_dict(self) -> dict:
        return asdict(self)


def _cfg(name: str, low: str, description: str, **fp32_parts: str) -> ComponentPrecisions:
    parts = {c: low for c in COMPONENTS}
    parts.update(fp32_parts)
    return ComponentPrecisions(name=name, description=description, **parts)


CONFIGS: dict[str, ComponentPrecisions] = {
    c.name: c
    for c in [
        _cfg("fp32_baseline", "fp32", "everything FP32"),
        _cfg("bf16_pure", "bf16", "everything BF16"),
        _cfg("bf16_fp32_kl", "bf16", "BF16 models, log-softmax and log-ratio in FP32", kl="fp32"),
        _cfg("bf16_fp32_value", "bf16", "BF16 except the value model", value="fp32"),
        _cfg("bf16_fp32_reward", "bf16", "BF16 except the reward model", reward="fp32"),
        _cfg("bf16_fp32_ref", "bf16", "BF16 except the reference model", reference="fp32"),
        _cfg("mixed_recommended", "bf16", "BF16 policy/ref/reward, value and KL in FP32", value="fp32", kl="fp32"),
        _cfg("fp16_pure", "fp16", "everything FP16 (training with the gradient scaler)"),
        _cfg("fp16_fp32_kl", "fp16", "FP16 models, log-softmax and log-ratio in FP32", kl="fp32"),
        _cfg("fp16_mixed", "fp16", "FP16 policy/ref/reward, value and KL in FP32", value="fp32", kl="fp32"),
    ]
}


def parse_configs(text: str | None) -> list[ComponentPrecisions]:
    """``"a,b"`` -> configs; ``None``/``"all"`` -> all. Unknown names raise
    ``ValueError`` listing the valid ones."""
    if text is None or text.strip() in ("", "all"):
        return list(CONFIGS.values())
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise ValueError(
            f"unknown configuration(s) {', '.join(unknown)}: expected a comma-separated list of {', '.join(CONFIGS)} "
            "(or 'all')"
        )
    return [CONFIGS[n] for n in names]

"""The shared FP32 initial checkpoint: reference, policy, reward and value.

Built once (in well under a minute on 2 CPU cores) and cached under
``<state_dir>/forensics/initial-<key>.pt``; every phase loads it with
``weights_only=True`` through ``genesis_fp16.training.checkpoint``.

* reference: the ``TinyLM`` pretrained in FP32 on ``pydoc_data.topics``;
* policy: the reference after a few FP32 fine-tuning steps on lower-cased
  text, so policy and reference genuinely differ (never reference = policy);
* reward: a trunk copy of the reference plus a scalar head fit (ridge, FP64)
  to a programmatic score, the fraction of lower-case letters in a sequence;
* value: a trunk copy plus a per-token head fit to the same score. Its output
  is multiplied by ``return_scale`` (set when loaded, not stored).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from genesis_fp16.training.checkpoint import CheckpointError, build_payload, load_payload, save_payload
from genesis_fp16.base.seeds import init_parameters, torch_generator
from genesis_fp16.base.telemetry import get_logger
from genesis_fp16_tools.forensics import data
from genesis_fp16_tools.forensics.model import ScalarModel, TinyConfig, TinyLM, lm_loss

log = get_logger("genesis_fp16_tools.forensics")


@contextlib.contextmanager
def single_thread():
    """One intra-op thread: on a small model and a shared 2-core machine, two
    threads measured about 10x slower per step than one (contention)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class PretrainSpec:
    steps: int = 300
    batch: int = 32
    length: int = 64
    lr: float = 3e-3
    finetune_steps: int = 30
    finetune_lr: float = 1e-3
    reward_samples: int = 256
    seed: int = 0

    def key(self, cfg: TinyConfig) -> str:
        # "v": the layout of the saved models, or how they are built (4: the initial weights from the
        # generator of `genesis_fp16.base.seeds`); a new one gets a new file, so an older cache is rebuilt instead of
        # refused
        blob = json.dumps({"spec": self.__dict__, "model": cfg.to_dict(), "v": 4}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


@dataclass
class Assets:
    reference: TinyLM
    policy: TinyLM
    reward: ScalarModel
    value: ScalarModel
    meta: dict
    path: Optional[Path] = None

    def to(self, device: torch.device | str) -> "Assets":
        """Move the four models to ``device`` (in place); returns self."""
        for m in (self.reference, self.policy, self.reward, self.value):
            m.to(device)
        return self

    def value_model(self, return_scale: float) -> ScalarModel:
        v = copy.deepcopy(self.value)
        v.scale = float(return_scale)
        return v


def reward_target(tokens: torch.Tensor) -> torch.Tensor:
    """The programmatic score the reward model learns: fraction of a-z bytes."""
    return ((tokens >= ord("a")) & (tokens <= ord("z"))).double().mean(dim=1)


def _ridge(features: torch.Tensor, target: torch.Tensor, lam: float = 1e-3) -> tuple[torch.Tensor, torch.Tensor]:
    x = features.double()
    mu = x.mean(0)
    xc = x - mu
    w = torch.linalg.solve(
        xc.T @ xc + lam * len(x) * torch.eye(x.shape[1], dtype=torch.float64), xc.T @ (target - target.mean())
    )
    b = target.mean() - mu @ w
    return w, b


def _corrupted_windows(n: int, length: int, g: torch.Generator) -> torch.Tensor:
    toks = data.sample_windows("train", n, length, g)
    frac = torch.rand(n, 1, generator=g) * 0.8
    noise = torch.randint(32, 127, toks.shape, generator=g)
    return torch.where(torch.rand(toks.shape, generator=g) < frac, noise, toks)


def build_assets(
    spec: PretrainSpec = PretrainSpec(),
    cfg: TinyConfig = TinyConfig(),
    progress: Optional[Callable[[int, int], None]] = None,
) -> Assets:
    with single_thread():
        return _build_assets(spec, cfg, progress)


def _build_assets(spec: PretrainSpec, cfg: TinyConfig, progress: Optional[Callable[[int, int], None]]) -> Assets:
    g = torch_generator(spec.seed, "forensics.pretrain.data")
    started = time.perf_counter()
    ref = init_parameters(
        TinyLM(cfg), torch_generator(spec.seed, "forensics.pretrain.init")
    )  # torch's global generator untouched
    opt = torch.optim.AdamW(ref.parameters(), lr=spec.lr, weight_decay=0.0)
    total = spec.steps + spec.finetune_steps
    for step in range(spec.steps):
        lr = spec.lr * min(1.0, (step + 1) / 20) * (0.1 + 0.9 * (1 - step / spec.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        loss = lm_loss(ref, data.sample_windows("train", spec.batch, spec.length, g))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        opt.step()
        if progress:
            progress(step + 1, total)
    heldout = float(lm_loss(ref, data.sample_windows("heldout", 64, spec.length, g)).detach())
    ref.eval()

    policy = copy.deepcopy(ref).train()
    opt = torch.optim.AdamW(policy.parameters(), lr=spec.finetune_lr, weight_decay=0.0)
    for step in range(spec.finetune_steps):
        text = data.sample_windows("train", spec.batch, spec.length, g)
        lower = torch.where((text >= ord("A")) & (text <= ord("Z")), text + 32, text)
        loss = lm_loss(policy, lower)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if progress:
            progress(spec.steps + step + 1, total)
    policy.eval()

    with torch.no_grad():
        seqs = _corrupted_windows(spec.reward_samples, spec.length, g)
        target = reward_target(seqs)
        hidden = ref.hidden(seqs).double()
        reward = ScalarModel(copy.deepcopy(ref), per_token=False)
        w, b = _ridge(hidden.mean(dim=1), target)
        reward.score.weight.copy_(w.float().unsqueeze(0))
        reward.score.bias.fill_(float(b))
        value = ScalarModel(copy.deepcopy(ref), per_token=True)
        w, b = _ridge(hidden.reshape(-1, hidden.shape[-1]), target.repeat_interleave(spec.length))
        value.score.weight.copy_(w.float().unsqueeze(0))
        value.score.bias.fill_(float(b))
        fit = reward(seqs).double()
        reward_r2 = float(1 - ((fit - target) ** 2).mean() / target.var())
    meta = {
        "heldout_loss": heldout,
        "reward_r2": reward_r2,
        "seconds": time.perf_counter() - started,
        "spec": spec.__dict__,
        "model": cfg.to_dict(),
        "torch_version": str(torch.__version__),
    }
    return Assets(reference=ref, policy=policy, reward=reward, value=value, meta=meta)


def assets_path(state_dir: Path, spec: PretrainSpec = PretrainSpec(), cfg: TinyConfig = TinyConfig()) -> Path:
    return Path(state_dir) / "forensics" / f"initial-{spec.key(cfg)}.pt"


def save_assets(assets: Assets, path: Path) -> Path:
    payload = build_payload(
        model=assets.reference.state_dict(),
        precision="fp32",
        extra={
            "policy": assets.policy.state_dict(),
            "reward": assets.reward.state_dict(),
            "value": assets.value.state_dict(),
            "meta_json": json.dumps(assets.meta, sort_keys=True),
        },
    )
    return save_payload(path, payload)


def load_assets(path: Path) -> Assets:
    """Load a checkpoint written by `save_assets`; anything else raises
    `CheckpointError` naming the file."""
    payload = load_payload(path)
    try:
        extra = payload["extra"]
        meta = json.loads(extra["meta_json"])
        cfg = TinyConfig(**meta["model"])
        ref, policy = TinyLM(cfg), TinyLM(cfg)
        ref.load_state_dict(payload["model"])
        policy.load_state_dict(extra["policy"])
        reward = ScalarModel(TinyLM(cfg), per_token=False)
        reward.load_state_dict(extra["reward"])
        value = ScalarModel(TinyLM(cfg), per_token=True)
        value.load_state_dict(extra["value"])
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:  # RuntimeError: load_state_dict's shape mismatch
        raise CheckpointError(f"{path}: not a forensics initial checkpoint ({type(exc).__name__}: {exc})") from None
    for m in (ref, policy, reward, value):
        m.eval()
    return Assets(reference=ref, policy=policy, reward=reward, value=value, meta=meta, path=Path(path))


def ensure_assets(
    state_dir: Path,
    spec: PretrainSpec = PretrainSpec(),
    force: bool = False,
    progress: Optional[Callable[[int, int], None]] = None,
    cfg: TinyConfig = TinyConfig(),
) -> Assets:
    """Load the cached initial checkpoint, building it first when missing
    (or when ``force``). A cached file that does not load is an error that
    says to rebuild it, never silently replaced; one that loads but was built
    for another model config or spec is rebuilt, with a log line saying so."""
    path = assets_path(state_dir, spec, cfg)
    reason = "forced" if force else "missing"
    if path.exists() and not force:
        try:
            cached = load_assets(path)
        except CheckpointError as exc:
            steps = "" if spec.steps == PretrainSpec().steps else f" --steps {spec.steps}"
            raise CheckpointError(
                f"cached initial checkpoint {exc}; rebuild it with `genesis-fp16 forensics pretrain --force{steps}`"
            ) from None
        if cached.meta.get("model") == cfg.to_dict():
            return cached
        # a valid checkpoint of another model config (e.g. a shorter
        # max_len): the models are ours and rebuilding takes well under a
        # minute, so rebuild rather than make the user run --force
        reason = "cached config differs"
    log.info("forensics.pretrain_started", path=str(path), steps=spec.steps, reason=reason)
    assets = build_assets(spec, cfg, progress=progress)
    save_assets(assets, path)
    log.info(
        "forensics.pretrain_done",
        path=str(path),
        **{k: v for k, v in assets.meta.items() if isinstance(v, (int, float))},
    )
    assets.path = path
    return assets

"""Train a world-model-sized network under torchrun with DDP or FSDP2.

    torchrun --nproc_per_node=2 scripts/train_distributed.py --precision fp16 --steps 20 \
        --inject-overflow-rank 1 --inject-step 5 --json out.json

Each rank trains on its own shard of generated transitions (observation,
action -> next observation, reward, from a fixed random "teacher" dynamics
network). The JSON lists one entry per rank: ``rank``, ``param_checksum``
(SHA-256 of the parameters after training; under FSDP2 of the gathered full
parameters, with the local shard's digest as ``shard_checksum``),
``skipped_steps``, ``final_loss`` and the trainer's counters.

``--inject-overflow-rank R --inject-step K`` makes rank R alone see an infinite
gradient at optimizer step K (1-based): the gradient of the first layer's
second half of output features is set to +inf during backward, while the loss
stays finite. Only the FP16 scaler skips such a step, so it needs
``--precision fp16``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from genesis_fp16 import FP16TrainingConfig
from genesis_fp16.training.checkpoint import CheckpointError
from genesis_fp16.base.storage import atomic_write_text
from genesis_fp16.distributed import (
    DDPTrainer,
    DistributedEnvError,
    FSDPTrainer,
    destroy_distributed,
    exit_without_finalizers,
    gather_json,
    init_distributed,
    inject_inf_grad,
)
from genesis_fp16.base.seeds import init_parameters, torch_generator
from genesis_fp16.base.telemetry import get_logger


@dataclass
class Args:
    precision: str  # fp32 | fp16 | bf16
    steps: int  # optimizer steps
    wrap: str = "ddp"  # ddp | fsdp
    inject_overflow_rank: Optional[int] = None  # the rank that alone sees an infinite gradient
    inject_step: Optional[int] = None  # at this optimizer step (1-based)
    json: Optional[Path] = None  # where rank 0 writes the report
    batch_size: int = 64  # per rank, per micro-step
    accum: int = 1  # micro-steps per optimizer step
    hidden: int = 256
    lr: float = 1e-3
    init_scale: float = 65536.0  # the scaler's initial loss scale
    seed: int = 0
    save: Optional[Path] = None  # checkpoint written after the last step
    resume: Optional[Path] = None  # checkpoint to start from (steps counts the steps to add)


OBS, ACT = 32, 8


class WorldModel(nn.Module):
    """(observation, action) -> (next observation, reward): the shape of the
    project's world model, about 150k parameters at hidden=256."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.encoder = nn.Linear(OBS + ACT, hidden)
        self.body = nn.Sequential(nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU())
        self.head = nn.Linear(hidden, OBS + 1)
        self.inject = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        if self.inject:
            h = inject_inf_grad(h, slice(h.shape[-1] // 2, None))
        return self.head(self.body(h))


def make_batch(step: int, rank: int, world: int, args: Args, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    teacher = torch_generator(args.seed, "train_distributed.teacher")
    w1 = torch.randn(OBS + ACT, 64, generator=teacher) / (OBS + ACT) ** 0.5
    w2 = torch.randn(64, OBS + 1, generator=teacher) / 8.0
    # the global micro-batch's index: one world size with accumulation draws what more ranks draw without
    g = torch_generator(args.seed, "train_distributed.batch", (step * args.accum + micro) * world + rank)
    x = torch.randn(args.batch_size, OBS + ACT, generator=g)
    y = torch.tanh(x @ w1) @ w2 + 0.01 * torch.randn(args.batch_size, OBS + 1, generator=g)
    return x, y


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(model(x).float(), y)  # loss in FP32 under autocast


def digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(name.encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def local_tensors(trainer: Any) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    return {n: (p.to_local() if isinstance(p, DTensor) else p) for n, p in trainer.model.named_parameters()}


def parse_args(argv: Optional[list[str]] = None) -> Args:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--precision", required=True, choices=["fp32", "fp16", "bf16"])
    p.add_argument("--steps", required=True, type=int)
    p.add_argument("--wrap", default="ddp", choices=["ddp", "fsdp"])
    p.add_argument("--inject-overflow-rank", type=int, default=None)
    p.add_argument("--inject-step", type=int, default=None)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--init-scale", type=float, default=65536.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", type=Path, default=None)
    p.add_argument("--resume", type=Path, default=None)
    ns = p.parse_args(argv)
    args = Args(**{k: v for k, v in vars(ns).items()})
    if args.steps < 1 or args.batch_size < 1 or args.accum < 1 or args.hidden < 2:
        p.error("--steps, --batch-size, --accum must be >= 1 and --hidden >= 2")
    if (args.inject_overflow_rank is None) != (args.inject_step is None):
        p.error("--inject-overflow-rank and --inject-step go together")
    if args.inject_step is not None:
        if args.precision != "fp16":
            p.error(
                f"--inject-overflow-rank needs --precision fp16 (got {args.precision}): only the FP16 gradient "
                "scaler detects and skips an overflowed step; bf16/fp32 have no scaler"
            )
        if not 1 <= args.inject_step <= args.steps:
            p.error(f"--inject-step {args.inject_step}: expected 1..{args.steps}")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    try:
        ctx = init_distributed()
    except DistributedEnvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        code = run(args, ctx)
    except CheckpointError as exc:  # --resume: a missing, damaged or refused checkpoint
        if ctx.is_main:
            print(f"error: {exc}", file=sys.stderr)
        destroy_distributed(barrier=False)
        return 2
    except BaseException:
        destroy_distributed(barrier=False)
        raise
    destroy_distributed()
    return code


def run(args: Args, ctx: Any) -> int:
    log = get_logger("genesis_fp16.distributed", rank=ctx.rank)
    if args.inject_overflow_rank is not None and not 0 <= args.inject_overflow_rank < ctx.world_size:
        if ctx.is_main:
            print(
                f"error: --inject-overflow-rank {args.inject_overflow_rank}: expected 0..{ctx.world_size - 1}",
                file=sys.stderr,
            )
        return 2
    model = init_parameters(
        WorldModel(args.hidden), torch_generator(args.seed, "train_distributed.init")
    )  # same init on every rank (DDP also broadcasts rank 0's)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    config = FP16TrainingConfig(
        precision=args.precision,
        enabled=args.precision != "fp32",
        init_scale=args.init_scale,
        grad_accumulation_steps=args.accum,
        max_grad_norm=1.0,
    )
    cls = FSDPTrainer if args.wrap == "fsdp" else DDPTrainer
    trainer = cls(model, optimizer, config, name=f"train_distributed/{args.wrap}", context=ctx)
    if args.resume is not None:
        trainer.load_checkpoint(args.resume)
    first = trainer.training_steps
    log.info(
        "distributed.train_started",
        wrap=args.wrap,
        precision=trainer.precision.name,
        steps=args.steps,
        first_step=first,
    )

    from rich.progress import Progress

    losses: list[float] = []
    started = time.perf_counter()
    with Progress(transient=True, disable=not ctx.is_main) as progress:
        task = progress.add_task(f"{args.wrap} {trainer.precision.name}", total=args.steps)
        for step in range(first, first + args.steps):
            inject = (
                args.inject_step is not None and step + 1 == args.inject_step and ctx.rank == args.inject_overflow_rank
            )
            for micro in range(args.accum):
                trainer.module.inject = inject and micro == args.accum - 1
                # the data is drawn on the CPU (the same batches on every device), then moved to the model's
                x, y = make_batch(step, ctx.rank, ctx.world_size, args, micro)
                loss = trainer.training_step((x.to(ctx.device), y.to(ctx.device)), loss_fn)
                trainer.backward_and_step(loss)
                losses.append(float(loss.detach()))
            trainer.module.inject = False
            progress.advance(task)
    seconds = time.perf_counter() - started
    if args.save is not None:
        trainer.save_checkpoint(args.save, extra={"script": "train_distributed"})

    if isinstance(trainer, FSDPTrainer):
        checksum = digest(trainer.full_state_dict())
        shard = digest(local_tensors(trainer))
    else:
        checksum = digest(dict(trainer.module.named_parameters()))
        shard = checksum
    stats = trainer.get_stats()
    mine = {
        "rank": ctx.rank,
        "param_checksum": checksum,
        "shard_checksum": shard,
        "skipped_steps": stats["skipped_steps"],
        "overflow_steps": stats["overflow_steps"],
        "training_steps": stats["training_steps"],
        "current_scale": stats["current_scale"],
        "final_loss": losses[-1] if losses else None,
        "seconds": seconds,
        "samples_per_s": args.steps * args.accum * args.batch_size / seconds if seconds > 0 else None,
    }
    ranks = gather_json(mine)
    if ctx.is_main:
        report = {
            "wrap": args.wrap,
            "precision": trainer.precision.name,
            "world_size": ctx.world_size,
            "backend": ctx.backend,
            "device": str(trainer.device),
            "torch_version": torch.__version__,
            "steps": args.steps,
            "accum": args.accum,
            "batch_size_per_rank": args.batch_size,
            "inject": {"rank": args.inject_overflow_rank, "step": args.inject_step},
            "checksums_equal": len({r["param_checksum"] for r in ranks}) == 1,
            "ranks": ranks,
        }
        text = json.dumps(report, indent=2, sort_keys=True)
        if args.json is not None:
            atomic_write_text(args.json, text + "\n")
        summary = ", ".join(f"rank {r['rank']}: skipped {r['skipped_steps']} loss {r['final_loss']:.4g}" for r in ranks)
        print(
            f"{args.wrap}/{trainer.precision.name} x{ctx.world_size}: checksums equal={report['checksums_equal']}; "
            f"{summary}"
        )
    return 0


if __name__ == "__main__":
    # the process group is gone by now; skip finalizers that can abort a finished gloo run
    exit_without_finalizers(main())

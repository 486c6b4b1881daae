"""What the DDP and FSDP2 trainers share.

A distributed trainer is `FP16Trainer` plus a
wrapper; it overrides only the base trainer's hooks:

* ``_set_gradient_sync``: gradient accumulation all-reduces (DDP) or
  reduce-scatters (FSDP2) only on the last micro-step of an optimizer step.
* ``_all_finite``: the non-finite-loss decision is agreed across ranks (one
  rank skipping backward while the others wait in the all-reduce would hang).
* the scaler: DDP keeps ``torch.amp.GradScaler``; an infinite gradient on one
  rank reaches every rank through the gradient all-reduce, so every rank finds
  it and skips. FSDP2 uses ``ShardedGradScaler`` (see `.fsdp`).
* checkpoints: DDP writes one file (`.ddp`), FSDP2 a directory of DCP
  shards (`.dcp_io`).
* a seed-API ``auto`` (built without a decision, ``measures_auto``: DDP):
  rank 0 measures at the first batch, on copies of the unwrapped module and
  the optimizer, and every rank takes its decision (`gather_json`), so all
  ranks train in one precision. FSDP2 keeps the flag rule: its sharded model
  cannot be copied and stepped on one rank alone.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch
import torch.distributed as dist

from genesis_fp16.base.telemetry import EventListener
from genesis_fp16.precision.bare import FirstBatch
from genesis_fp16.precision.decision import PrecisionDecision
from genesis_fp16.training.trainer import FP16Trainer, FP16TrainingConfig, LossFn, calibration_copies
from genesis_fp16.distributed.launch import DistContext, gather_json, init_distributed


class DistributedTrainer(FP16Trainer):
    """What DDP and FSDP2 share: the process group, agreed skip decisions,
    rank-tagged events. Subclasses wrap the model."""

    supports_window = False  # every rank must agree on a skip: the per-step path's all-reduce of finiteness

    wrap_name = "distributed"
    measures_auto = False  # every rank must pick alike: the flag rule, unless a subclass measures on rank 0 (DDP)

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        config: Optional[FP16TrainingConfig] = None,
        scheduler: Optional[Any] = None,
        *,
        name: str = "trainer",
        listeners: Optional[list[EventListener]] = None,
        context: Optional[DistContext] = None,
        decision: Optional[PrecisionDecision] = None,
    ) -> None:
        config = dataclasses.replace(config) if config is not None else FP16TrainingConfig()
        self.ctx = context or init_distributed(config.device)
        if config.device is None:
            config = dataclasses.replace(config, device=str(self.ctx.device))
        self.module = model.to(torch.device(config.device))
        wrapped = self._wrap(self.module, optimizer)
        super().__init__(wrapped, optimizer, config, scheduler, name=name, listeners=listeners, decision=decision)
        self._log = self._log.bind(rank=self.ctx.rank, world_size=self.ctx.world_size, wrap=self.wrap_name)

    @classmethod
    def create(
        cls,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        config: Optional[FP16TrainingConfig] = None,
        scheduler: Any = None,
        *,
        precision: Optional[str] = None,
        **kwargs: Any,
    ) -> DistributedTrainer:
        """The registry's factory (``ddp``, ``fsdp``): ``precision`` forces a mode
        over the config's, as for the single-process names."""
        config = config or FP16TrainingConfig()
        if precision is not None:
            config = dataclasses.replace(config, precision=precision, enabled=precision != "fp32" or config.enabled)
        return cls(model, optimizer, config, scheduler, **kwargs)

    def _wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> torch.nn.Module:
        raise NotImplementedError

    @property
    def rank(self) -> int:
        return self.ctx.rank

    @property
    def world_size(self) -> int:
        return self.ctx.world_size

    def _emit(self, event: str, level: str = "info", **fields: Any) -> None:
        fields.setdefault("rank", self.ctx.rank)
        super()._emit(event, level, **fields)

    def _first_batch_decision(self, first: FirstBatch, batch: Any, loss_fn: LossFn) -> PrecisionDecision:
        """Rank 0 measures on copies of the unwrapped module (no collective runs in the copies) and sends its
        decision to every rank (collective: every rank calls it at its first batch). A failure of rank 0's
        measurement is the flag rule, sent alike, never a peer left waiting."""
        when = "decided at the first batch on rank 0"
        mine: Optional[PrecisionDecision] = None
        if self.ctx.is_main:
            try:
                mine = first.decide(
                    self.module,
                    self.optimizer,
                    batch,
                    loss_fn,
                    device=self.device,
                    when=when,
                    copy_trainer=calibration_copies(self.config, self.device, self.name),
                )
            except Exception as exc:  # the other ranks wait in the gather below
                mine = first.unmeasured(self.device, f"rank 0's measurement failed ({type(exc).__name__}: {exc})", when)
        sent = gather_json(mine.as_dict() if mine is not None else None)[0]
        return mine if mine is not None else PrecisionDecision.from_dict(sent)

    def _all_finite(self, loss: torch.Tensor) -> bool:
        # One small all-reduce per micro-step: every rank skips backward together.
        flag = torch.isfinite(loss.detach()).all().to(device=self.device, dtype=torch.float32).reshape(1)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item() > 0.5)

    def get_stats(self) -> dict[str, Any]:
        stats = super().get_stats()
        stats.update(rank=self.ctx.rank, world_size=self.ctx.world_size, wrap=self.wrap_name, backend=self.ctx.backend)
        return stats

    # per-rank RNG: each rank resumes its own stream (dropout, sampling)
    def _gather_rng(self) -> torch.Tensor:
        state = torch.get_rng_state()
        comm_state = state.to(self.device)
        gathered = [torch.empty_like(comm_state) for _ in range(self.ctx.world_size)]
        dist.all_gather(gathered, comm_state)
        return torch.stack([g.cpu() for g in gathered])

    def _restore_rank_rng(self, payload: dict[str, Any]) -> None:
        per_rank = (payload.get("rng") or {}).get("torch_cpu_ranks")
        if isinstance(per_rank, torch.Tensor) and per_rank.dim() == 2 and per_rank.shape[0] == self.ctx.world_size:
            torch.set_rng_state(per_rank[self.ctx.rank].clone())

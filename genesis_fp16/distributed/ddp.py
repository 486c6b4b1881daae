"""``DistributedDataParallel``: every rank holds the whole model; checkpoints
are one file in the single-process format, so they load into a plain trainer."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Union

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from genesis_fp16.training import checkpoint as ckpt
from genesis_fp16.training.trainer import ExtraCheck
from genesis_fp16.distributed.base import DistributedTrainer


class DDPTrainer(DistributedTrainer):
    """``DistributedDataParallel`` around the model; FP32, FP16 (GradScaler) or BF16.

    ``save_checkpoint`` and ``load_checkpoint`` are collective: call them on
    every rank. Rank 0 writes one file in the single-process format with the
    unwrapped module's state; every rank reads it (the path must be on a
    filesystem all ranks see)."""

    wrap_name = "ddp"
    measures_auto = True  # a seed-API auto: rank 0 measures at the first batch, every rank takes its decision

    def __init__(self, *args: Any, ddp_kwargs: Optional[dict[str, Any]] = None, **kwargs: Any) -> None:
        self._ddp_kwargs = dict(ddp_kwargs or {})
        super().__init__(*args, **kwargs)

    def _wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> torch.nn.Module:
        if isinstance(model, DDP):
            self.module = model.module
            return model
        kwargs = dict(self._ddp_kwargs)
        device = next((p.device for p in model.parameters()), self.ctx.device)
        if device.type == "cuda":
            kwargs.setdefault("device_ids", [device.index])
        # DDP broadcasts rank 0's parameters at construction: every rank starts equal.
        return DDP(model, **kwargs)

    def _set_gradient_sync(self, sync: bool) -> None:
        # What DDP.no_sync() toggles; DDP reads it in forward, so set it before.
        self.model.require_backward_grad_sync = sync

    def _model_state(self) -> dict[str, Any]:
        return self.module.state_dict()  # no "module." prefix: loads into a plain model

    def _load_model_state(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state)

    def save_checkpoint(self, path: Union[str, Path], extra: Optional[dict[str, Any]] = None) -> Path:
        path = Path(path)
        rng = self._gather_rng()
        if self.ctx.is_main:
            payload = self.state_payload(extra)
            payload["rng"]["torch_cpu_ranks"] = rng
            payload["extra"] = dict(payload["extra"], world_size=self.ctx.world_size, wrap=self.wrap_name)
            ckpt.save_payload(path, payload)
            self._emit("checkpoint.saved", path=str(path), step=self.training_steps, wrap=self.wrap_name)
        dist.barrier()  # nobody reads the file before rank 0 has renamed it into place
        return path

    def load_checkpoint(
        self, path: Union[str, Path], *, restore_rng: bool = True, check_extra: Optional[ExtraCheck] = None
    ) -> dict[str, Any]:
        payload = ckpt.load_payload(path, map_location=self.device)
        self.apply_payload(payload, source=str(path), restore_rng=restore_rng, check_extra=check_extra)
        if restore_rng:
            self._restore_rank_rng(payload)
        return payload.get("extra") or {}

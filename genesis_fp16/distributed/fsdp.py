"""FSDP2 (``torch.distributed.fsdp.fully_shard``): parameters, gradients and
optimizer state sharded across ranks.

FP16 uses ``ShardedGradScaler``, which all-reduces ``found_inf``: after a
reduce-scatter each rank holds only its shard of the gradients, so an overflow
in rank 1's shard would be invisible to rank 0 otherwise. Checkpoints are
directories written and read by `.dcp_io`.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Mapping, Optional, Union

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.distributed.tensor import DTensor

from genesis_fp16.training import checkpoint as ckpt
from genesis_fp16.precision.modes import MODES
from genesis_fp16.precision.plugins import FP16Mixed, Precision
from genesis_fp16.base.settings import PrecisionMode
from genesis_fp16.training.trainer import ExtraCheck
from genesis_fp16.distributed.base import DistributedTrainer
from genesis_fp16.distributed.dcp_io import (
    FSDP_LAYOUT,
    FSDP_SHARDS_DIR,
    FSDP_TRAINER_FILE,
    load_sharded,
    partial_dir,
    read_trainer_file,
    replace_dir,
    save_sharded,
)


class QuietShardedGradScaler(ShardedGradScaler):
    """``ShardedGradScaler`` without one warning: torch 2.13's DTensor found_inf
    handler warns about the scaler's own shape-(1,) found_inf on every step;
    the result is right, the warning is noise."""

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Found a non-scalar tensor with numel=1", category=UserWarning)
            super().unscale_(optimizer)


class ShardedFP16Mixed(FP16Mixed):
    """FP16 under FSDP2: the scaler is a ``ShardedGradScaler``, which all-reduces
    ``found_inf`` so that an overflow in one rank's gradient shard makes every
    rank skip the step."""

    def make_scaler(self) -> torch.amp.GradScaler:
        return QuietShardedGradScaler(self.device.type, **self.scaler_kwargs, enabled=True)


class FSDPTrainer(DistributedTrainer):
    """FSDP2 (``torch.distributed.fsdp.fully_shard``): parameters, gradients and
        optimizer state sharded across ranks; FP16 uses ``ShardedGradScaler``
    (through the `ShardedFP16Mixed` precision plugin).

        ``fully_shard`` replaces the model's parameters with sharded DTensors, so an
        optimizer built on the plain model is re-pointed at them (it must not hold
        state yet). ``shard`` chooses the submodules sharded before the root
        (default: every direct child that has parameters).

        ``save_checkpoint(path)`` writes a directory: ``shards/`` (DCP: model and
        optimizer tensors, each rank its shard) and ``trainer.pt`` (single-process
        format: scaler, scheduler, counters, optimizer hyperparameters, per-rank RNG).
    """

    wrap_name = "fsdp"
    precision_plugins: ClassVar[Mapping[PrecisionMode, type[Precision]]] = {
        **MODES,
        PrecisionMode.FP16: ShardedFP16Mixed,
    }

    def __init__(
        self,
        *args: Any,
        shard: Optional[Callable[[torch.nn.Module], Iterable[torch.nn.Module]]] = None,
        reshard_after_forward: bool = True,
        **kwargs: Any,
    ) -> None:
        self._shard = shard
        self._reshard_after_forward = reshard_after_forward
        super().__init__(*args, **kwargs)

    def _wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> torch.nn.Module:
        if isinstance(model, FSDPModule):
            return model
        if optimizer.state:
            raise ValueError(
                "FSDPTrainer: the optimizer already holds state; fully_shard replaces the parameters, "
                "so pass a fresh optimizer (or shard the model yourself and build the optimizer on it)"
            )
        names = {id(p): n for n, p in model.named_parameters()}
        device = next((p.device for p in model.parameters()), self.ctx.device)
        mesh = init_device_mesh(device.type, (self.ctx.world_size,))
        targets = (
            list(self._shard(model))
            if self._shard
            else [child for child in model.children() if any(True for _ in child.parameters())]
        )
        for sub in targets:
            fully_shard(sub, mesh=mesh, reshard_after_forward=self._reshard_after_forward)
        fully_shard(model, mesh=mesh, reshard_after_forward=self._reshard_after_forward)
        sharded = dict(model.named_parameters())
        for group in optimizer.param_groups:
            try:
                group["params"] = [sharded[names[id(p)]] for p in group["params"]]
            except KeyError as exc:
                raise ValueError(f"FSDPTrainer: optimizer holds a parameter that is not in the model ({exc})") from None
        return model

    def _set_gradient_sync(self, sync: bool) -> None:
        self.model.set_requires_gradient_sync(sync)

    def _clip_gradients(self, max_norm: float) -> torch.Tensor:
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        return norm.full_tensor() if isinstance(norm, DTensor) else norm

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Unsharded model state on every rank (collective), e.g. for a digest or export."""
        return get_model_state_dict(
            self.model, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
        )

    def _model_state(self) -> dict[str, Any]:
        # the single-file format (state_payload) gets the full state
        return {k: v.detach().cpu() for k, v in self.full_state_dict().items()}

    _model_from_shards = False

    def _check_model_state(self, state: Any, source: str) -> None:
        if self._model_from_shards:
            return
        # a DTensor's shape is the global one: no gather needed to compare
        ckpt.check_model_state(state, self.model.state_dict(), source)

    def _check_sharded_optimizer(self, saved: Any, saved_type: Any, source: str) -> None:
        mine = ckpt.optimizer_type_name(self.optimizer)
        if saved_type is not None and saved_type != mine:
            raise ckpt.CheckpointError(
                f"{source}: field optimizer_type: saved from {saved_type}, this trainer's is {mine}"
            )
        if not isinstance(saved, dict):
            raise ckpt.CheckpointError(f"{source}: field optimizer: a {type(saved).__name__}, expected a dict")
        if saved.get("param_groups") is not None:
            live = self.optimizer.state_dict()["param_groups"]
            ckpt.check_param_groups(saved["param_groups"], live, source, known_keys_only=saved_type is None)

    def _load_model_state(self, state: dict[str, Any]) -> None:
        if self._model_from_shards:
            return
        set_model_state_dict(self.model, state, options=StateDictOptions(full_state_dict=True))

    # -- DCP checkpoints ------------------------------------------------------------
    def save_checkpoint(self, path: Union[str, Path], extra: Optional[dict[str, Any]] = None) -> Path:
        """Collective: every rank writes its shards. The directory appears at
        ``path`` only once complete (written beside it, then renamed)."""
        if self._micro_in_window:
            self.state_payload()  # raises the trainer's mid-window error
        path = Path(path)
        partial = partial_dir(path)
        if self.ctx.is_main:
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
        dist.barrier()
        optimizer_rest = save_sharded(self.model, self.optimizer, partial / FSDP_SHARDS_DIR)
        rng = self._gather_rng()
        if self.ctx.is_main:
            payload = ckpt.build_payload(
                model={},  # in shards/
                optimizer=optimizer_rest,
                optimizer_type=ckpt.optimizer_type_name(self.optimizer),
                scaler=self.precision.state_dict(),
                scheduler=self.scheduler.state_dict() if self.scheduler is not None else None,
                counters=self.counters(),
                precision=self.precision.name,
                extra=dict(extra or {}, world_size=self.ctx.world_size, wrap=self.wrap_name),
                rng={"torch_cpu": torch.get_rng_state(), "torch_cpu_ranks": rng},
            )
            payload["layout"] = FSDP_LAYOUT
            ckpt.save_payload(partial / FSDP_TRAINER_FILE, payload)
            replace_dir(partial, path)
            self._emit("checkpoint.saved", path=str(path), step=self.training_steps, wrap=self.wrap_name)
        dist.barrier()
        return path

    def load_checkpoint(
        self, path: Union[str, Path], *, restore_rng: bool = True, check_extra: Optional[ExtraCheck] = None
    ) -> dict[str, Any]:
        """Collective. Resharding to another world size is DCP's job and works
        for model and optimizer tensors; the per-rank RNG is then not restored."""
        path = Path(path)
        payload = read_trainer_file(path)
        # model and optimizer come from the shards; apply_payload restores
        # scaler, scheduler, counters and RNG. Everything is checked before the
        # shards are read, and they are read into copies.
        rest = dict(payload, model={}, optimizer=None)
        self._model_from_shards = True
        try:
            self.check_payload(rest, source=str(path), check_extra=check_extra)
            saved_optimizer = payload.get("optimizer") or {}
            self._check_sharded_optimizer(saved_optimizer, payload.get("optimizer_type"), str(path))
            load_sharded(self.model, self.optimizer, path / FSDP_SHARDS_DIR, saved_optimizer)
            self.apply_payload(rest, source=str(path), restore_rng=restore_rng)
        finally:
            self._model_from_shards = False
        if restore_rng:
            self._restore_rank_rng(payload)
        return payload.get("extra") or {}

"""DDP and FSDP2 under ``torchrun``: the "extended" trainer.

The extended trainers are :class:`~genesis_fp16.trainer.FP16Trainer` plus a
wrapper; they override only the base trainer's hooks:

* ``_set_gradient_sync``: gradient accumulation all-reduces (DDP) or
  reduce-scatters (FSDP2) only on the last micro-step of an optimizer step.
* ``_all_finite``: the non-finite-loss decision is agreed across ranks (one
  rank skipping backward while the others wait in the all-reduce would hang).
* the scaler: DDP keeps ``torch.amp.GradScaler``; an infinite gradient on one
  rank reaches every rank through the gradient all-reduce, so every rank finds
  it and skips. FSDP2 uses ``ShardedGradScaler``, which all-reduces
  ``found_inf``: after a reduce-scatter each rank holds only its shard, so an
  overflow in rank 1's shard is invisible to rank 0 otherwise.
* checkpoints: DDP saves the unwrapped module's state from rank 0 in the
  foundation format (so it loads into a single-process trainer); FSDP2 saves
  model and optimizer shards with ``torch.distributed.checkpoint`` (DCP).

The process group comes from the ``torchrun`` environment (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), read through
:class:`TorchrunEnv`: ``nccl`` on CUDA, ``gloo`` on CPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import os
import pickle
import shutil
import sys
import warnings
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NoReturn, Optional, Union

import torch
import torch.distributed as dist
from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from . import checkpoint as ckpt
from . import registry
from .telemetry import EventListener, get_logger
from .trainer import FP16Trainer, FP16TrainingConfig

TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
FSDP_LAYOUT = "fsdp-dcp"
FSDP_TRAINER_FILE = "trainer.pt"
FSDP_SHARDS_DIR = "shards"


class DistributedEnvError(RuntimeError):
    """The process was not started by torchrun, or its environment is half set."""


class TorchrunEnv(BaseSettings):
    """The variables ``torchrun`` sets for every worker (no prefix)."""

    model_config = SettingsConfigDict(env_prefix="", case_sensitive=False, extra="ignore")

    rank: Optional[int] = Field(None, ge=0, validation_alias="RANK")
    local_rank: Optional[int] = Field(None, ge=0, validation_alias="LOCAL_RANK")
    world_size: Optional[int] = Field(None, ge=1, validation_alias="WORLD_SIZE")
    master_addr: Optional[str] = Field(None, validation_alias="MASTER_ADDR")
    master_port: Optional[int] = Field(None, ge=1, le=65535, validation_alias="MASTER_PORT")

    def present(self) -> list[str]:
        values = (self.rank, self.local_rank, self.world_size, self.master_addr, self.master_port)
        return [name for name, value in zip(TORCHRUN_VARS, values) if value not in (None, "")]


LAUNCH_HINT = "launch with `torchrun --nproc_per_node=N your_script.py` (it sets all of them)"


def read_torchrun_env() -> Optional[TorchrunEnv]:
    """The torchrun environment, None when none of its variables is set, and a
    :class:`DistributedEnvError` naming the missing ones when it is half set."""
    try:
        env = TorchrunEnv()
    except ValidationError as err:
        bad = "; ".join(f"{e['loc'][0]}={e.get('input')!r}: {e['msg']}" for e in err.errors())
        raise DistributedEnvError(f"invalid torchrun environment: {bad}; {LAUNCH_HINT}") from None
    present = env.present()
    if not present:
        return None
    missing = [name for name in TORCHRUN_VARS if name not in present]
    if missing:
        raise DistributedEnvError(
            f"half-set torchrun environment: {', '.join(present)} set but {', '.join(missing)} missing; "
            f"set all of {', '.join(TORCHRUN_VARS)} or none, or {LAUNCH_HINT}"
        )
    assert env.rank is not None and env.world_size is not None
    if env.rank >= env.world_size:
        raise DistributedEnvError(f"RANK={env.rank} is not below WORLD_SIZE={env.world_size}; {LAUNCH_HINT}")
    return env


# -- process group ----------------------------------------------------------------


@dataclass(frozen=True)
class DistContext:
    rank: int
    local_rank: int
    world_size: int
    backend: str
    device: torch.device
    owns_group: bool = False  # True when init_distributed created the process group

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def default_backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init_distributed(
    device: Union[str, torch.device, None] = None,
    backend: Optional[str] = None,
    timeout_s: float = 600.0,
) -> DistContext:
    """Join (or create) the default process group from the torchrun environment.

    ``device`` None picks ``cuda:<LOCAL_RANK>`` when CUDA is available, else the
    CPU; the backend follows the device (``nccl`` / ``gloo``).
    """
    env = read_torchrun_env()
    if dist.is_initialized():
        rank = dist.get_rank()
        local_rank = env.local_rank if env is not None and env.local_rank is not None else rank
        dev = torch.device(device) if device is not None else _default_device(local_rank)
        return DistContext(rank, local_rank, dist.get_world_size(), str(dist.get_backend()), dev, owns_group=False)
    if env is None:
        raise DistributedEnvError(
            f"not started by torchrun: none of {', '.join(TORCHRUN_VARS)} is set; {LAUNCH_HINT}, "
            "or unset GENESIS_FP16_DISTRIBUTED to train in one process"
        )
    assert env.rank is not None and env.local_rank is not None and env.world_size is not None
    dev = torch.device(device) if device is not None else _default_device(env.local_rank)
    if dev.type == "cuda":
        if dev.index is None:
            dev = torch.device("cuda", env.local_rank)
        torch.cuda.set_device(dev)
    chosen = backend or default_backend(dev)
    # env:// lets torch join torchrun's own store (TORCHELASTIC_USE_AGENT_STORE) rather than bind MASTER_PORT again.
    dist.init_process_group(
        chosen, init_method="env://", rank=env.rank, world_size=env.world_size, timeout=timedelta(seconds=timeout_s)
    )
    ctx = DistContext(env.rank, env.local_rank, env.world_size, chosen, dev, owns_group=True)
    get_logger("genesis_fp16.distributed", rank=ctx.rank).info(
        "distributed.initialised", world_size=ctx.world_size, local_rank=ctx.local_rank, backend=chosen, device=str(dev)
    )
    return ctx


def _default_device(local_rank: int) -> torch.device:
    return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")


def destroy_distributed(barrier: bool = True) -> None:
    """Tear the default process group down (no-op when there is none).

    The barrier first keeps a fast rank from closing its connections while a
    slower one is still receiving (gloo aborts the process then); pass
    ``barrier=False`` when unwinding from an error, where a peer may be gone."""
    if dist.is_initialized():
        if barrier:
            dist.barrier()
        dist.destroy_process_group()


def exit_without_finalizers(code: int = 0) -> NoReturn:
    """End a worker process whose work is done and whose process group is
    destroyed, without running the interpreter's finalizers.

    Gloo's C++ worker threads can still hold work objects whose destructors need
    the GIL while the interpreter is being torn down; the process then aborts
    (SIGABRT, "terminate called without an active exception") after a run that
    succeeded, and torchrun or ``mp.spawn`` report a failure. Seen once in
    tests/test_distributed.py (FSDP2 over gloo, 2026-11-23); pytorch/pytorch
    PR 179291 describes the mechanism. Everything this project writes is
    already on disk by then (atomic writes, the event log opens and closes its
    file per line); stdout and stderr are flushed here.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


@contextlib.contextmanager
def distributed_session(
    device: Union[str, torch.device, None] = None, backend: Optional[str] = None
) -> Iterator[DistContext]:
    """``with distributed_session() as ctx:`` initialises and always tears down."""
    ctx = init_distributed(device, backend)
    try:
        yield ctx
    except BaseException:
        if ctx.owns_group:
            destroy_distributed(barrier=False)
        raise
    if ctx.owns_group:
        destroy_distributed()


def gather_json(obj: Any, device: Union[str, torch.device, None] = None) -> list[Any]:
    """Every rank's JSON-able ``obj``, in rank order, on every rank (collective).
    Sent as UTF-8 bytes and parsed as JSON: no pickle between processes."""
    import json

    dev = torch.device(device) if device is not None else (
        torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    )
    data = torch.tensor(list(json.dumps(obj).encode("utf-8")), dtype=torch.uint8, device=dev)
    sizes = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, torch.tensor([data.numel()], dtype=torch.int64, device=dev))
    longest = int(max(int(s.item()) for s in sizes))
    padded = torch.zeros(longest, dtype=torch.uint8, device=dev)
    padded[: data.numel()] = data
    chunks = [torch.empty(longest, dtype=torch.uint8, device=dev) for _ in sizes]
    dist.all_gather(chunks, padded)
    return [json.loads(bytes(c[: int(s.item())].cpu().tolist()).decode("utf-8")) for c, s in zip(chunks, sizes)]


# -- fault injection (drills, tests, scripts/train_distributed.py) ------------------


class _NonFiniteGrad(torch.autograd.Function):
    """Identity forward; backward makes the chosen features' gradient +inf."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, features: Optional[slice]) -> torch.Tensor:  # type: ignore[override]
        ctx.features = features
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        grad = grad.clone()
        if ctx.features is None:
            grad.fill_(float("inf"))
        else:
            grad[..., ctx.features] = float("inf")
        return grad, None


def inject_inf_grad(x: torch.Tensor, features: Optional[slice] = None) -> torch.Tensor:
    """Return ``x`` unchanged, but the gradient flowing back through it is +inf
    (in ``features`` of the last dimension only, when given). The loss stays
    finite, so only the scaler's overflow check can catch it."""
    return _NonFiniteGrad.apply(x, features)


# -- the trainers --------------------------------------------------------------------


class DistributedTrainer(FP16Trainer):
    """What DDP and FSDP2 share: the process group, agreed skip decisions,
    rank-tagged events. Subclasses wrap the model."""

    wrap_name = "distributed"

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
    ) -> None:
        config = dataclasses.replace(config) if config is not None else FP16TrainingConfig()
        self.ctx = context or init_distributed(config.device)
        if config.device is None:
            config = dataclasses.replace(config, device=str(self.ctx.device))
        self.module = model.to(torch.device(config.device))
        wrapped = self._wrap(self.module, optimizer)
        super().__init__(wrapped, optimizer, config, scheduler, name=name, listeners=listeners)
        self._log = self._log.bind(rank=self.ctx.rank, world_size=self.ctx.world_size, wrap=self.wrap_name)

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


class DDPTrainer(DistributedTrainer):
    """``DistributedDataParallel`` around the model; FP32, FP16 (GradScaler) or BF16.

    ``save_checkpoint`` and ``load_checkpoint`` are collective: call them on
    every rank. Rank 0 writes one file in the foundation format with the
    unwrapped module's state; every rank reads it (the path must be on a
    filesystem all ranks see)."""

    wrap_name = "ddp"

    def __init__(self, *args: Any, ddp_kwargs: Optional[dict[str, Any]] = None, **kwargs: Any) -> None:
        self._ddp_kwargs = dict(ddp_kwargs or {})
        super().__init__(*args, **kwargs)

    def _wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> torch.nn.Module:
        from torch.nn.parallel import DistributedDataParallel as DDP

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

    def load_checkpoint(self, path: Union[str, Path], *, restore_rng: bool = True) -> dict[str, Any]:
        payload = ckpt.load_payload(path, map_location=self.device)
        self.apply_payload(payload, source=str(path), restore_rng=restore_rng)
        if restore_rng:
            self._restore_rank_rng(payload)
        return payload.get("extra") or {}


class FSDPTrainer(DistributedTrainer):
    """FSDP2 (``torch.distributed.fsdp.fully_shard``): parameters, gradients and
    optimizer state sharded across ranks; FP16 uses ``ShardedGradScaler``.

    ``fully_shard`` replaces the model's parameters with sharded DTensors, so an
    optimizer built on the plain model is re-pointed at them (it must not hold
    state yet). ``shard`` chooses the submodules sharded before the root
    (default: every direct child that has parameters).

    ``save_checkpoint(path)`` writes a directory: ``shards/`` (DCP: model and
    optimizer tensors, each rank its shard) and ``trainer.pt`` (foundation
    format: scaler, scheduler, counters, optimizer hyperparameters, per-rank RNG).
    """

    wrap_name = "fsdp"

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
        if self.precision.uses_scaler:
            self.precision.scaler = self._sharded_scaler()  # same options, so the same starting scale

    def _sharded_scaler(self) -> torch.amp.GradScaler:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        class QuietShardedGradScaler(ShardedGradScaler):
            # torch 2.13's DTensor found_inf handler warns about the scaler's own
            # shape-(1,) found_inf on every step; the result is right, the warning is noise.
            def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message="Found a non-scalar tensor with numel=1", category=UserWarning)
                    super().unscale_(optimizer)

        opts = self.config.scaler_options()
        return QuietShardedGradScaler(
            self.device.type,
            init_scale=opts.init_scale,
            growth_factor=opts.growth_factor,
            backoff_factor=opts.backoff_factor,
            growth_interval=opts.growth_interval,
            enabled=True,
        )

    def _wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> torch.nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FSDPModule, fully_shard

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
        targets = list(self._shard(model)) if self._shard else [
            child for child in model.children() if any(True for _ in child.parameters())
        ]
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
        from torch.distributed.tensor import DTensor

        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        return norm.full_tensor() if isinstance(norm, DTensor) else norm

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Unsharded model state on every rank (collective), e.g. for a digest or export."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=False))

    def _model_state(self) -> dict[str, Any]:
        # the foundation's single-file format (state_payload) gets the full state
        return {k: v.detach().cpu() for k, v in self.full_state_dict().items()}

    _model_from_shards = False

    def _load_model_state(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        if self._model_from_shards:
            return
        set_model_state_dict(self.model, state, options=StateDictOptions(full_state_dict=True))

    # -- DCP checkpoints ------------------------------------------------------------
    def save_checkpoint(self, path: Union[str, Path], extra: Optional[dict[str, Any]] = None) -> Path:
        """Collective: every rank writes its shards. The directory appears at
        ``path`` only once complete (written beside it, then renamed)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        if self._micro_in_window:
            self.state_payload()  # raises the foundation's mid-window error
        path = Path(path)
        partial = path.parent / f".{path.name}.partial"
        if self.ctx.is_main:
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
        dist.barrier()
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        tensors, scalars = _split_optim_state(optim_sd["state"])
        dcp.save({"model": model_sd, "optim": tensors}, checkpoint_id=str(partial / FSDP_SHARDS_DIR))
        rng = self._gather_rng()
        if self.ctx.is_main:
            payload = ckpt.build_payload(
                model={},  # in shards/
                optimizer={"param_groups": optim_sd["param_groups"], "scalar_state": scalars},
                scaler=self.scaler.state_dict() if self.scaler.is_enabled() else {},
                scheduler=self.scheduler.state_dict() if self.scheduler is not None else None,
                counters=self._counters(),
                precision=self.precision.name,
                extra=dict(extra or {}, world_size=self.ctx.world_size, wrap=self.wrap_name),
                rng={"torch_cpu": torch.get_rng_state(), "torch_cpu_ranks": rng},
            )
            payload["layout"] = FSDP_LAYOUT
            ckpt.save_payload(partial / FSDP_TRAINER_FILE, payload)
            old = path.parent / f".{path.name}.old"
            if path.exists():
                shutil.rmtree(old, ignore_errors=True)
                path.rename(old)
            partial.rename(path)
            shutil.rmtree(old, ignore_errors=True)
            self._emit("checkpoint.saved", path=str(path), step=self.training_steps, wrap=self.wrap_name)
        dist.barrier()
        return path

    def load_checkpoint(self, path: Union[str, Path], *, restore_rng: bool = True) -> dict[str, Any]:
        """Collective. Resharding to another world size is DCP's job and works
        for model and optimizer tensors; the per-rank RNG is then not restored."""
        from torch.distributed.checkpoint.state_dict import set_state_dict, get_state_dict

        path = Path(path)
        trainer_file = path / FSDP_TRAINER_FILE
        if not path.is_dir() or not trainer_file.is_file():
            raise ckpt.CheckpointError(
                f"{path}: not an FSDP checkpoint directory (expected {FSDP_SHARDS_DIR}/ and {FSDP_TRAINER_FILE}); "
                "DDP and single-process checkpoints are single files"
            )
        payload = ckpt.load_payload(trainer_file, map_location="cpu")
        if payload.get("layout") != FSDP_LAYOUT:
            raise ckpt.CheckpointError(f"{trainer_file}: layout {payload.get('layout')!r}, expected {FSDP_LAYOUT!r}")
        # the metadata pickle is checked before anything else touches it (no collective needed)
        _safe_reader(path / FSDP_SHARDS_DIR).read_metadata()
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)  # targets with the right sharding
        tensors, _ = _split_optim_state(optim_sd["state"])
        target = {"model": model_sd, "optim": tensors}
        _load_shards(target, path / FSDP_SHARDS_DIR)
        saved_opt = payload.get("optimizer") or {}
        optim_sd = {
            "state": _merge_optim_state(target["optim"], saved_opt.get("scalar_state") or {}),
            "param_groups": saved_opt.get("param_groups") or optim_sd["param_groups"],
        }
        set_state_dict(self.model, self.optimizer, model_state_dict=target["model"], optim_state_dict=optim_sd)
        self._apply_trainer_state(payload, source=str(path), restore_rng=restore_rng)
        return payload.get("extra") or {}

    def _apply_trainer_state(self, payload: dict[str, Any], *, source: str, restore_rng: bool) -> None:
        # the foundation's apply_payload for scaler, scheduler, counters and RNG;
        # model and optimizer came from the shards already
        self._model_from_shards = True
        try:
            self.apply_payload(dict(payload, model={}, optimizer=None), source=source, restore_rng=restore_rng)
        finally:
            self._model_from_shards = False
        if restore_rng:
            self._restore_rank_rng(payload)


def _split_optim_state(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Tensors go to DCP; anything else (rare: ints, None) to the trainer file,
    so DCP never needs to pickle (and we never unpickle) a non-tensor."""
    tensors: dict[str, Any] = {}
    scalars: dict[str, Any] = {}
    for fqn, per_param in state.items():
        for key, value in per_param.items():
            (tensors if isinstance(value, torch.Tensor) else scalars).setdefault(fqn, {})[key] = value
    return tensors, scalars


def _merge_optim_state(tensors: dict[str, Any], scalars: dict[str, Any]) -> dict[str, Any]:
    merged = {fqn: dict(values) for fqn, values in tensors.items()}
    for fqn, values in scalars.items():
        merged.setdefault(fqn, {}).update(values)
    return merged


# -- safe DCP reading -------------------------------------------------------------------

# Exact (module, name) pairs, resolved without walking dotted names: the globals
# in the .metadata pickle of an FSDP2 checkpoint saved by torch 2.13's DCP
# (recorded with a find_class that logs), plus BytesStorageMetadata, which DCP
# writes for a non-tensor entry (the planner then refuses that entry by name).
# A prefix such as "torch.distributed.checkpoint." would admit
# "torch.distributed.checkpoint.filesystem" + "os.system" under pickle protocol 4.
_SAFE_GLOBALS = frozenset(
    {
        ("torch.distributed.checkpoint.metadata", "Metadata"),
        ("torch.distributed.checkpoint.metadata", "MetadataIndex"),
        ("torch.distributed.checkpoint.metadata", "StorageMeta"),
        ("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"),
        ("torch.distributed.checkpoint.metadata", "TensorProperties"),
        ("torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"),
        ("torch.distributed.checkpoint.metadata", "BytesStorageMetadata"),
        ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),  # looks a layout up by name in a fixed table
        ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id
        ("pathlib", "WindowsPath"),
    }
)


class _RefusedGlobal(pickle.UnpicklingError):
    """The metadata pickle names a global outside the allow-list."""


class _MetadataUnpickler(pickle.Unpickler):
    """DCP's ``.metadata`` file is a pickle (a torch design); unpickle only the
    DCP metadata classes and torch dtypes, nothing that runs code."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _SAFE_GLOBALS:
            return getattr(importlib.import_module(module), name)
        if module == "torch" and "." not in name and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)  # a dtype pickles as the global torch.<name>
        raise _RefusedGlobal(f"DCP metadata refers to {module}.{name}, which is not a DCP metadata class")


def _read_dcp_metadata(path: Path) -> Any:
    """Unpickle ``path`` with the allow-list; every failure is one ``CheckpointError``
    naming the file, what is wrong with it and what to do."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import Metadata

    redo = "save the checkpoint again or resume from another one"
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ckpt.CheckpointError(f"{path}: cannot read the DCP metadata ({exc.strerror or exc}); {redo}") from None
    if not data:
        raise ckpt.CheckpointError(
            f"{path}: the DCP metadata is empty (0 bytes), so the checkpoint was not written completely; {redo}"
        )
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except _RefusedGlobal as exc:
        raise ckpt.CheckpointError(
            f"{path}: refused to load: {exc}. torch writes no such global, so the file was crafted or "
            "tampered with; do not load this checkpoint"
        ) from None
    except Exception as exc:
        raise ckpt.CheckpointError(
            f"{path}: the DCP metadata is corrupt or truncated ({type(exc).__name__}: {exc}); {redo}"
        ) from None
    if not isinstance(metadata, Metadata):
        raise ckpt.CheckpointError(
            f"{path}: the DCP metadata holds a {type(metadata).__name__}, not DCP metadata; {redo}"
        )
    if not isinstance(metadata.storage_data, dict):
        raise ckpt.CheckpointError(
            f"{path}: the DCP metadata has no file table (storage_data is a {type(metadata.storage_data).__name__}); {redo}"
        )
    for info in metadata.storage_data.values():
        name = info.relative_path if isinstance(info, _StorageInfo) else None
        if not isinstance(name, str) or name in ("", ".", "..") or os.path.basename(name) != name or "\\" in name:
            raise ckpt.CheckpointError(
                f"{path}: the DCP metadata points at {name!r}, outside the checkpoint directory; do not load this checkpoint"
            )
    return metadata


def _safe_reader_cls() -> type:
    from torch.distributed.checkpoint import FileSystemReader

    class SafeFileSystemReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata = _read_dcp_metadata(Path(self._get_metadata_path(kwargs.get("rank"))))
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeFileSystemReader


def _safe_reader(path: Union[str, Path]) -> Any:
    """A DCP ``FileSystemReader`` whose metadata unpickling is restricted."""
    return _safe_reader_cls()(str(path))


def _load_shards(target: dict[str, Any], shards: Path) -> None:
    """``dcp.load`` into ``target`` through the safe reader and planner; a failure
    is one ``CheckpointError`` (DCP's own ``CheckpointException`` is a
    ``BaseException`` that ``except Exception`` would let through)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    reader = _safe_reader(shards)
    # read first: DCP would log the failure with a traceback, then retry a per-rank file
    reader.read_metadata()
    try:
        dcp.load(target, storage_reader=reader, planner=_tensor_only_planner())
    except CheckpointException as exc:
        reasons = dict.fromkeys(f"rank {rank}: {err}" for rank, (err, _) in sorted(exc.failures.items()))
        raise ckpt.CheckpointError(
            f"{shards}: could not read the DCP shards ({'; '.join(reasons)}); the shard files are missing or damaged, "
            "save the checkpoint again or resume from another one"
        ) from None
    except Exception as exc:
        raise ckpt.CheckpointError(f"{shards}: could not read the DCP shards: {exc}") from None


def _tensor_only_planner() -> Any:
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class TensorOnlyLoadPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            # DefaultLoadPlanner would torch.load(weights_only=False) here.
            raise ckpt.CheckpointError(
                f"DCP item {read_item.dest_index.fqn!r} is a pickled object; genesis-fp16 shards hold tensors only"
            )

    return TensorOnlyLoadPlanner()


# -- registry ---------------------------------------------------------------------------


def _factory(cls: type[DistributedTrainer]) -> Callable[..., FP16Trainer]:
    def factory(
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        config: Optional[FP16TrainingConfig] = None,
        scheduler: Any = None,
        *,
        precision: Optional[str] = None,
        **kwargs: Any,
    ) -> FP16Trainer:
        base = config or FP16TrainingConfig()
        if precision is not None:
            base = dataclasses.replace(base, precision=precision, enabled=precision != "fp32" or base.enabled)
        return cls(model, optimizer, base, scheduler, **kwargs)

    factory.__doc__ = cls.__doc__
    return factory


registry.register(
    "ddp", _factory(DDPTrainer), "DDP under torchrun; precision from the config (fp16: GradScaler)", replace=True
)
registry.register(
    "fsdp", _factory(FSDPTrainer), "FSDP2 fully_shard under torchrun; fp16 uses ShardedGradScaler; DCP checkpoints", replace=True
)

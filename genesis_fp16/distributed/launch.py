"""Launching under ``torchrun``: its environment, the process group's lifetime,
a clean worker exit, and a JSON all-gather.

The process group comes from the ``torchrun`` environment (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), read through
`TorchrunEnv`: ``nccl`` on CUDA, ``gloo`` on CPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterator, NoReturn, Optional, Union

import torch
import torch.distributed as dist
from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from genesis_fp16.base.errors import DistributedEnvError  # noqa: F401  (re-exported: defined torch-free for the CLI)
from genesis_fp16.base.telemetry import get_logger

TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


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
    `DistributedEnvError` naming the missing ones when it is half set."""
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
    dev = (
        torch.device(device)
        if device is not None
        else (
            torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
        )
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

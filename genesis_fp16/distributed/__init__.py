"""The distributed part: DDP and FSDP2 under ``torchrun``.

* `.launch`: the torchrun environment, the process group's lifetime, a
  clean worker exit, a JSON all-gather;
* `.base`: what the distributed trainers share (agreed skip decisions,
  gradient sync on the last micro-step, per-rank RNG);
* `.ddp`: ``DDPTrainer``;
* `.fsdp`: ``FSDPTrainer`` (FSDP2) and its FP16 plugin ``ShardedFP16Mixed``;
* `.dcp_io`: FSDP2 checkpoint I/O with a restricted unpickler;
* `.faults`: an injected non-finite gradient, for drills and tests.

The registry names ``ddp`` and ``fsdp`` point at ``DDPTrainer.create`` and
``FSDPTrainer.create`` by name; this package never imports the registry.
"""

from genesis_fp16.distributed.base import DistributedTrainer
from genesis_fp16.distributed.dcp_io import (
    FSDP_LAYOUT,
    FSDP_SHARDS_DIR,
    FSDP_TRAINER_FILE,
    SafeFileSystemReader,
    TensorOnlyLoadPlanner,
)
from genesis_fp16.distributed.ddp import DDPTrainer
from genesis_fp16.distributed.faults import inject_inf_grad
from genesis_fp16.distributed.fsdp import FSDPTrainer, QuietShardedGradScaler, ShardedFP16Mixed
from genesis_fp16.distributed.launch import (
    LAUNCH_HINT,
    TORCHRUN_VARS,
    DistContext,
    DistributedEnvError,
    TorchrunEnv,
    default_backend,
    destroy_distributed,
    distributed_session,
    exit_without_finalizers,
    gather_json,
    init_distributed,
    read_torchrun_env,
)

__all__ = [
    "DDPTrainer",
    "DistContext",
    "DistributedEnvError",
    "DistributedTrainer",
    "FSDPTrainer",
    "FSDP_LAYOUT",
    "FSDP_SHARDS_DIR",
    "FSDP_TRAINER_FILE",
    "LAUNCH_HINT",
    "QuietShardedGradScaler",
    "SafeFileSystemReader",
    "ShardedFP16Mixed",
    "TORCHRUN_VARS",
    "TensorOnlyLoadPlanner",
    "TorchrunEnv",
    "default_backend",
    "destroy_distributed",
    "distributed_session",
    "exit_without_finalizers",
    "gather_json",
    "init_distributed",
    "inject_inf_grad",
    "read_torchrun_env",
]

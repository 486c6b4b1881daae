"""Count the reads of device values back to the host (``aten::_local_scalar_dense``,
the op behind ``.item()``, ``float(t)``, ``bool(t)``) that a learner's training
call makes outside the optimizer, per precision. On a GPU each is a
synchronisation: the host waits instead of queueing the next step.

    python scripts/count_host_reads.py [--steps 200] [--precisions fp32 bf16 fp16] [--json out.json]

Profiled with `torch.profiler` around one ``WorldModel`` training call and one
``Critic`` training call of ``--steps`` steps each, run inline on the profiled
thread (the call's own work, without the event loop's worker thread), on the
CPU (the count does not depend on the device: the same code reads the same
values). Reads under the optimizer's step (``Optimizer.step#...``) are left
out. Also the bench MLP's trainer over ``--steps`` windowed steps.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

READ_OP = "aten::_local_scalar_dense"


def host_reads(run: Callable[[], Any]) -> int:
    """How many host reads ``run()`` makes outside an optimizer step: the
    profiler's ``_local_scalar_dense`` ops, and every ``Tensor.tolist()`` (a
    training window reads its steps back with one; on a GPU it is a copy to
    the host, a synchronisation the CPU profiler does not show as that op)."""
    from torch.profiler import ProfilerActivity, profile

    tolist, calls = torch.Tensor.tolist, [0]

    def counted(self: torch.Tensor) -> Any:
        calls[0] += 1
        return tolist(self)

    torch.Tensor.tolist = counted  # type: ignore[method-assign]
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run()
    finally:
        torch.Tensor.tolist = tolist  # type: ignore[method-assign]
    count = calls[0]
    for event in prof.events():
        if event.name != READ_OP:
            continue
        parent, inside = event.cpu_parent, False
        while parent is not None:
            if parent.name.startswith("Optimizer.step"):
                inside = True
                break
            parent = parent.cpu_parent
        count += not inside
    return count


def _trajectories(n: int = 6, length: int = 100, seed: int = 0) -> list[Any]:
    from genesis_fp16.base.seeds import numpy_rng
    from infrastructure.trajectory import Trajectory

    rng = numpy_rng(seed, "count_host_reads.trajectories")
    out = []
    for _ in range(n):
        obs = rng.normal(size=(length, 3))
        act = rng.uniform(-2, 2, size=(length, 1))
        nxt = obs + 0.1 * rng.normal(size=(length, 3))
        out.append(
            Trajectory(obs=obs, action=act, reward=-(obs**2).sum(axis=1), next_obs=nxt, done=np.zeros(length, bool))
        )
    return out


def world_model_reads(precision: str, steps: int, state: Path) -> int:
    from genesis_fp16.training.guarded import UNGUARDED
    from genesis_fp16.base.settings import load_settings
    from infrastructure.world_model import WorldModel

    wm = WorldModel(
        3,
        1,
        precision=precision,
        guard=UNGUARDED,
        checkpoint_dir=state / f"wm-{precision}",
        seed=0,
        settings=load_settings(state_dir=state),
    )
    trajs = _trajectories()
    wm.trainer.host_is_device = False  # a GPU's window: nothing read back inside it
    wm._train_sync(trajs, 8, False)  # the trainer built and the first call's set-up out of the count
    return host_reads(lambda: wm._train_sync(trajs, steps, False))


def critic_reads(precision: str, steps: int, state: Path) -> int:
    from genesis_fp16.training.guarded import UNGUARDED
    from genesis_fp16.base.settings import load_settings
    from infrastructure.critic import Critic
    from infrastructure.transitions import Transitions

    critic = Critic(
        3,
        1,
        action_low=[-2.0],
        action_high=[2.0],
        precision=precision,
        guard=UNGUARDED,
        checkpoint_dir=state / f"critic-{precision}",
        seed=0,
        settings=load_settings(state_dir=state),
    )
    data = Transitions.from_trajectories(_trajectories())

    def policy(obs: torch.Tensor) -> torch.Tensor:
        return torch.zeros(len(obs), 1)

    critic.trainer.host_is_device = False  # a GPU's window: nothing read back inside it
    critic._train_sync(data, policy, 8, False)
    return host_reads(lambda: critic._train_sync(data, policy, steps, False))


def mlp_reads(precision: str, steps: int, state: Path) -> int:
    from genesis_fp16 import FP16Trainer, FP16TrainingConfig
    from genesis_fp16.base.seeds import init_parameters, torch_generator

    model = init_parameters(
        torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)),
        torch_generator(0, "count_host_reads.mlp_init"),
    )
    trainer = FP16Trainer(
        model, torch.optim.Adam(model.parameters(), lr=1e-3, fused=True), FP16TrainingConfig(precision=precision)
    )
    trainer.host_is_device = False  # a GPU's window: nothing read back inside it
    g = torch_generator(0, "count_host_reads.mlp_batches")
    batches = [(torch.randn(64, 64, generator=g), torch.randn(64, 1, generator=g)) for _ in range(16)]

    def loss_fn(m: torch.nn.Module, b: Any) -> torch.Tensor:
        return ((m(b[0]).float() - b[1]) ** 2).mean()

    def run() -> None:
        for start in range(0, steps, 16):
            trainer.train_window(batches[: min(16, steps - start)], loss_fn)

    return host_reads(run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16", "fp16"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn in (("world_model", world_model_reads), ("critic", critic_reads), ("bench_mlp", mlp_reads)):
            for precision in args.precisions:
                reads = fn(precision, args.steps, Path(tmp))
                rows.append(
                    {
                        "learner": name,
                        "precision": precision,
                        "steps": args.steps,
                        "host_reads": reads,
                        "per_step": reads / args.steps,
                    }
                )
                print(
                    f"{name:12s} {precision:5s} {args.steps} steps: {reads} host reads outside the optimizer "
                    f"({reads / args.steps:.3f} a step)",
                    flush=True,
                )
    if args.json:
        args.json.write_text(json.dumps({"torch": torch.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

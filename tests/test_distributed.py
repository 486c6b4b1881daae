"""DDP and FSDP2 on 2 CPU processes (gloo).

Spawning costs a few seconds per process pair, so each spawn runs several
scenarios: one DDP spawn, one FSDP2 spawn and one ``torchrun`` run of
scripts/train_distributed.py. Workers write their observations with
``torch.save``; the parent reads them with ``weights_only=True`` and asserts.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from genesis_fp16 import FP16Trainer, FP16TrainingConfig
from genesis_fp16 import distributed as gd
from genesis_fp16.training import registry
from genesis_fp16.training.checkpoint import CheckpointError
from scripts_loader import load_script

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[1]
WORLD = 2
BATCH = 8  # per rank
STEPS = 20
# FP32 DDP (and FSDP2) vs one process on the combined batch: the same arithmetic
# up to the order of the gradient sums. Measured max abs parameter difference
# after 20 AdamW steps: 8.2e-08 (pytest -s prints it); 1e-5 leaves room for
# other CPUs and thread counts while a wrong average (sum instead of mean, one
# step more or less) is off by far more.
FP32_ATOL = 1e-5


# -- model and data shared by workers and the single-process reference ---------------


class Net(nn.Module):
    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.first = nn.Linear(6, 16)
        self.body = nn.Sequential(nn.Tanh(), nn.Dropout(dropout), nn.Linear(16, 16), nn.Tanh())
        self.head = nn.Linear(16, 3)
        self.inject = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        if self.inject:  # +inf gradient in output features 8..15: rows of rank 1's FSDP shard
            h = gd.inject_inf_grad(h, slice(8, 16))
        return self.head(self.body(h))


def make_model(seed: int = 0, dropout: float = 0.0) -> tuple[Net, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = Net(dropout)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(BATCH, 6, generator=g)
    return x, torch.sin(x[:, :3]) + 0.1 * x[:, 3:]


def combined(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    parts = [batch(step, r) for r in range(WORLD)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def mse(model: nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return nn.functional.mse_loss(model(b[0]).float(), b[1])


def config(precision: str, **kw: Any) -> FP16TrainingConfig:
    return FP16TrainingConfig(precision=precision, enabled=precision != "fp32", init_scale=1024.0, **kw)


def flat(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([tensors[k].detach().float().reshape(-1).cpu() for k in sorted(tensors)])


def single_process_reference(steps: int = STEPS, accum: int = 1) -> torch.Tensor:
    model, opt = make_model()
    trainer = FP16Trainer(model, opt, config("fp32", grad_accumulation_steps=accum))
    for step in range(steps):
        for micro in range(accum):
            trainer.backward_and_step(trainer.training_step(combined(step * accum + micro), mse))
    return flat(dict(model.named_parameters()))


# -- spawning -------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, port: int, out: str, scenario: str) -> None:
    # torchrun's variables, set for this child only (mp.spawn starts it fresh)
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    ctx = gd.init_distributed(timeout_s=60)  # a missed collective fails in 60 s instead of hanging
    results: dict[str, Any] = {}
    try:
        SCENARIOS[scenario](ctx, Path(out), results)
    finally:
        torch.save(results, Path(out) / f"rank{rank}.pt")
        gd.destroy_distributed()
    gd.exit_without_finalizers(0)  # a finished gloo run must not abort in interpreter teardown


def spawn(scenario: str, out: Path) -> list[dict[str, Any]]:
    mp.spawn(_entry, args=(_free_port(), str(out), scenario), nprocs=WORLD, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]


def train(trainer: FP16Trainer, steps: range, rank: int, inject_at: int = -1, accum: int = 1) -> list[float]:
    losses = []
    for step in steps:
        for micro in range(accum):
            trainer.module.inject = step == inject_at and rank == 1
            loss = trainer.training_step(batch(step * accum + micro, rank), mse)
            trainer.backward_and_step(loss)
            losses.append(float(loss.detach()))
    trainer.module.inject = False
    return losses


# -- DDP scenarios ----------------------------------------------------------------------


def ddp_scenarios(ctx: gd.DistContext, out: Path, res: dict[str, Any]) -> None:
    rank = ctx.rank
    # 1. parameters identical on both ranks after 20 steps, each precision
    for precision in ("fp32", "fp16", "bf16"):
        model, opt = make_model(seed=rank)  # different inits: DDP's broadcast must equalise them
        trainer = gd.DDPTrainer(model, opt, config(precision), context=ctx)
        losses = train(trainer, range(STEPS), rank)
        res[f"{precision}_params"] = flat(dict(model.named_parameters()))
        res[f"{precision}_precision"] = trainer.precision.name
        res[f"{precision}_losses"] = torch.tensor(losses)

    # 2. an infinite gradient on rank 1 only at step 5 (FP16): both skip, scale halves, training goes on
    model, opt = make_model()
    trainer = gd.DDPTrainer(model, opt, config("fp16"), context=ctx)
    train(trainer, range(5), rank)
    before = flat(dict(model.named_parameters()))
    scale_before = trainer.current_scale
    train(trainer, range(5, 6), rank, inject_at=5)
    res["inf_after_skip_equal"] = torch.equal(before, flat(dict(model.named_parameters())))
    res["inf_scale"] = torch.tensor([scale_before, trainer.current_scale])
    losses = train(trainer, range(6, STEPS), rank)
    res["inf_changed_after"] = not torch.equal(before, flat(dict(model.named_parameters())))
    res["inf_stats"] = {k: trainer.get_stats()[k] for k in ("skipped_steps", "overflow_steps", "training_steps")}
    res["inf_final_loss"] = losses[-1]
    res["inf_params"] = flat(dict(model.named_parameters()))

    # 3. a non-finite loss on rank 1 only: the decision is agreed (without it, rank 0 would hang in backward)
    model, opt = make_model()
    trainer = gd.DDPTrainer(model, opt, config("fp32"), context=ctx)
    for step in range(4):
        loss = trainer.training_step(batch(step, rank), mse)
        if step == 2 and rank == 1:
            loss = loss * float("inf")
        trainer.backward_and_step(loss)
    res["nonfinite_stats"] = {
        k: trainer.get_stats()[k] for k in ("nonfinite_losses", "skipped_steps", "training_steps")
    }
    res["nonfinite_params"] = flat(dict(model.named_parameters()))

    # 4. accumulation of 4: the gradient all-reduce runs on the last micro-step only
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    for accum, micro_steps in ((1, 4), (4, 12)):
        model, opt = make_model()
        trainer = gd.DDPTrainer(model, opt, config("fp32", grad_accumulation_steps=accum), context=ctx)
        calls: list[int] = []

        def counting_hook(state, bucket, trainer=trainer, calls=calls):  # type: ignore[no-untyped-def]  # DDP checks annotations
            calls.append(trainer.micro_steps)  # backward_and_step counts the micro-step before backward
            return allreduce_hook(state, bucket)

        trainer.model.register_comm_hook(None, counting_hook)
        train(trainer, range(micro_steps // accum), rank, accum=accum)
        res[f"allreduce_calls_accum{accum}"] = torch.tensor(calls)
        res[f"accum{accum}_params"] = flat(dict(model.named_parameters()))

    # 5. checkpoint save/resume reproduces the uninterrupted run (FP16 scaler, scheduler, dropout RNG per rank)
    def fresh(seed: int) -> gd.DDPTrainer:
        model, opt = make_model(seed=seed, dropout=0.2)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        return gd.DDPTrainer(model, opt, config("fp16"), sched, context=ctx)

    torch.manual_seed(100 + rank)
    straight = fresh(0)
    train(straight, range(10), rank, inject_at=2)
    res["ckpt_straight"] = flat(dict(straight.module.named_parameters()))
    res["ckpt_straight_scale"] = straight.current_scale

    torch.manual_seed(100 + rank)
    first = fresh(0)
    train(first, range(5), rank, inject_at=2)
    first.save_checkpoint(out / "ddp.pt", extra={"note": "half"})
    res["ckpt_saved_params"] = flat(dict(first.module.named_parameters()))
    torch.manual_seed(999)  # the resumed run must not depend on the RNG it starts with
    resumed = fresh(7)
    extra = resumed.load_checkpoint(out / "ddp.pt")
    train(resumed, range(5, 10), rank)
    res["ckpt_resumed"] = flat(dict(resumed.module.named_parameters()))
    res["ckpt_resumed_scale"] = resumed.current_scale
    res["ckpt_extra"] = extra
    res["ckpt_counters"] = {k: resumed.get_stats()[k] for k in ("training_steps", "skipped_steps")}

    # 5b. a single-process checkpoint loads into a DDP trainer
    if rank == 0:
        model, opt = make_model(seed=5)
        FP16Trainer(model, opt, config("fp16")).save_checkpoint(out / "single.pt")
    dist.barrier()
    model, opt = make_model(seed=rank)
    ddp = gd.DDPTrainer(model, opt, config("fp16"), context=ctx)
    ddp.load_checkpoint(out / "single.pt")
    res["from_single"] = flat(dict(model.named_parameters()))

    # 6. the registry, as the world model reaches it: settings choose ddp
    from genesis_fp16.rollout.policy import resolve_policy
    from genesis_fp16.base.settings import load_settings

    settings = load_settings(distributed="ddp", precision="bf16")
    if rank == 0:
        resolve_policy("dist-agent", settings)  # creates the ledger before both ranks read it
    dist.barrier()
    model, opt = make_model()
    trainer = registry.trainer_for("dist-agent", model, opt, settings=settings)
    res["registry"] = {"cls": type(trainer).__name__, "precision": trainer.precision.name, "rank": trainer.rank}

    # 7. a seed-API auto (issue 45, item 4): rank 0 measures at the first batch, every rank trains in its decision.
    # Rank 0's injected timings say bf16 (1.5x fp32), rank 1's would say fp32 (0.5x): rank 1 must not measure.
    from genesis_fp16.precision import calibration as cal

    os.environ.update(
        GENESIS_FP16_AUTO_PRECISION="measure", GENESIS_FP16_PRECISION_CACHE=str(out / f"precision{rank}.json")
    )
    table = {"fp32": 1e-3, "bf16": 1e-3 / (1.5 if rank == 0 else 0.5), "fp16": 1e-2}
    timed: list[str] = []

    def fake_time_step(mode: Any, run: Callable[[], None], steps: int, device: Any) -> float:
        run()
        timed.append(mode.value)
        return table[mode.value]

    cal.time_step = fake_time_step  # this worker process only
    model, opt = make_model(dropout=0.2)
    trainer = gd.DDPTrainer(model, opt, FP16TrainingConfig(precision="auto", init_scale=1024.0), context=ctx)
    pending = trainer.auto_pending
    torch.manual_seed(5 + rank)
    train(trainer, range(1), rank)
    after_auto = torch.get_rng_state()
    reference = gd.DDPTrainer(*make_model(dropout=0.2), config(trainer.precision.name), context=ctx)
    torch.manual_seed(5 + rank)  # the same first step, asked for by name: the measurement changed no weight and no RNG
    train(reference, range(1), rank)
    res["auto_as_named"] = torch.equal(
        flat(dict(model.named_parameters())), flat(dict(reference.module.named_parameters()))
    )
    res["auto_rng_as_named"] = torch.equal(after_auto, torch.get_rng_state())
    train(trainer, range(1, 4), rank)
    res["auto"] = {
        "pending": pending,
        "precision": trainer.precision.name,
        "source": trainer.decision.source.value,
        "reason": trainer.decision.reason,
        "timed": len(timed),
        "steps": trainer.training_steps,
    }
    res["auto_params"] = flat(dict(model.named_parameters()))


def test_ddp_two_ranks(tmp_path: Path) -> None:
    r0, r1 = spawn("ddp", tmp_path)

    for precision in ("fp32", "fp16", "bf16"):
        assert r0[f"{precision}_precision"] == precision
        assert torch.equal(r0[f"{precision}_params"], r1[f"{precision}_params"]), precision
        assert torch.isfinite(r0[f"{precision}_losses"]).all()
        assert r0[f"{precision}_losses"][-5:].mean() < r0[f"{precision}_losses"][:5].mean(), precision

    # FP32 DDP == one process on the combined batch (DDP averages the two ranks' mean-loss gradients)
    reference = single_process_reference()
    diff = (r0["fp32_params"] - reference).abs().max().item()
    print(f"fp32 ddp vs single-process max abs diff: {diff:.3g}")
    assert diff < FP32_ATOL
    assert (reference - single_process_reference(steps=STEPS - 1)).abs().max().item() > 100 * FP32_ATOL  # can fail

    # inf gradient on rank 1 only: both skip that step, both scales halve, training continues
    for r in (r0, r1):
        assert r["inf_stats"] == {"skipped_steps": 1, "overflow_steps": 1, "training_steps": STEPS}
        assert r["inf_after_skip_equal"] is True
        assert r["inf_changed_after"] is True
        assert r["inf_scale"].tolist() == [1024.0, 512.0]
        assert 0 < r["inf_final_loss"] < 10
    assert torch.equal(r0["inf_params"], r1["inf_params"])

    for r in (r0, r1):
        assert r["nonfinite_stats"] == {"nonfinite_losses": 1, "skipped_steps": 1, "training_steps": 4}
    assert torch.equal(r0["nonfinite_params"], r1["nonfinite_params"])

    # all-reduce per micro-step without accumulation; only on micro-steps 4, 8, 12 with accumulation 4
    per_step = r0["allreduce_calls_accum1"]
    buckets = len(per_step) // 4
    assert buckets >= 1 and sorted(set(per_step.tolist())) == [1, 2, 3, 4]
    for r in (r0, r1):
        calls = r["allreduce_calls_accum4"].tolist()
        assert sorted(set(calls)) == [4, 8, 12]
        assert len(calls) == 3 * buckets
    assert torch.equal(r0["accum4_params"], r1["accum4_params"])
    ref = single_process_reference(steps=3, accum=4)
    assert (r0["accum4_params"] - ref).abs().max().item() < FP32_ATOL

    # resume == uninterrupted, bit for bit, on both ranks
    for r in (r0, r1):
        assert torch.equal(r["ckpt_resumed"], r["ckpt_straight"])
        assert r["ckpt_resumed_scale"] == r["ckpt_straight_scale"] == 512.0
        assert r["ckpt_extra"]["note"] == "half" and r["ckpt_extra"]["world_size"] == 2
        assert r["ckpt_counters"] == {"training_steps": 10, "skipped_steps": 1}

    # a DDP checkpoint loads into a single-process trainer
    model, opt = make_model(seed=3, dropout=0.2)
    single = FP16Trainer(model, opt, config("fp16"))
    extra = single.load_checkpoint(tmp_path / "ddp.pt")
    assert extra["wrap"] == "ddp"
    assert torch.equal(flat(dict(model.named_parameters())), r0["ckpt_saved_params"])
    assert single.current_scale == 512.0 and single.training_steps == 5

    expected = flat(dict(make_model(seed=5)[0].named_parameters()))
    assert torch.equal(r0["from_single"], expected) and torch.equal(r1["from_single"], expected)

    assert r0["registry"] == {"cls": "DDPTrainer", "precision": "bf16", "rank": 0}
    assert r1["registry"]["rank"] == 1

    # a seed-API auto: rank 0 measured (its timings: bf16), rank 1 did not and trains in rank 0's decision
    assert r0["auto"]["timed"] > 0 and r1["auto"]["timed"] == 0
    for r in (r0, r1):
        assert r["auto"]["pending"] is True and r["auto"]["steps"] == 4
        assert r["auto_as_named"] is True and r["auto_rng_as_named"] is True
        assert r["auto"]["precision"] == "bf16" and r["auto"]["source"] == "measured"
        assert "first batch on rank 0" in r["auto"]["reason"]
    assert torch.equal(r0["auto_params"], r1["auto_params"])


# -- FSDP2 scenarios ----------------------------------------------------------------


def fsdp_scenarios(ctx: gd.DistContext, out: Path, res: dict[str, Any]) -> None:
    rank = ctx.rank

    # 1. FP32 FSDP2 == the single-process reference; BF16 trains
    for precision in ("fp32", "bf16"):
        model, opt = make_model()
        trainer = gd.FSDPTrainer(model, opt, config(precision), context=ctx)
        losses = train(trainer, range(STEPS), rank)
        res[f"{precision}_full"] = flat(trainer.full_state_dict())
        res[f"{precision}_losses"] = torch.tensor(losses)
        res[f"{precision}_sharded"] = all(type(p).__name__ == "DTensor" for p in trainer.model.parameters())

    # 2. accumulation (set_requires_gradient_sync) == the reference with accumulation
    model, opt = make_model()
    trainer = gd.FSDPTrainer(model, opt, config("fp32", grad_accumulation_steps=4), context=ctx)
    train(trainer, range(3), rank, accum=4)
    res["accum4_full"] = flat(trainer.full_state_dict())

    # 3. inf gradient in rank 1's shard only: ShardedGradScaler makes both skip; a plain GradScaler would not
    for scaler in ("sharded", "plain"):
        model, opt = make_model()
        trainer = gd.FSDPTrainer(model, opt, config("fp16"), context=ctx)
        if scaler == "plain":
            trainer.precision.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        res[f"{scaler}_scaler_type"] = [c.__name__ for c in type(trainer.scaler).__mro__]
        res[f"{scaler}_plugin"] = type(trainer.precision).__name__
        seen: list[bool] = []  # per optimizer step: were this rank's own gradient shards finite?
        unscale = trainer.scaler.unscale_

        def watching_unscale(optimizer: Any, trainer: gd.FSDPTrainer = trainer, seen: list[bool] = seen) -> None:
            seen.append(all(bool(torch.isfinite(p.grad.to_local()).all()) for p in trainer.model.parameters()))
            unscale(optimizer)

        trainer.scaler.unscale_ = watching_unscale  # type: ignore[method-assign]
        train(trainer, range(8), rank, inject_at=3)
        res[f"{scaler}_local_finite"] = seen
        res[f"{scaler}_stats"] = {
            k: trainer.get_stats()[k] for k in ("skipped_steps", "overflow_steps", "current_scale")
        }

    # 4. DCP save / resume == uninterrupted (FP16 scaler, scheduler, AdamW state)
    def fresh(seed: int) -> gd.FSDPTrainer:
        model, opt = make_model(seed=seed)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        return gd.FSDPTrainer(model, opt, config("fp16"), sched, context=ctx)

    straight = fresh(0)
    train(straight, range(10), rank, inject_at=2)
    res["dcp_straight"] = flat(straight.full_state_dict())
    first = fresh(0)
    train(first, range(5), rank, inject_at=2)
    first.save_checkpoint(out / "fsdp_ckpt", extra={"note": "half"})
    first.save_checkpoint(out / "fsdp_ckpt", extra={"note": "again"})  # replacing an existing checkpoint
    resumed = fresh(7)
    extra = resumed.load_checkpoint(out / "fsdp_ckpt")
    res["dcp_loaded_lr"] = resumed.optimizer.param_groups[0]["lr"]
    train(resumed, range(5, 10), rank)
    res["dcp_resumed"] = flat(resumed.full_state_dict())
    res["dcp_extra"] = extra
    res["dcp_stats"] = {k: resumed.get_stats()[k] for k in ("training_steps", "skipped_steps", "current_scale")}
    res["dcp_straight_scale"] = straight.current_scale


def test_fsdp2_two_ranks(tmp_path: Path) -> None:
    r0, r1 = spawn("fsdp", tmp_path)

    reference = single_process_reference()
    for r in (r0, r1):
        assert r["fp32_sharded"] and r["bf16_sharded"]
        diff = (r["fp32_full"] - reference).abs().max().item()
        print(f"fp32 fsdp2 vs single-process max abs diff: {diff:.3g}")
        assert diff < FP32_ATOL
        assert torch.isfinite(r["bf16_losses"]).all()
        assert r["bf16_losses"][-5:].mean() < r["bf16_losses"][:5].mean()
        assert (r["accum4_full"] - single_process_reference(steps=3, accum=4)).abs().max().item() < FP32_ATOL

    # ShardedGradScaler: the overflow lives in rank 1's shard, both ranks skip and halve
    for r in (r0, r1):
        assert "ShardedGradScaler" in r["sharded_scaler_type"]
        assert r["sharded_plugin"] == "ShardedFP16Mixed"  # the precision plugin supplies the sharded scaler
        assert r["sharded_stats"] == {"skipped_steps": 1, "overflow_steps": 1, "current_scale": 512.0}
    # the overflow really was in rank 1's shard alone: rank 0's own gradients were finite at step 3
    assert r0["sharded_local_finite"] == [True] * 8
    assert r1["sharded_local_finite"] == [True, True, True, False, True, True, True, True]
    # torch 2.13's DTensor also all-reduces found_inf inside unscale_ (found_inf_reduce_handler),
    # so even a plain GradScaler agrees under FSDP2; ShardedGradScaler does it on any version
    for r in (r0, r1):
        assert r["plain_scaler_type"][0] == "GradScaler"
        assert r["plain_stats"] == {"skipped_steps": 1, "overflow_steps": 1, "current_scale": 512.0}

    for r in (r0, r1):
        assert torch.equal(r["dcp_resumed"], r["dcp_straight"])
        assert r["dcp_stats"] == {"training_steps": 10, "skipped_steps": 1, "current_scale": r["dcp_straight_scale"]}
        assert r["dcp_extra"]["note"] == "again"
        assert r["dcp_loaded_lr"] == pytest.approx(1e-2 * 0.5)  # StepLR(3) after 5 steps, 1 skipped
    ckpt_dir = tmp_path / "fsdp_ckpt"
    assert (ckpt_dir / "trainer.pt").is_file() and (ckpt_dir / "shards" / ".metadata").is_file()
    assert not list(tmp_path.glob(".fsdp_ckpt.*"))  # no partial or old directory left behind

    # the shard metadata reads through the restricted unpickler
    meta = gd.dcp_io._MetadataUnpickler(io.BytesIO((ckpt_dir / "shards" / ".metadata").read_bytes())).load()
    assert type(meta).__name__ == "Metadata"


SCENARIOS: dict[str, Callable[[gd.DistContext, Path, dict[str, Any]], None]] = {
    "ddp": ddp_scenarios,
    "fsdp": fsdp_scenarios,
}


# -- the script under torchrun ------------------------------------------------------


def test_train_distributed_script_under_torchrun(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port", str(_free_port()),
        str(REPO / "scripts" / "train_distributed.py"),
        "--precision", "fp16", "--steps", "20", "--inject-overflow-rank", "1", "--inject-step", "5",
        "--hidden", "64", "--json", str(out),
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    ranks = report["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert report["checksums_equal"] is True
    assert len({r["param_checksum"] for r in ranks}) == 1
    for r in ranks:
        assert r["skipped_steps"] == 1 and r["training_steps"] == 20
        assert r["current_scale"] == 32768.0
        assert 0 < r["final_loss"] < 10
    assert "checksums equal=True" in proc.stdout


# -- in-process checks (no spawn) ---------------------------------------------------------


def _load_script() -> Any:
    return load_script("train_distributed")


@pytest.fixture
def no_torchrun_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in gd.TORCHRUN_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_half_set_environment_names_the_missing_variables(no_torchrun_env: pytest.MonkeyPatch) -> None:
    assert gd.read_torchrun_env() is None
    no_torchrun_env.setenv("RANK", "0")
    no_torchrun_env.setenv("WORLD_SIZE", "2")
    with pytest.raises(gd.DistributedEnvError) as err:
        gd.read_torchrun_env()
    message = str(err.value)
    assert "RANK, WORLD_SIZE set" in message and "LOCAL_RANK, MASTER_ADDR, MASTER_PORT missing" in message
    with pytest.raises(gd.DistributedEnvError, match="half-set"):
        gd.init_distributed()


def test_bad_torchrun_values(no_torchrun_env: pytest.MonkeyPatch) -> None:
    values = dict(RANK="2", LOCAL_RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    for k, v in values.items():
        no_torchrun_env.setenv(k, v)
    with pytest.raises(gd.DistributedEnvError, match="RANK=2 is not below WORLD_SIZE=2"):
        gd.read_torchrun_env()
    no_torchrun_env.setenv("RANK", "zero")
    with pytest.raises(gd.DistributedEnvError, match="invalid torchrun environment: RANK='zero'"):
        gd.read_torchrun_env()
    no_torchrun_env.setenv("RANK", "1")
    env = gd.read_torchrun_env()
    assert env is not None and (env.rank, env.world_size, env.master_port) == (1, 2, 29500)


def test_not_under_torchrun(no_torchrun_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(gd.DistributedEnvError, match="not started by torchrun"):
        gd.init_distributed()
    model, opt = make_model()
    with pytest.raises(gd.DistributedEnvError, match="GENESIS_FP16_DISTRIBUTED"):
        registry.create_trainer("ddp", model, opt, config("fp32"))
    script = _load_script()
    assert script.main(["--precision", "fp32", "--steps", "1"]) == 2
    assert "not started by torchrun" in capsys.readouterr().err


def test_script_rejects_injection_without_a_scaler(capsys: pytest.CaptureFixture[str]) -> None:
    script = _load_script()
    with pytest.raises(SystemExit) as exit_info:
        script.parse_args(["--precision", "bf16", "--steps", "5", "--inject-overflow-rank", "1", "--inject-step", "2"])
    assert exit_info.value.code == 2
    assert "needs --precision fp16" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.parse_args(["--precision", "fp16", "--steps", "5", "--inject-overflow-rank", "1", "--inject-step", "9"])


def test_registry_lists_ddp_and_fsdp() -> None:
    names = registry.available()
    assert {"ddp", "fsdp"} <= set(names)
    assert "FSDP2" in names["fsdp"].description


def test_sharded_fp16_plugin_makes_a_sharded_scaler_from_its_options() -> None:
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    from genesis_fp16.precision.plugins import FP16Mixed
    from genesis_fp16.base.settings import PrecisionConfig

    options = PrecisionConfig(init_scale=8.0, growth_factor=4.0, backoff_factor=0.25, growth_interval=3)
    plugin = gd.ShardedFP16Mixed("cpu", options)
    assert isinstance(plugin, FP16Mixed) and plugin.name == "fp16"
    scaler = plugin.make_scaler()
    assert isinstance(scaler, ShardedGradScaler) and scaler.is_enabled()
    got = (scaler.get_scale(), scaler.get_growth_factor(), scaler.get_backoff_factor(), scaler.get_growth_interval())
    assert got == (8.0, 4.0, 0.25, 3)


def test_inject_inf_grad_only_in_the_chosen_features() -> None:
    x = torch.ones(2, 4, requires_grad=True)
    gd.inject_inf_grad(x, slice(2, None)).sum().backward()
    assert x.grad is not None
    assert torch.equal(x.grad[:, :2], torch.ones(2, 2))
    assert torch.isinf(x.grad[:, 2:]).all()


def test_dcp_metadata_unpickler_refuses_code() -> None:
    class Evil:
        def __reduce__(self) -> Any:
            return (os.system, ("echo pwned",))

    with pytest.raises(pickle.UnpicklingError, match="not a DCP metadata class"):
        gd.dcp_io._MetadataUnpickler(io.BytesIO(pickle.dumps(Evil()))).load()
    assert gd.dcp_io._MetadataUnpickler(io.BytesIO(pickle.dumps(torch.Size([2, 3])))).load() == torch.Size([2, 3])


def test_fsdp_checkpoint_path_must_be_a_directory(tmp_path: Path) -> None:
    # load_checkpoint checks the layout before any collective, so no process group is needed
    trainer = gd.FSDPTrainer.__new__(gd.FSDPTrainer)
    with pytest.raises(CheckpointError, match="not an FSDP checkpoint directory"):
        trainer.load_checkpoint(tmp_path / "missing")


def test_backend_and_device_follow_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    assert gd.default_backend(torch.device("cuda", 0)) == "nccl"
    assert gd.default_backend(torch.device("cpu")) == "gloo"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert gd.launch._default_device(1) == torch.device("cuda", 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gd.launch._default_device(1) == torch.device("cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (NCCL)")
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_nccl_single_rank_script(tmp_path: Path, precision: str) -> None:
    out = tmp_path / "out.json"
    inject = ["--inject-overflow-rank", "0", "--inject-step", "10"] if precision == "fp16" else []
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1", "--master_port", str(_free_port()),
        str(REPO / "scripts" / "train_distributed.py"), "--precision", precision, "--steps", "200", "--json", str(out),
        *inject,
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    print(json.dumps(report, indent=1))
    assert report["backend"] == "nccl" and report["device"].startswith("cuda") and report["precision"] == precision
    (rank,) = report["ranks"]
    assert rank["training_steps"] == 200 and 0 < rank["final_loss"] < 10
    if precision == "fp16":
        assert rank["overflow_steps"] >= 1  # the injected one

"""One `WorldModel.train()` call's work in its worker thread, and a checkpoint
restored into a model: kept apart from `infrastructure.world_model` so the
class reads as its API (options, training, checkpoints, prediction, rollouts)
and this module as what a call does, step by step."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Protocol, Sequence

import torch

from genesis_fp16 import checkpoint as ckpt
from genesis_fp16.guarded import CallReport, Guard, GuardedTraining

from .dynamics import check_checkpoint_extra
from .ensemble import EnsembleDynamics, batch_rows, bootstrap, check_architecture, ensemble_loss, member_losses
from .trajectory import Trajectory
from .world_model_types import TrainReport, inference_gap_of, val_loss_of


class Trainee(Protocol):
    """What a train call and a restore read and set of a `WorldModel`."""

    model: EnsembleDynamics
    device: torch.device
    agent: str
    guard: Optional[Guard]
    batch_size: int
    trained: bool
    _generator: torch.Generator
    _guarded_call: Callable[..., TrainReport]  # GuardedLearner's

    @property
    def training(self) -> GuardedTraining: ...

    def _dataset(self, trajectories: Sequence[Trajectory]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]: ...


def on_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``; to CUDA from pinned host memory, so the copy runs asynchronously."""
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def train_sync(wm: Trainee, trajectories: list[Trajectory], steps: int, save: bool) -> TrainReport:
    """``steps`` optimizer steps of ``wm`` on ``trajectories`` (checked by the caller), then the validation, the
    elites, the checkpoint and the report: the world model's parts of `GuardedLearner._guarded_call`."""
    started = time.perf_counter()
    x_tr, y_tr, x_val, y_val = (on_device(t, wm.device) for t in wm._dataset(trajectories))  # once per call
    model = wm.model

    def batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:  # made once prepare fitted the normaliser
        xn_tr, yn_tr = model.normalise_x(x_tr), model.normalise_y(y_tr)
        n, members = len(xn_tr), model.members
        # each member trains on its own bootstrap of this call's data (one network: the data as it is);
        # indices come from the CPU generator, so every device draws the same batches
        boot = bootstrap(n, members, wm._generator)
        rows = (batch_rows(boot, n, members, wm.batch_size, wm._generator).to(wm.device, non_blocking=True) for _ in range(steps))
        return ((xn_tr[r], yn_tr[r]) for r in rows)

    def after_call(call: CallReport) -> dict[str, Any]:  # the inference gap and the elites
        trainer, val_loss = wm.training.trainer, float(call.val_loss)  # type: ignore[arg-type]
        inference_fp32, inference_gap = inference_gap_of(model, trainer, val_loss, x_val, y_val)
        if wm.guard is not None and trainer.precision.name != "fp32":  # recorded where the canaries are
            gap = {"val_loss": val_loss, "fp32_val_loss": inference_fp32, "gap": inference_gap}
            wm.guard.ledger.record_quality_check(wm.agent, "inference_gap", gap, precision=trainer.precision.name)
        model.eval()
        with torch.no_grad():  # the elites: the members with the lowest FP32 validation loss
            model.set_elites(member_losses(model, model.normalise_x(x_val), model.normalise_y(y_val)))
        return {"inference_val_loss_fp32": inference_fp32, "inference_gap": inference_gap,
                "member_val_loss": [float(v) for v in model.member_val_loss], "elites": model.elites}

    # the normaliser is fitted to this call's data, on the model, its FP32 reference and restored weights alike
    return wm._guarded_call(started, TrainReport, ensemble_loss, prepare=lambda m: m.fit_normaliser(x_tr, y_tr), batches=batches,
                            validation=lambda: partial(val_loss_of, x=x_val, y=y_val), save=save, after_call=after_call,
                            steps=steps, transitions=len(x_tr) + len(x_val), trajectories=len(trajectories))


def restore(wm: Trainee, path: Path) -> None:
    """Load what `WorldModel.save` wrote to ``path`` into ``wm`` (see `WorldModel.load`): checked whole before anything changes."""
    trainer = wm.training.trainer
    payload = ckpt.load_payload(path, map_location=trainer.device)
    check_architecture(payload, wm.model.spec, str(path))
    trainer.apply_payload(payload, source=str(path), restore_rng=False, check_extra=check_checkpoint_extra)
    extra = payload.get("extra") or {}
    wm.trained = extra.get("trained", True)
    if extra.get("sampler_state") is not None:
        wm._generator.set_state(extra["sampler_state"].cpu())

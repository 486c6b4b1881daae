"""The world model on a CUDA device: FP16 with the gradient scaler, BF16,
the FP32 shadow on the same device, the model's rollouts (the same draws as on
the CPU), and a checkpoint written on the GPU loaded on the CPU. Skipped without a GPU; `pytest -m gpu` on a GPU
machine (scripts/gpu_acceptance.sh) runs them."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from genesis_fp16.rollout import ledger as rollout
from genesis_fp16.training.guarded import UNGUARDED
from infrastructure.world_model import WorldModel
from tests.test_world_model import FakeGuard, _linear_trajs

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def cuda_policy(obs: torch.Tensor) -> torch.Tensor:
    assert obs.device.type == "cuda"
    return torch.tanh(obs[:, :1] - obs[:, 1:2])


async def test_fp16_with_the_scaler_trains_on_cuda():
    wm = WorldModel(3, 1, device="cuda", precision="fp16", guard=UNGUARDED, seed=0)
    assert all(p.device.type == "cuda" for p in wm.model.parameters())
    report = await wm.train(300, trajectories=_linear_trajs(), save=False)
    assert report.precision == "fp16" and report.device.startswith("cuda") and wm.trainer.scaler.is_enabled()
    assert wm.trainer.device.type == "cuda" and math.isfinite(report.val_loss) and report.val_loss < 0.05
    next_obs, reward = wm.predict_sync(np.zeros((2, 3)), np.zeros((2, 1)))
    assert next_obs.device.type == "cpu" and reward.shape == (2,)


@pytest.mark.skipif(not torch.cuda.is_available() or not torch.cuda.is_bf16_supported(), reason="needs BF16 on CUDA")
async def test_bf16_trains_on_cuda_beside_its_fp32_shadow_on_the_same_device(monkeypatch):
    monkeypatch.setattr(rollout, "current_stage", lambda agent, settings: "shadow")
    wm = WorldModel(3, 1, device="cuda", precision="bf16", guard=FakeGuard(), seed=0)
    report = await wm.train(200, trajectories=_linear_trajs(), save=False)
    assert report.precision == "bf16" and report.fp32_val_loss is not None and abs(report.shadow_gap) < 0.5
    shadow = wm.training.shadow
    assert shadow is not None and all(p.device.type == "cuda" for p in shadow.model.parameters())


async def test_rollouts_run_on_cuda_and_a_gpu_checkpoint_loads_on_the_cpu(tmp_path):
    trajs = _linear_trajs(4, 60)
    wm = WorldModel(3, 1, device="cuda", precision="fp32", guard=UNGUARDED, seed=0, checkpoint_dir=tmp_path)
    await wm.train(150, trajectories=trajs)
    start = np.concatenate([t.obs[::15] for t in trajs])
    a = await wm.rollouts(cuda_policy, start, 5, seed=2, max_disagreement=math.inf)
    b = await wm.rollouts(cuda_policy, start, 5, seed=2, max_disagreement=math.inf)
    assert a.transitions.obs.device.type == "cuda" and len(a.transitions) == 5 * len(start)
    assert torch.equal(a.transitions.next_obs, b.transitions.next_obs) and torch.isfinite(a.transitions.rew).all()
    on_cpu = WorldModel(3, 1, device="cpu", precision="fp32", guard=UNGUARDED, seed=3, checkpoint_dir=tmp_path)
    on_cpu.load()
    obs, act = torch.tensor(trajs[0].obs), torch.tensor(trajs[0].action)
    torch.testing.assert_close(on_cpu.predict_sync(obs, act)[0], wm.predict_sync(obs, act)[0], rtol=1e-4, atol=1e-4)
    assert on_cpu.model.elites == wm.model.elites
    # the draws come from a CPU generator: the same rollout on either device, up to the kernels' rounding
    cpu = await on_cpu.rollouts(
        lambda obs: torch.tanh(obs[:, :1] - obs[:, 1:2]), start, 5, seed=2, max_disagreement=math.inf
    )
    torch.testing.assert_close(cpu.transitions.next_obs, a.transitions.next_obs.cpu(), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
async def test_the_world_model_and_the_critic_train_captured_on_cuda_as_they_do_eagerly(precision):
    """Their windows' steps captured once per batch shape and replayed (genesis_fp16/training/capture.py), with
    the same validation loss as the same call with capture off."""
    from infrastructure.critic import Critic
    from tests.test_critic import BOX, _one_step

    def zero_policy(obs: torch.Tensor) -> torch.Tensor:
        return torch.zeros(len(obs), 1, device=obs.device)

    reports = []
    for capture in (True, False):
        wm = WorldModel(3, 1, device="cuda", precision=precision, guard=UNGUARDED, seed=0)
        wm.trainer.config.capture = capture
        wm_report = await wm.train(200, trajectories=_linear_trajs(), save=False)
        critic = Critic(3, 1, device="cuda", precision=precision, guard=UNGUARDED, hidden=32, batch_size=64, **BOX)
        critic.trainer.config.capture = capture
        critic_report = await critic.train(_one_step(), zero_policy, 200, save=False)
        for learner in (wm, critic):
            graphs = learner.trainer.step_graphs
            if capture:
                assert graphs is not None and graphs.captures >= 1 and graphs.replays >= 200 - 4 * graphs.captures
            else:
                assert graphs is None
        reports.append((wm_report.val_loss, critic_report.val_loss))
    print(f"{precision}: captured (world model, critic) val loss {reports[0]}, eager {reports[1]}")
    for captured, eager in zip(*reports):
        assert math.isfinite(captured) and math.isclose(captured, eager, rel_tol=1e-4, abs_tol=1e-6)

"""Critic: the TD3 target by hand, learning a one-step task, determinism,
bad input, checkpoints (round trip, foreign files), the value's gradient,
the normaliser refit keeping the function, and a NaN storm rolled back by
the guard."""

from __future__ import annotations

import math

import pytest
import torch

from genesis_fp16.rollout import ledger as rollout
from genesis_fp16.training.checkpoint import CheckpointError
from genesis_fp16.training.guarded import UNGUARDED
from genesis_fp16.precision import capability
from infrastructure.critic import Critic, NonFiniteDataError, Transitions, compute_targets
from infrastructure.critic_net import normaliser_stats, smoothing_noise
from loss_faults import loss_fault

pytestmark = pytest.mark.usefixtures("one_thread")

BOX = {"action_low": [-2.0], "action_high": [2.0]}


def _one_step(n: int = 512, seed: int = 0) -> Transitions:
    """Every transition ends its episode: Q(s, a) = r(s, a) = -|s|^2 - 0.5 a^2 + s_0 a."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.rand(n, 3, generator=g) * 2 - 1
    act = torch.rand(n, 1, generator=g) * 4 - 2
    rew = -(obs**2).sum(1) - 0.5 * act[:, 0] ** 2 + obs[:, 0] * act[:, 0]
    return Transitions(obs, act, rew, torch.rand(n, 3, generator=g), torch.ones(n))


def _zero_policy(obs: torch.Tensor) -> torch.Tensor:
    return torch.zeros(len(obs), 1)


def _critic(**kw) -> Critic:
    kw = {"precision": "fp32", "guard": UNGUARDED, "hidden": 32, "batch_size": 64, **BOX, **kw}
    return Critic(3, 1, **kw)


def test_compute_targets_by_hand():
    def target_q(obs, act):  # twin 1: sum(obs) + 2a; twin 2: twin 1 + 0.5, except row 1 where it is lower
        q1 = obs.sum(1) + 2 * act[:, 0]
        return torch.stack((q1, q1 + torch.tensor([0.5, -3.0])))

    rew, terminal = torch.tensor([1.0, 2.0]), torch.tensor([0.0, 0.0])
    next_obs = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    next_act, noise = torch.tensor([[0.8], [-0.2]]), torch.tensor([[0.5], [-0.1]])
    low, high = torch.tensor([-1.0]), torch.tensor([1.0])
    y = compute_targets(rew, terminal, next_obs, next_act, noise, target_q, gamma=0.9, low=low, high=high)
    # row 0: a' = clip(1.3) = 1.0, q1 = 1 + 2 = 3, q2 = 3.5, min 3 -> 1 + 0.9 * 3 = 3.7
    # row 1: a' = -0.3, q1 = 1 - 0.6 = 0.4, q2 = 0.4 - 3 = -2.6, min -2.6 -> 2 + 0.9 * -2.6 = -0.34
    torch.testing.assert_close(y, torch.tensor([3.7, -0.34]))
    # a terminal row is its reward, whatever the next state is worth
    y_term = compute_targets(
        rew, torch.tensor([1.0, 0.0]), next_obs, next_act, noise, target_q, gamma=0.9, low=low, high=high
    )
    torch.testing.assert_close(y_term, torch.tensor([1.0, -0.34]))


def test_smoothing_noise_is_clipped_in_fractions_of_the_half_range():
    half = torch.tensor([2.0, 0.5])
    noise = smoothing_noise(10_000, half, 0.2, 0.5, torch.Generator().manual_seed(0))
    assert noise.shape == (10_000, 2)
    assert float(noise[:, 0].abs().max()) == pytest.approx(1.0) and float(noise[:, 1].abs().max()) == pytest.approx(
        0.25
    )
    assert float(noise[:, 0].std()) == pytest.approx(0.2 * 2.0, rel=0.1)


async def test_learns_a_one_step_task_and_is_deterministic():
    data = _one_step()
    critic = _critic()
    first = await critic.train(data, _zero_policy, 400, save=False)
    assert first.steps == 400 and first.precision == "fp32" and first.transitions == len(data)
    with torch.no_grad():
        err = (critic.value(data.obs, data.act) - data.rew).pow(2).mean()
    assert float(err) < 0.02 * float(data.rew.var()), (float(err), float(data.rew.var()))
    second = await critic.train(data, _zero_policy, 200, save=False)
    assert second.val_loss < 0.05 and math.isfinite(second.train_loss)
    again = _critic()
    await again.train(data, _zero_policy, 400, save=False)
    await again.train(data, _zero_policy, 200, save=False)
    for (name, a), b in zip(critic.model.state_dict().items(), again.model.state_dict().values()):
        assert torch.equal(a, b), name
    assert all(
        torch.equal(a, b) for a, b in zip(critic.target.state_dict().values(), again.target.state_dict().values())
    )


async def test_a_discounted_task_converges_to_its_fixed_point():
    """r = 1 on every step, never terminal, the policy irrelevant: Q = 1 / (1 - gamma)."""
    g = torch.Generator().manual_seed(0)
    n = 256
    obs = torch.rand(n, 3, generator=g)
    data = Transitions(obs, torch.rand(n, 1, generator=g), torch.ones(n), torch.rand(n, 3, generator=g), torch.zeros(n))
    critic = _critic(gamma=0.5, tau=0.05)
    await critic.train(data, _zero_policy, 600, save=False)
    torch.testing.assert_close(critic.value(obs[:8], torch.zeros(8, 1)), torch.full((8,), 2.0), atol=0.1, rtol=0)


def test_a_refit_keeps_the_function():
    critic = _critic()
    obs, act = torch.randn(16, 3), torch.rand(16, 1) * 4 - 2
    data = _one_step(64)
    critic.model.refit(*normaliser_stats(data, 0.99))  # the first fit sets the statistics
    before = critic.model.q(obs, act)
    critic.model.refit(
        torch.tensor([0.3, -1.0, 2.0]), torch.tensor([2.0, 0.5, 1.0]), torch.tensor(-40.0), torch.tensor(7.0)
    )
    torch.testing.assert_close(critic.model.q(obs, act), before, rtol=1e-4, atol=1e-4)


async def test_bad_input_is_refused_before_anything_trains():
    critic = _critic()
    weights = {k: v.clone() for k, v in critic.model.state_dict().items()}
    data = _one_step(32)
    rew = data.rew.clone()
    rew[7] = float("nan")
    with pytest.raises(NonFiniteDataError, match=r"transitions.rew .* row 7"):
        await critic.train(Transitions(data.obs, data.act, rew, data.next_obs, data.terminal), _zero_policy, 10)
    with pytest.raises(ValueError, match=r"act has shape \(32, 2\), expected \(N, 1\)"):
        await critic.train(
            Transitions(data.obs, torch.zeros(32, 2), data.rew, data.next_obs, data.terminal), _zero_policy, 10
        )
    with pytest.raises(ValueError, match="steps=0"):
        await critic.train(data, _zero_policy, 0)
    with pytest.raises(ValueError, match="target_policy gave actions of shape"):
        await critic.train(data, lambda obs: torch.zeros(len(obs), 3), 10)
    with pytest.raises(ValueError, match="action box"):
        Critic(3, 1, action_low=[1.0], action_high=[-1.0], guard=UNGUARDED)
    assert critic.history == [] and not critic.trained
    assert all(torch.equal(weights[k], v) for k, v in critic.model.state_dict().items())


async def test_checkpoint_round_trip_trains_on_identically(tmp_path):
    data = _one_step(128)
    critic = _critic(checkpoint_dir=tmp_path)
    report = await critic.train(data, _zero_policy, 50)
    assert report.checkpoint == str(critic.checkpoint_path)
    other = _critic(checkpoint_dir=tmp_path, seed=7)
    other.load()
    assert other.trained
    for a, b in ((critic.model, other.model), (critic.target, other.target)):
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    await critic.train(data, _zero_policy, 20, save=False)
    await other.train(data, _zero_policy, 20, save=False)
    assert all(torch.equal(x, y) for x, y in zip(critic.model.state_dict().values(), other.model.state_dict().values()))


async def test_a_foreign_checkpoint_is_refused_and_changes_nothing(tmp_path):
    from infrastructure.world_model import WorldModel

    wm_path = WorldModel(3, 1, precision="fp32", guard=UNGUARDED, checkpoint_dir=tmp_path).save(tmp_path / "wm.pt")
    wide = _critic(hidden=48, checkpoint_dir=tmp_path)
    await wide.train(_one_step(64), _zero_policy, 5)
    critic = _critic(checkpoint_dir=tmp_path / "c")
    await critic.train(_one_step(64), _zero_policy, 5, save=False)
    weights = {k: v.clone() for k, v in critic.model.state_dict().items()}
    target = {k: v.clone() for k, v in critic.target.state_dict().items()}
    sampler = critic._generator.get_state()
    with pytest.raises(CheckpointError, match="world model's checkpoint"):
        critic.load(wm_path)
    with pytest.raises(CheckpointError, match="hidden=48"):
        critic.load(wide.checkpoint_path)
    assert all(torch.equal(weights[k], v) for k, v in critic.model.state_dict().items())
    assert all(torch.equal(target[k], v) for k, v in critic.target.state_dict().items())
    assert torch.equal(sampler, critic._generator.get_state())


async def test_value_is_differentiable_in_the_action_only():
    critic = _critic()
    await critic.train(_one_step(128), _zero_policy, 50, save=False)
    act = torch.zeros(4, 1, requires_grad=True)
    value = critic.value(torch.randn(4, 3), act)
    assert value.shape == (4,)
    value.sum().backward()
    assert act.grad is not None and bool(torch.isfinite(act.grad).all()) and bool((act.grad != 0).any())
    assert all(p.grad is None for p in critic.model.parameters())  # the critic's own weights gather nothing
    q1, q2 = critic.q_values(torch.randn(4, 3), torch.zeros(4, 1))
    assert q1.shape == q2.shape == (4,)


async def test_a_nan_storm_rolls_the_critic_back(monkeypatch, tmp_path):
    """As the world model's: an agent in stage on in bf16 (AMX flags patched in,
    so every CPU kind takes the same path), a NaN storm through
    tests/loss_faults.py: its own RollbackGuard rolls it back to the last good
    checkpoint in FP32, the target network is reset from the restored
    weights, and training goes on."""
    from genesis_fp16.rollout.guard import RollbackGuard
    from genesis_fp16.base.settings import load_settings

    monkeypatch.setattr(
        capability, "cpu_flags", lambda: frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
    )
    monkeypatch.setenv("GENESIS_FP16_PRECISION", "bf16")
    agent = "critic.Pendulum-v1"
    ledger = rollout.RolloutLedger.from_settings(load_settings())
    ledger.enable(agent, actor="test")
    critic = Critic(3, 1, agent=agent, hidden=32, batch_size=64, checkpoint_dir=tmp_path, **BOX)
    assert isinstance(critic.guard, RollbackGuard)
    data = _one_step(256)
    first = await critic.train(data, _zero_policy, 30)
    assert first.precision == "bf16" and not first.rolled_back
    resets = []
    real_reset = critic._reset_target
    monkeypatch.setattr(critic, "_reset_target", lambda: (resets.append(1), real_reset()))

    def storm(step, loss):
        return loss * float("nan") if 5 <= step < 12 else loss

    with loss_fault(critic, storm):
        hit = await critic.train(data, _zero_policy, 30)
    assert hit.rolled_back and hit.rollback_reason.startswith("P0") and hit.precision == "fp32"
    assert f"restored {first.checkpoint}" in hit.events
    assert ledger.stage(agent) == "rolled_back"
    assert resets == [1]  # the target re-made from the restored weights
    assert critic.trainer.precision.name == "fp32" and math.isfinite(hit.val_loss)
    assert all(bool(torch.isfinite(p).all()) for p in [*critic.model.parameters(), *critic.target.parameters()])
    after = await critic.train(data, _zero_policy, 30)
    assert after.precision == "fp32" and not after.rolled_back and math.isfinite(after.val_loss)


def test_bench_script_runs_on_a_tiny_grid(tmp_path, capsys):
    import json

    from scripts_loader import load_script

    bench = load_script("bench_critic")
    out = tmp_path / "bench.json"
    assert (
        bench.main(
            [
                "--hiddens",
                "8",
                "--envs",
                "Pendulum",
                "--rounds",
                "1",
                "--steps",
                "2",
                "--quality-steps",
                "3",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    assert result["torch"] == torch.__version__ and isinstance(result["cpu_flags"], list)
    (row,) = result["rows"]
    assert row["env"] == "Pendulum" and row["hidden"] == 8 and row["fp32_ms"] > 0 and row["bf16_ms"] > 0
    assert math.isfinite(row["val_fp32"]) and "bf16 x" in capsys.readouterr().out


async def test_train_tells_of_each_step_as_it_is_done():
    """Issue 54: a caller's progress hears of every step of a call (`on_step(done)`), in order, the last one too."""
    critic, done = _critic(), []
    report = await critic.train(_one_step(256), _zero_policy, 37, save=False, on_step=done.append)
    assert done == list(range(1, 38)) and report.steps == 37
    await critic.train(_one_step(256), _zero_policy, 5, save=False)  # no caller listening: nothing told
    assert len(done) == 37

"""PPO's CPU fast path (`agents.ppo.fast`) against the one definition in
`agents.ppo.ppo`: the fused loss gives `ppo_loss`'s values and gradients to
float32 rounding (on ties, as on an update's first minibatch; on ratios clipped
on either side with advantages of either sign; with and without advantage
normalisation and the entropy bonus; on autocast's BF16 outputs), the towers
node gives `ActorCritic.forward`'s outputs and gradients, the rollout actor
its actions, and each piece steps aside where it does not apply."""

from __future__ import annotations

import pytest
import torch

from agents.ppo.config import load_config
from agents.ppo.fast import PIECES, FastPath
from agents.ppo.ppo import PPO, ActorCritic, LossSettings, ppo_loss


def _minibatch(net: ActorCritic, n: int, seed: int, ratio_spread: float) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, 5, generator=g)
    with torch.no_grad():
        out, value = net(obs)
        if net.discrete:
            act = torch.multinomial(torch.softmax(out, -1), 1, generator=g).squeeze(-1).float()
        else:
            act = out + net.log_std.exp() * torch.randn(out.shape, generator=g)
        logp, _ = net.log_prob_entropy(out, act, with_entropy=False)
    # ratio_spread 0: the rollout's own log-probabilities (ratio exactly 1: every surrogate term a tie)
    logp_old = logp + ratio_spread * torch.randn(n, generator=g)
    return {
        "obs": obs,
        "act": act,
        "logp": logp_old,
        "adv": torch.randn(n, generator=g) * 3 + 0.5,
        "ret": value + torch.randn(n, generator=g),
        "val": value,
    }


def _loss_and_grads(
    net: ActorCritic, mb: dict[str, torch.Tensor], s: LossSettings, fused: bool, autocast: bool = False
):
    net.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out, value = net(mb["obs"])
        loss, diag = FastPath(net).loss(out, value, mb, s) if fused else ppo_loss(net, out, value, mb, s)
    loss.backward()
    return (
        loss.detach(),
        {k: v.detach() for k, v in diag.items()},
        {n: p.grad.clone() for n, p in net.named_parameters() if p.requires_grad},
    )


def _net(discrete: bool) -> ActorCritic:
    torch.manual_seed(0)
    net = ActorCritic(5, 3, discrete=discrete, hidden=16)
    with torch.no_grad():
        net.log_std.copy_(torch.tensor([-0.5, 0.0, 0.4]))
        net.actor_head.weight.mul_(100.0)  # logits far from uniform: the categorical entropy's gradient is not ~0
    return net


def _assert_same(fused, plain, rtol=1e-5, grad_rtol=1e-4):
    torch.testing.assert_close(fused[0], plain[0], rtol=rtol, atol=1e-6)
    for key in plain[1]:
        torch.testing.assert_close(fused[1][key], plain[1][key], rtol=rtol, atol=1e-6)
    for name, grad in plain[2].items():
        torch.testing.assert_close(fused[2][name], grad, rtol=grad_rtol, atol=1e-6, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("discrete", [False, True])
@pytest.mark.parametrize("ratio_spread", [0.0, 0.3, 1.5])
@pytest.mark.parametrize("norm_adv, ent_coef", [(True, 0.0), (False, 0.01), (True, 0.05)])
def test_the_fused_loss_has_ppo_losss_values_and_gradients(ratio_spread, norm_adv, ent_coef, discrete):
    net = _net(discrete)
    s = LossSettings(clip_coef=0.2, vf_coef=0.5, ent_coef=ent_coef, norm_adv=norm_adv, clip_vloss=False)
    mb = _minibatch(net, 64, seed=1, ratio_spread=ratio_spread)
    _assert_same(_loss_and_grads(net, mb, s, True), _loss_and_grads(net, mb, s, False))
    if ratio_spread >= 1.5:  # the clipping is exercised: some ratios beyond either bound
        with torch.no_grad():
            ratio = (net.log_prob_entropy(net(mb["obs"])[0], mb["act"], with_entropy=False)[0] - mb["logp"]).exp()
        assert (ratio > 1.2).any() and (ratio < 0.8).any()


@pytest.mark.parametrize("discrete", [False, True])
def test_the_fused_loss_on_autocasts_bf16_outputs_is_ppo_loss_under_autocast(discrete):
    net = _net(discrete)
    s = LossSettings(clip_coef=0.2, vf_coef=0.5, ent_coef=0.01, norm_adv=True, clip_vloss=False)
    mb = _minibatch(net, 64, seed=2, ratio_spread=0.3)
    _assert_same(_loss_and_grads(net, mb, s, True, autocast=True), _loss_and_grads(net, mb, s, False, autocast=True))


def test_the_fused_loss_steps_aside_where_it_does_not_apply():
    net = ActorCritic(5, 3, discrete=True, hidden=8)
    mb = _minibatch(net, 8, seed=0, ratio_spread=0.1)
    out, value = net(mb["obs"])
    assert FastPath(net).loss(out, value, mb, LossSettings(0.2, 0.5, 0.0, True, clip_vloss=True)) is None
    without = FastPath(net, tuple(p for p in PIECES if p != "fused_loss"))
    assert without.loss(out, value, mb, LossSettings(0.2, 0.5, 0.0, True, clip_vloss=False)) is None
    with pytest.raises(ValueError, match="fast-path pieces"):
        FastPath(net, ("towers", "warp_drive"))


@pytest.mark.parametrize("discrete", [False, True])
def test_the_towers_node_gives_the_forwards_outputs_and_gradients(discrete):
    torch.manual_seed(0)
    net = ActorCritic(7, 3, discrete=discrete, hidden=16)
    obs, g_out, g_value = torch.randn(40, 7), torch.randn(40, 3), torch.randn(40)

    def outputs_and_grads(forward):
        net.zero_grad(set_to_none=True)
        out, value = forward(obs)
        ((out * g_out).sum() + (value * g_value).sum()).backward()
        return (
            out.detach(),
            value.detach(),
            {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None},
        )

    fast, plain = outputs_and_grads(FastPath(net).forward), outputs_and_grads(net.forward)
    assert fast[2].keys() == plain[2].keys()
    assert torch.equal(fast[0], plain[0]) and torch.equal(fast[1], plain[1])  # the forward's own ops: equal bit for bit
    for name, grad in plain[2].items():
        torch.testing.assert_close(fast[2][name], grad, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
    with torch.no_grad():  # no grad (rollout scoring): the node's forward alone, the same outputs
        assert all(torch.equal(a, b) for a, b in zip(FastPath(net).forward(obs), net(obs)))
    assert "Towers" in type(FastPath(net).forward(obs)[0].grad_fn).__name__  # one node
    out, _ = FastPath(net, tuple(p for p in PIECES if p != "towers")).forward(obs)
    assert "Towers" not in type(out.grad_fn).__name__
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast: the plain forward
        out, _ = FastPath(net).forward(obs)
    assert out.dtype == torch.bfloat16 and out.grad_fn is not None and "Towers" not in type(out.grad_fn).__name__


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_the_rollout_actor_picks_acts_actions_and_follows_the_weights(env_id):
    cfg = load_config(
        None,
        env_id=env_id,
        num_envs=8,
        num_steps=16,
        minibatch_size=16,
        total_steps=128,
        seed=5,
        vec_env="sync",
        device="cpu",
    )
    ppo = PPO(cfg)
    obs = torch.randn(8, ppo.obs_dim, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        perturbation = ppo.net.perturbation(ppo._draw_noise())
    lean = ppo._rollout_actor(perturbation)
    assert lean.__qualname__.startswith("FastPath.rollout_actor")

    def same(a, b):
        return torch.equal(a, b) if env_id == "CartPole-v1" else torch.allclose(a, b, rtol=1e-5, atol=1e-6)

    assert all(same(lean(obs, t), ppo.act(obs, perturbation[t])) for t in range(16))
    before = lean(obs, 0).clone()
    with torch.no_grad():  # an update changes the weights in place: the actor's views follow them
        ppo.net.w1.mul_(1.5)
        ppo.net.actor_head.bias.add_(0.3)
    assert same(lean(obs, 0), ppo.act(obs, perturbation[0]))
    assert not torch.equal(lean(obs, 0), before) or env_id == "CartPole-v1"
    ppo.close()
    # chunked inference, and the switch off: act
    for kw in (dict(inference_batch_size=3), dict(cpu_fast_path=False)):
        other = PPO(load_config(None, env_id=env_id, num_envs=8, vec_env="sync", device="cpu", **kw))
        assert other._rollout_actor(perturbation).__qualname__.startswith("PPO._rollout_actor")
        other.close()


def test_a_run_with_the_switch_off_trains_to_the_same_weights_to_rounding():
    nets = []
    for fast in (True, False):
        cfg = load_config(
            None,
            env_id="Pendulum-v1",
            num_envs=2,
            num_steps=32,
            minibatch_size=32,
            update_epochs=1,
            total_steps=64,
            seed=3,
            vec_env="sync",
            device="cpu",
            cpu_fast_path=fast,
        )
        ppo = PPO(cfg)
        assert (ppo.fast is not None) == fast
        ppo.train()
        ppo.close()
        nets.append(ppo.net.state_dict())
    for name, weight in nets[1].items():
        torch.testing.assert_close(nets[0][name], weight, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")

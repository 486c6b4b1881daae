"""PPO's loss (`agents.ppo.loss`): the fused Gaussian and categorical tails
give the unfused loss's values and gradients to float32 rounding, on ties (ratio exactly 1, as
on an update's first minibatch), on ratios clipped on either side with
advantages of either sign, with and without advantage normalisation and the
entropy bonus; and it steps aside where it does not apply."""

from __future__ import annotations

import pytest
import torch

from agents.ppo import loss as ppo_loss_module
from agents.ppo.loss import LossSettings, ppo_loss, unfused_loss
from agents.ppo.policy import ActorCritic


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
    return {"obs": obs, "act": act, "logp": logp_old, "adv": torch.randn(n, generator=g) * 3 + 0.5,
            "ret": value + torch.randn(n, generator=g), "val": value}


def _loss_and_grads(net: ActorCritic, mb: dict[str, torch.Tensor], s: LossSettings, fused: bool):
    net.zero_grad(set_to_none=True)
    if fused:
        loss, diag = ppo_loss(net, net.forward, mb, s)
    else:
        out, value = net(mb["obs"])
        loss, diag = unfused_loss(net, out, value, mb, s)
    loss.backward()
    return loss.detach(), {k: v.detach() for k, v in diag.items()}, {n: p.grad.clone() for n, p in net.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("discrete", [False, True])
@pytest.mark.parametrize("ratio_spread", [0.0, 0.3, 1.5])
@pytest.mark.parametrize("norm_adv, ent_coef", [(True, 0.0), (False, 0.01), (True, 0.05)])
def test_the_fused_tail_has_the_unfused_losss_values_and_gradients(ratio_spread, norm_adv, ent_coef, discrete):
    torch.manual_seed(0)
    net = ActorCritic(5, 3, discrete=discrete, hidden=16)
    with torch.no_grad():
        net.log_std.copy_(torch.tensor([-0.5, 0.0, 0.4]))
        net.actor_head.weight.mul_(100.0)  # logits far from uniform: the categorical entropy's gradient is not ~0
    s = LossSettings(clip_coef=0.2, vf_coef=0.5, ent_coef=ent_coef, norm_adv=norm_adv, clip_vloss=False)
    mb = _minibatch(net, 64, seed=1, ratio_spread=ratio_spread)
    assert ppo_loss_module._fused(*net(mb["obs"]), s)
    fused, unfused = _loss_and_grads(net, mb, s, True), _loss_and_grads(net, mb, s, False)
    torch.testing.assert_close(fused[0], unfused[0], rtol=1e-5, atol=1e-6)
    for key in unfused[1]:
        torch.testing.assert_close(fused[1][key], unfused[1][key], rtol=1e-5, atol=1e-6)
    for name, grad in unfused[2].items():
        torch.testing.assert_close(fused[2][name], grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")
    if ratio_spread >= 1.5:  # the clipping is exercised: some ratios beyond either bound
        with torch.no_grad():
            out, _ = net(mb["obs"])
            ratio = (net.log_prob_entropy(out, mb["act"], with_entropy=False)[0] - mb["logp"]).exp()
        assert (ratio > 1.2).any() and (ratio < 0.8).any()


def test_the_fused_tail_steps_aside_where_it_does_not_apply():
    s = LossSettings(0.2, 0.5, 0.0, True, clip_vloss=False)
    gaussian, categorical = ActorCritic(5, 3, discrete=False, hidden=8), ActorCritic(5, 3, discrete=True, hidden=8)
    obs = torch.randn(4, 5)
    assert ppo_loss_module._fused(*gaussian(obs), s) and ppo_loss_module._fused(*categorical(obs), s)
    clip_vloss = LossSettings(0.2, 0.5, 0.0, True, clip_vloss=True)
    assert not ppo_loss_module._fused(*gaussian(obs), clip_vloss)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, value = gaussian(obs)
    assert out.dtype == torch.bfloat16 and not ppo_loss_module._fused(out, value, s)
    # value clipping: the unfused loss, which still trains
    mb = {"obs": obs, "act": torch.tensor([0.0, 1.0, 2.0, 1.0]), "logp": torch.full((4,), -1.1), "adv": torch.randn(4),
          "ret": torch.randn(4), "val": torch.zeros(4)}
    loss, _ = ppo_loss(categorical, categorical.forward, mb, clip_vloss)
    loss.backward()
    assert categorical.w1.grad is not None

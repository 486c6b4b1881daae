"""The fused PPO loss (`agents.ppo.loss.FusedPPOLoss`, gradients written
out) gives the loss, diagnostics and gradients of the autograd one."""

from __future__ import annotations

import pytest
import torch

from agents.ppo.loss import LossSettings, can_fuse, fused_ppo_loss, ppo_loss
from agents.ppo.policy import ActorCritic

pytestmark = pytest.mark.usefixtures("one_thread")


def _minibatch(net: ActorCritic, n: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, net.w1.shape[1], generator=g)
    with torch.no_grad():
        out, value = net(obs)
        noise = torch.rand(out.shape, generator=g) if net.discrete else torch.randn(out.shape, generator=g)
        act = net.sample(out, noise)
        logp, _ = net.log_prob_entropy(out, act, with_entropy=False)
    # old log-probs off by up to +-0.5: ratios both inside and outside the clip range, on both sides
    old = logp + (torch.rand(n, generator=g) - 0.5)
    return {"obs": obs, "act": act, "logp": old, "adv": torch.randn(n, generator=g) * 3 + 1, "ret": value + torch.randn(n, generator=g),
            "val": value}


def _grads(net: ActorCritic, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    net.zero_grad(set_to_none=True)
    loss.backward()
    return {k: p.grad.clone() for k, p in net.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("discrete", [True, False])
@pytest.mark.parametrize("norm_adv,ent_coef", [(True, 0.0), (False, 0.01), (True, 0.05)])
def test_fused_loss_matches_autograd(discrete, norm_adv, ent_coef):
    torch.manual_seed(0)
    net = ActorCritic(5, 3, discrete, hidden=16)
    if not discrete:
        with torch.no_grad():
            net.log_std.copy_(torch.tensor([-0.3, 0.0, 0.4]))
    mb = _minibatch(net, 64, seed=1)
    s = LossSettings(clip_coef=0.2, vf_coef=0.5, ent_coef=ent_coef, norm_adv=norm_adv, clip_vloss=False)
    ratio = (net.log_prob_entropy(net(mb["obs"])[0], mb["act"])[0] - mb["logp"]).exp()
    assert ((ratio < 0.8) | (ratio > 1.2)).any() and ((ratio > 0.8) & (ratio < 1.2)).any()  # both branches are exercised
    ref_loss, ref_diag = ppo_loss(net, net.forward, mb, s)
    ref = _grads(net, ref_loss)
    loss, diag = fused_ppo_loss(net, mb, s)
    got = _grads(net, loss)
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5, abs=1e-6)
    for key in ref_diag:
        assert diag[key].item() == pytest.approx(ref_diag[key].item(), rel=1e-5, abs=1e-6), key
    assert set(got) == set(ref)
    for key in ref:
        torch.testing.assert_close(got[key], ref[key], rtol=1e-4, atol=1e-6, msg=key)


def test_fused_loss_scales_with_the_incoming_gradient():
    """The gradient scaler multiplies the loss before backward: the fused gradients scale with it."""
    net = ActorCritic(4, 2, False, hidden=8)
    mb = _minibatch(net, 32, seed=2)
    s = LossSettings(0.2, 0.5, 0.01, True, False)
    one = _grads(net, fused_ppo_loss(net, mb, s)[0])
    scaled = _grads(net, fused_ppo_loss(net, mb, s)[0] * 1024.0)
    for key in one:
        torch.testing.assert_close(scaled[key], one[key] * 1024.0, rtol=1e-5, atol=1e-6)


def test_autocast_and_value_clipping_use_the_autograd_loss():
    s = LossSettings(0.2, 0.5, 0.0, True, False)
    assert can_fuse(s)
    assert not can_fuse(LossSettings(0.2, 0.5, 0.0, True, True))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not can_fuse(s)

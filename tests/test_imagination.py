"""Imagination (infrastructure/imagination.py): rewards clipped to what the
data showed, truncation where the members disagree, seeded particles, the
pessimistic score, the extrapolated tail, bad arguments."""

from __future__ import annotations

import asyncio
import copy
import math

import numpy as np
import pytest
import torch

from genesis_fp16.guarded import UNGUARDED
from infrastructure.imagination import LOWEST_SCORE, Imagination
from infrastructure.world_model import WorldModel
from tests.test_world_model import _linear_trajs

pytestmark = pytest.mark.usefixtures("one_thread")

PARAMS = np.random.default_rng(1).normal(size=(4, 3))
START = np.random.default_rng(2).normal(size=(5, 3)).astype(np.float32)


def linear_policy(params: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
    return torch.tanh(torch.einsum("pd,psd->ps", params, obs)).unsqueeze(-1)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> WorldModel:
    from genesis_fp16.settings import Settings

    settings = Settings(state_dir=tmp_path_factory.mktemp("state"), precision="fp32")
    wm = WorldModel(3, 1, guard=UNGUARDED, settings=settings, ensemble=3, hidden=32, seed=0)
    asyncio.run(wm.train(300, trajectories=_linear_trajs(4, 80), save=False))
    return wm


@pytest.fixture
def wm(trained) -> WorldModel:
    """The trained model, which a test may change: its weights are put back afterwards."""
    saved = copy.deepcopy(trained.model.state_dict())
    yield trained
    trained.model.load_state_dict(saved)


def _reward_output(wm: WorldModel) -> int:
    return wm.model.obs_dim  # the reward's mean follows the deltas' in the head


def test_the_result_holds_what_it_says(wm):
    imagined = wm.imagine_uncertain(linear_policy, PARAMS, START, 12, particles=6, kappa=0.5)
    assert isinstance(imagined, Imagination) and imagined.horizon == 12
    assert imagined.returns.shape == (4, 5, 6) and imagined.returns.dtype == torch.float32 and imagined.returns.device.type == "cpu"
    per_particle = imagined.returns.double().mean(1)
    np.testing.assert_allclose(imagined.mean, per_particle.mean(1).numpy(), rtol=1e-6)
    np.testing.assert_allclose(imagined.std, per_particle.std(1).numpy(), rtol=1e-6)
    assert (imagined.std > 0).all()  # the members and their noise differ
    np.testing.assert_allclose(imagined.score, imagined.mean - 0.5 * imagined.std)
    np.testing.assert_allclose(imagined.low, imagined.mean - 2 * imagined.std)
    np.testing.assert_allclose(imagined.high, imagined.mean + 2 * imagined.std)
    assert imagined.truncated.shape == (4,) and (imagined.truncated == 0).all()  # inside the data: nothing truncated
    torch.testing.assert_close(wm.imagine(linear_policy, PARAMS, START, 12, particles=6), imagined.returns.mean(-1))


def test_the_same_seed_gives_the_same_imagination(wm):
    a = wm.imagine_uncertain(linear_policy, PARAMS, START, 15, seed=3)
    b = wm.imagine_uncertain(linear_policy, PARAMS, START, 15, seed=3)
    assert torch.equal(a.returns, b.returns)
    for name in ("mean", "std", "score", "low", "high", "truncated"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    other = wm.imagine_uncertain(linear_policy, PARAMS, START, 15, seed=4)
    assert not torch.equal(a.returns, other.returns)  # particles are sampled


def test_a_candidate_is_imagined_the_same_alone_or_among_others(wm):
    """The noise is shared by the candidates (common random numbers)."""
    together = wm.imagine_uncertain(linear_policy, PARAMS, START, 15, seed=1).returns
    alone = torch.cat([wm.imagine_uncertain(linear_policy, PARAMS[i : i + 1], START, 15, seed=1).returns for i in range(4)])
    torch.testing.assert_close(together, alone, rtol=1e-4, atol=1e-3)


def test_imagined_returns_never_exceed_the_largest_reward_seen(wm):
    with torch.no_grad():
        wm.model.head.bias[:, :, _reward_output(wm)] += 100.0  # every member now predicts a huge reward
    high = float(wm.model.reward_high)
    imagined = wm.imagine_uncertain(linear_policy, PARAMS, START, 20)
    assert float(imagined.returns.max()) <= 20 * high + 1e-4
    torch.testing.assert_close(imagined.returns, torch.full_like(imagined.returns, 20 * high))
    # the extrapolated tail too: the rest of the episode at the mean of the horizon's last quarter
    longer = wm.imagine_uncertain(linear_policy, PARAMS, START, 8, episode_steps=30)
    torch.testing.assert_close(longer.returns, torch.full_like(longer.returns, 30 * high))
    discounted = wm.imagine_uncertain(linear_policy, PARAMS, START, 8, episode_steps=30, discount=0.9)
    expected = high * (1 - 0.9**30) / (1 - 0.9)
    torch.testing.assert_close(discounted.returns, torch.full_like(discounted.returns, expected))


def test_members_that_disagree_truncate_the_rollout_pessimistically(wm):
    with torch.no_grad():
        wm.model.head.weight[1, :, : wm.model.obs_dim] += 3.0  # member 1's deltas now differ from the others' everywhere
    low = float(wm.model.reward_low)
    imagined = wm.imagine_uncertain(linear_policy, PARAMS, START, 10, particles=3)
    assert (imagined.truncated == 1.0).all()
    # truncated at the first step: every step valued at the lowest reward seen (no termination here)
    torch.testing.assert_close(imagined.returns, torch.full_like(imagined.returns, 10 * low))
    never = wm.imagine_uncertain(linear_policy, PARAMS, START, 10, particles=3, max_disagreement=math.inf)
    assert (never.truncated == 0).all() and (never.returns > imagined.returns).all()
    # where the rollout can end, ending it (0 a step) is the worse case once rewards are above 0
    with torch.no_grad():
        wm.model.reward_low.fill_(0.5)
        wm.model.reward_high.fill_(2.0)
    ending = wm.imagine_uncertain(linear_policy, PARAMS, START, 10, particles=3, terminated=lambda obs: obs[..., 0] > 1e9)
    assert (ending.truncated == 1.0).all() and float(ending.returns.abs().max()) == 0.0


def test_a_diverged_rollout_scores_lowest(wm):
    def broken(params: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        actions = linear_policy(params, obs)
        return torch.where(params[:, :1, None] > 0, torch.full_like(actions, float("nan")), actions)

    params = np.array([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]])
    untruncated = wm.imagine_uncertain(broken, params, START, 5, max_disagreement=math.inf)
    assert untruncated.score[0] == LOWEST_SCORE and np.isfinite(untruncated.score[1]) and untruncated.score[1] > LOWEST_SCORE
    # with truncation on, NaN predictions count as disagreement: the rollout is truncated and valued pessimistically
    imagined = wm.imagine_uncertain(broken, params, START, 5)
    assert imagined.truncated[0] == 1.0 and imagined.truncated[1] == 0.0
    np.testing.assert_allclose(imagined.score[0], 5 * float(wm.model.reward_low), rtol=1e-5)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"particles": 0}, r"particles=0: expected at least 1"),
        ({"kappa": -1.0}, r"kappa=-1.0: expected a finite number >= 0"),
        ({"discount": 0.0}, r"discount=0.0: expected a number in \(0, 1\]"),
        ({"episode_steps": 5}, r"episode_steps=5: expected at least the horizon \(10 steps\)"),
        ({"max_disagreement": 0.0}, r"max_disagreement=0.0: expected a number > 0"),
    ],
)
def test_bad_arguments_are_refused(wm, options, message):
    with pytest.raises(ValueError, match=message):
        wm.imagine_uncertain(linear_policy, PARAMS, START, 10, **options)


def test_a_rollout_truncated_later_keeps_its_own_rate_at_most_the_datas_mean(wm, monkeypatch):
    """An episode that cannot end, truncated at the second check (step DISAGREEMENT_EVERY): the rest of the
    horizon at the rollout's own mean value per step so far, never above the data's mean reward per step."""
    from infrastructure import imagination

    every = imagination.DISAGREEMENT_EVERY
    first_four = wm.imagine_uncertain(linear_policy, PARAMS, START, every, particles=3, max_disagreement=math.inf)
    real_probe, calls = imagination._probe, []

    def probe_dead_first(x: torch.Tensor, alive: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append(1)
        features, probe_alive = real_probe(x, alive)
        return features, probe_alive if len(calls) > 1 else torch.zeros_like(probe_alive)  # no live probe at the first check

    monkeypatch.setattr(imagination, "_probe", probe_dead_first)
    later = wm.imagine_uncertain(linear_policy, PARAMS, START, 10, particles=3, max_disagreement=1e-12)
    assert (later.truncated == 1.0).all() and len(calls) >= 2
    data_mean = float(wm.model.y_mean[wm.model.obs_dim])
    rate = torch.clamp(first_four.returns / every, max=data_mean)
    torch.testing.assert_close(later.returns, first_four.returns + (10 - every) * rate, rtol=1e-4, atol=1e-4)

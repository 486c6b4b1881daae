"""The model's short rollouts (infrastructure/model_env.py): seeded draws,
rows cut where the elites disagree, termination, rewards clipped to what the
data showed, the transitions collected, one-step rollouts against predict,
and the inputs refused."""

from __future__ import annotations

import asyncio
import copy
import math

import numpy as np
import pytest
import torch

from genesis_fp16.training.guarded import UNGUARDED
from genesis_fp16.base.settings import Settings
from infrastructure.dynamics import NotTrainedError
from infrastructure.ensemble import EnsembleDynamics
from infrastructure.model_env import ModelEnv, RolloutStats, branched_rollouts
from infrastructure.transitions import Transitions
from infrastructure.world_model import WorldModel
from tests.test_world_model import _linear_trajs

pytestmark = pytest.mark.usefixtures("one_thread")

TRAJS = _linear_trajs(4, 80)
INSIDE = np.concatenate([t.obs[::10] for t in TRAJS])  # 32 real states from the training data


def policy(obs: torch.Tensor) -> torch.Tensor:
    return torch.tanh(obs[:, :1] - obs[:, 1:2])


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> WorldModel:
    settings = Settings(state_dir=tmp_path_factory.mktemp("state"), precision="fp32")
    wm = WorldModel(3, 1, guard=UNGUARDED, settings=settings, ensemble=3, hidden=32, seed=0)
    asyncio.run(wm.train(300, trajectories=TRAJS, save=False))
    return wm


@pytest.fixture
def wm(trained) -> WorldModel:
    """The trained model, which a test may change: its weights are put back afterwards."""
    saved = copy.deepcopy(trained.model.state_dict())
    yield trained
    trained.model.load_state_dict(saved)


def _same(a: Transitions, b: Transitions) -> bool:
    return all(torch.equal(getattr(a, k), getattr(b, k)) for k in ("obs", "act", "rew", "next_obs", "terminal"))


def test_the_same_seed_gives_the_same_rollout(wm):
    a = branched_rollouts(wm, policy, INSIDE, 8, seed=3)
    b = branched_rollouts(wm, policy, INSIDE, 8, seed=3)
    assert _same(a.transitions, b.transitions) and a.stats == b.stats
    other = branched_rollouts(wm, policy, INSIDE, 8, seed=4)
    assert not torch.equal(a.transitions.next_obs, other.transitions.next_obs)  # members and noise are drawn
    # one ModelEnv draws afresh for its next rollout; a new one with the seed repeats the first
    env = wm.model_env(seed=3)
    first, second = branched_rollouts(env, policy, INSIDE, 8), branched_rollouts(env, policy, INSIDE, 8)
    assert _same(first.transitions, a.transitions) and not _same(first.transitions, second.transitions)


def test_the_transitions_chain_and_hold_what_they_say(wm):
    rolled = branched_rollouts(wm, policy, INSIDE, 5, max_disagreement=math.inf)
    t, n = rolled.transitions, len(INSIDE)
    assert len(t) == 5 * n and rolled.stats == RolloutStats(rows=n, horizon=5, transitions=5 * n, cut=0, terminated=0)
    assert all(
        v.dtype == torch.float32 and v.device.type == "cpu" for v in (t.obs, t.act, t.rew, t.next_obs, t.terminal)
    )
    torch.testing.assert_close(t.obs[:n], torch.as_tensor(INSIDE))  # step 0 starts at the real states
    torch.testing.assert_close(t.obs[n:], t.next_obs[:-n])  # each step starts where the last ended
    torch.testing.assert_close(t.act, policy(t.obs))
    assert rolled.stats.as_dict()["mean_length"] == 5.0 and rolled.stats.cut_share == 0.0


def test_a_state_far_outside_the_data_is_cut_and_one_inside_mostly_not(wm):
    inside = branched_rollouts(wm, policy, INSIDE, 10)
    assert inside.stats.cut_share <= 0.1, inside.stats
    far = branched_rollouts(wm, policy, INSIDE + 40.0, 10)
    assert far.stats.cut == len(INSIDE) and len(far.transitions) == 0  # cut at the first step: nothing returned
    assert far.transitions.obs.shape == (0, 3) and far.transitions.act.shape == (0, 1)
    never = branched_rollouts(wm, policy, INSIDE + 40.0, 10, max_disagreement=math.inf)
    assert never.stats.cut == 0 and len(never.transitions) == 10 * len(INSIDE)


def test_a_row_cut_later_keeps_the_steps_before_and_is_not_stepped_again(wm):
    env = ModelEnv(wm, seed=0)
    obs = env.reset(INSIDE[:4])
    _, _, _, alive = env.step(policy(obs))
    assert alive.all()
    with torch.no_grad():  # from now on member 1 disagrees with the others everywhere (the weights are taken at reset)
        env._weights[-1][1][1, :, :3] += 5.0
    before = env.obs.clone()
    next_obs, reward, terminal, alive = env.step(policy(env.obs))
    assert not alive.any() and env.cut.all() and not terminal.any()
    assert torch.equal(next_obs, before) and (reward == 0).all()  # a cut row keeps its last state, adds nothing
    next_obs, _, _, alive = env.step(torch.full((4, 1), float("nan")))  # an ended row's action is not read
    assert not alive.any() and torch.equal(next_obs, before) and env.lengths.tolist() == [1, 1, 1, 1]


def test_terminated_rows_return_their_last_transition_and_stop(wm):
    rows = torch.tensor([True, False, True, False])  # rows 0 and 2 end at their first step
    calls: list[int] = []

    def ends(obs: torch.Tensor) -> torch.Tensor:
        calls.append(len(obs))
        return rows.clone() if len(calls) == 1 else torch.zeros(len(obs), dtype=torch.bool)

    env = ModelEnv(wm, terminated=ends, max_disagreement=math.inf)
    obs = env.reset(INSIDE[:4])
    _, _, terminal, alive = env.step(policy(obs))
    assert alive.all() and terminal.tolist() == rows.tolist()
    assert env.running.tolist() == [False, True, False, True]
    _, _, terminal, alive = env.step(policy(env.obs))
    assert alive.tolist() == [False, True, False, True] and not terminal.any()
    assert calls == [4, 2]  # the rule sees the running rows only
    rolled = branched_rollouts(
        wm, policy, INSIDE[:4], 6, terminated=lambda obs: obs[:, 0] > -1e9, max_disagreement=math.inf
    )
    assert len(rolled.transitions) == 4 and (rolled.transitions.terminal == 1.0).all() and rolled.stats.terminated == 4


def test_rewards_are_clipped_to_the_range_seen_in_training(wm):
    reward = wm.model.obs_dim  # the reward's mean follows the deltas' in the head
    high, low = float(wm.model.reward_high), float(wm.model.reward_low)
    with torch.no_grad():
        wm.model.head.bias[:, :, reward] += 1000.0  # every member now predicts a huge reward
    rolled = branched_rollouts(wm, policy, INSIDE, 4, max_disagreement=math.inf)
    torch.testing.assert_close(rolled.transitions.rew, torch.full((4 * len(INSIDE),), high))
    with torch.no_grad():
        wm.model.head.bias[:, :, reward] -= 3000.0
    assert (branched_rollouts(wm, policy, INSIDE, 4, max_disagreement=math.inf).transitions.rew == low).all()


def test_non_finite_predictions_end_the_row_even_without_a_threshold(wm):
    with torch.no_grad():
        wm.model.head.bias[:, :, wm.model.obs_dim] = float("nan")
    rolled = branched_rollouts(wm, policy, INSIDE, 4, max_disagreement=math.inf)
    assert len(rolled.transitions) == 0 and rolled.stats.cut == len(INSIDE)


def test_the_transitions_counted_are_the_alive_steps(wm):
    env = ModelEnv(wm, seed=5, max_disagreement=0.05)  # tight: some rows are cut along the way
    obs, alive_steps = env.reset(INSIDE), 0
    for _ in range(12):
        obs, _, _, alive = env.step(policy(obs))
        alive_steps += int(alive.sum())
    rolled = branched_rollouts(ModelEnv(wm, seed=5, max_disagreement=0.05), policy, INSIDE, 12)
    assert 0 < rolled.stats.cut < len(INSIDE), rolled.stats
    assert len(rolled.transitions) == rolled.stats.transitions == alive_steps == int(env.lengths.sum())


async def test_a_one_step_rollout_of_one_deterministic_network_is_predict():
    wm = WorldModel(3, 1, precision="fp32", guard=UNGUARDED, ensemble=1, probabilistic=False, hidden=32, seed=0)
    await wm.train(100, trajectories=TRAJS, save=False)
    rolled = await wm.rollouts(policy, INSIDE, 1)
    t = rolled.transitions
    assert (
        t.obs.shape == t.next_obs.shape == (len(INSIDE), 3)
        and t.act.shape == (len(INSIDE), 1)
        and t.rew.shape == (len(INSIDE),)
    )
    next_obs, reward = wm.predict_sync(INSIDE, policy(torch.as_tensor(INSIDE)))
    torch.testing.assert_close(t.next_obs, next_obs)
    torch.testing.assert_close(t.rew, reward.clamp(float(wm.model.reward_low), float(wm.model.reward_high)))
    assert rolled.stats.cut == 0  # one network cannot disagree with itself


def test_a_one_step_rollout_samples_around_the_prediction(wm):
    rolled = branched_rollouts(wm, policy, np.repeat(INSIDE[:1], 400, 0), 1, max_disagreement=math.inf)
    mean, _ = wm.predict_sync(INSIDE[:1], policy(torch.as_tensor(INSIDE[:1])))
    spread = rolled.transitions.next_obs.std(0)
    assert (spread > 0).all()  # sampled, not the mean
    assert ((rolled.transitions.next_obs.mean(0) - mean[0]).abs() < 4 * spread / 20 + 0.05).all()


async def test_nothing_rolls_out_before_training():
    wm = WorldModel(3, 1, precision="fp32", guard=UNGUARDED, ensemble=2, hidden=8)
    for attempt in (
        lambda: ModelEnv(wm),
        wm.model_env,
        lambda: branched_rollouts(wm, policy, INSIDE, 3),
        lambda: ModelEnv(EnsembleDynamics(3, 1, ensemble=2, hidden=8)),
    ):
        with pytest.raises(NotTrainedError, match="train"):
            attempt()
    with pytest.raises(NotTrainedError):
        await wm.rollouts(policy, INSIDE, 3)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda wm: branched_rollouts(wm, policy, INSIDE, 0), r"horizon=0: expected at least 1 step"),
        (
            lambda wm: branched_rollouts(wm, policy, INSIDE[:, :2], 3),
            r"start states of shape \(32, 2\): expected \(N, 3\)",
        ),
        (lambda wm: branched_rollouts(wm, policy, INSIDE[0], 3), r"start states of shape \(3,\): expected \(N, 3\)"),
        (
            lambda wm: branched_rollouts(wm, lambda obs: obs, INSIDE, 3),
            r"policy returned shape \(32, 3\) for 32 observations",
        ),
        (
            lambda wm: branched_rollouts(wm, lambda obs: obs[:, :1] * np.nan, INSIDE, 3),
            r"actions of rows 0, 1, .* not finite",
        ),
        (lambda wm: branched_rollouts(wm.model_env(), policy, INSIDE, 3, seed=1), r"seed given with a ModelEnv"),
        (lambda wm: ModelEnv(wm, max_disagreement=0.0), r"max_disagreement=0.0: expected a number > 0"),
        (lambda wm: ModelEnv(wm).step(torch.zeros(2, 1)), r"call reset\(start_obs\) before stepping"),
    ],
)
def test_bad_inputs_are_refused(wm, call, message):
    with pytest.raises((ValueError, RuntimeError), match=message):
        call(wm)


def test_non_finite_start_states_are_named(wm):
    start = INSIDE[:5].copy()
    start[1, 0], start[3, 2] = np.nan, np.inf
    with pytest.raises(ValueError, match=r"start states 1, 3 are not finite"):
        branched_rollouts(wm, policy, start, 3)
    env = wm.model_env()
    env.reset(INSIDE[:2])
    with pytest.raises(ValueError, match=r"actions of shape \(3, 1\): expected \(2, 1\)"):
        env.step(torch.zeros(3, 1))


def _parts():
    from infrastructure.transitions import Transitions

    return Transitions, [
        Transitions(*(torch.full((n, *shape), float(n)) for shape in ((3,), (1,), (), (3,), ()))) for n in (2, 4)
    ]


def test_transitions_cat_joins_in_order():
    Transitions, parts = _parts()
    joined = Transitions.cat(parts)
    assert len(joined) == 6 and joined.obs.device.type == "cpu" and joined.rew.tolist() == [2.0] * 2 + [4.0] * 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_transitions_cat_joins_model_rollouts_on_the_gpu_with_real_data_on_the_host():
    Transitions, parts = _parts()
    joined = Transitions.cat([parts[0], parts[1].to(torch.device("cuda"))])
    assert len(joined) == 6 and joined.obs.device.type == "cpu" and joined.rew.tolist() == [2.0] * 2 + [4.0] * 4

"""The search's normalised coordinates: the raw <-> z maps are exact (the
policy acts the same), for linear and MLP policies; the running
statistics equal numpy's over all data; the identity before any data."""

from __future__ import annotations

import numpy as np
import pytest

from agents.search_space import SIGMA_FLOOR, ObsStats, SearchSpace
from agents.tasks import PolicySpec


def spec(hidden: int) -> PolicySpec:
    return PolicySpec(
        obs_dim=3,
        act_dim=2,
        hidden=hidden,
        obs_scale=(1.0, 0.5, 0.125),
        action_low=(-2.0, -1.0),
        action_high=(2.0, 1.0),
    )


def act_in_z(s: PolicySpec, space: SearchSpace, z: np.ndarray, obs: np.ndarray) -> np.ndarray:
    """The policy as the search sees it: its first layer on (obs * obs_scale - mu) / sigma."""
    x = (np.asarray(obs) * np.asarray(s.obs_scale) - space.mu) / space.sigma
    layers = s.unpack(z)
    for w, b in layers[:-1]:
        x = np.tanh(x @ w + b)
    w, b = layers[-1]
    return s.center + s.half_range * np.tanh(x @ w + b)


@pytest.mark.parametrize("hidden", [0, 4])
def test_raw_and_z_maps_are_exact(hidden):
    s = spec(hidden)
    rng = np.random.default_rng(0)
    space = SearchSpace(s, mu=np.array([0.3, -1.2, 2.0]), sigma=np.array([0.5, 2.0, 0.05]))
    z = rng.normal(size=(5, s.n_params))
    raw = space.to_raw(z)
    obs = rng.normal(size=(7, 3)) * 4
    for k in range(5):
        np.testing.assert_allclose(s.act(raw[k], obs), act_in_z(s, space, z[k], obs), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(space.to_z(raw), z, rtol=1e-12, atol=1e-12)  # and back
    fan_in, fan_out = s.layers()[0]
    first = fan_in * fan_out + fan_out
    np.testing.assert_array_equal(raw[:, first:], z[:, first:])  # only the first layer changes
    w_z = z[0, : fan_in * fan_out].reshape(fan_in, fan_out)
    np.testing.assert_allclose(
        raw[0, : fan_in * fan_out].reshape(fan_in, fan_out), w_z / space.sigma[:, None]
    )  # W_raw = W_z / sigma
    np.testing.assert_allclose(
        raw[0, fan_in * fan_out : first], z[0, fan_in * fan_out : first] - (space.mu / space.sigma) @ w_z
    )
    one = space.to_raw(z[0])  # one vector as well as a batch, and the input left alone
    np.testing.assert_allclose(one, raw[0])
    assert not np.shares_memory(one, z)


def test_blends_are_the_same_in_both_coordinates():
    s = spec(4)
    space = SearchSpace(s, mu=np.array([1.0, 0.0, -3.0]), sigma=np.array([2.0, 0.1, 1.0]))
    a, b = np.random.default_rng(1).normal(size=(2, s.n_params))
    np.testing.assert_allclose(
        space.to_raw(a + 0.3 * (b - a)), space.to_raw(a) + 0.3 * (space.to_raw(b) - space.to_raw(a)), atol=1e-12
    )


def test_identity_before_any_data_and_a_wrong_size_is_refused():
    s = spec(0)
    stats = ObsStats(3)
    space = stats.space(s)
    z = np.arange(s.n_params, dtype=float)
    np.testing.assert_array_equal(space.to_raw(z), z)
    np.testing.assert_array_equal(stats.std, np.ones(3))
    with pytest.raises(ValueError, match=f"expected {s.n_params}"):
        space.to_raw(np.zeros(s.n_params + 1))


def test_running_statistics_equal_numpy_over_all_data_and_round_trip():
    rng = np.random.default_rng(2)
    parts = [rng.normal(loc=[0, 5, -1], scale=[1, 3, 0.001], size=(n, 3)) for n in (4, 50, 1, 17)]
    stats = ObsStats(3)
    for part in parts:
        stats.update(part)
    data = np.concatenate(parts)
    assert stats.count == len(data)
    np.testing.assert_allclose(stats.mean, data.mean(axis=0), rtol=1e-12)
    expected = np.maximum(data.std(axis=0), SIGMA_FLOOR)
    np.testing.assert_allclose(stats.std, expected, rtol=1e-10)
    assert stats.std[2] == SIGMA_FLOOR  # a dimension that barely varies is floored
    again = ObsStats.from_dict(3, stats.as_dict())
    np.testing.assert_array_equal(again.mean, stats.mean)
    np.testing.assert_array_equal(again.std, stats.std)
    space = stats.space(spec(0))
    np.testing.assert_array_equal(space.mu, stats.mean)

"""The ensemble (infrastructure/ensemble.py): shapes, batched members, the
bootstraps, beta-NLL training, the bounded log-variance, elites, the
deterministic single network, and checkpoints of the ensemble."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from genesis_fp16.training import registry
from genesis_fp16.training.checkpoint import CheckpointError
from genesis_fp16.training.guarded import UNGUARDED
from infrastructure.dynamics import DynamicsMLP
from infrastructure.ensemble import EnsembleDynamics, batch_rows, bootstrap, ensemble_loss, member_losses
from infrastructure.world_model import WorldModel
from tests.test_world_model import _linear_trajs

pytestmark = pytest.mark.usefixtures("one_thread")


def _model(**kwargs) -> EnsembleDynamics:
    torch.manual_seed(0)
    return EnsembleDynamics(3, 2, **{"ensemble": 4, "hidden": 16, "layers": 2, **kwargs})


@pytest.mark.parametrize(
    "probabilistic, done_head, width", [(True, False, 8), (True, True, 9), (False, False, 4), (False, True, 5)]
)
def test_shapes(probabilistic, done_head, width):
    model = _model(probabilistic=probabilistic, done_head=done_head)
    raw = model(torch.randn(4, 7, 5))
    assert raw.shape == (4, 7, width)  # (delta obs 3 + reward 1) x (mean, logvar) [+ done logit]
    mean, logvar, done = model.heads(raw)
    assert mean.shape == (4, 7, 4)
    assert (logvar is not None and logvar.shape == (4, 7, 4)) == probabilistic
    assert (done is not None and done.shape == (4, 7)) == done_head
    assert [tuple(layer.weight.shape) for layer in model.hidden_layers] == [(4, 5, 16), (4, 16, 16)]
    assert model.hidden_layers[0].bias.shape == (4, 1, 16)
    next_obs, reward = model.predict_next(torch.randn(6, 3), torch.randn(6, 2))
    assert next_obs.shape == (6, 3) and reward.shape == (6,)


def test_batched_forward_equals_a_loop_over_members():
    model = _model(layers=3)
    x = torch.randn(4, 11, 5)
    batched = model(x)
    for m in range(4):
        h = x[m]
        for layer in model.hidden_layers:
            h = F.silu(h @ layer.weight[m] + layer.bias[m])
        torch.testing.assert_close(batched[m], h @ model.head.weight[m] + model.head.bias[m])
    # the rollouts' subset of members (the elites) runs the same weights
    subset = torch.tensor([2, 0])
    from infrastructure.ensemble import run_layers

    torch.testing.assert_close(run_layers(x[[2, 0]], model.layer_weights(subset)), batched[[2, 0]])


def test_bootstraps_differ_per_member_and_are_seeded():
    boot = bootstrap(500, 3, torch.Generator().manual_seed(7))
    again = bootstrap(500, 3, torch.Generator().manual_seed(7))
    assert boot.shape == (3, 500) and torch.equal(boot, again)
    assert not torch.equal(boot[0], boot[1]) and not torch.equal(boot[1], boot[2])
    # with replacement: about 1 - 1/e of the rows appear in each bootstrap
    assert all(250 < len(torch.unique(b)) < 380 for b in boot)
    rows = batch_rows(boot, 500, 3, 64, torch.Generator().manual_seed(1))
    assert rows.shape == (3, 64)
    assert all(
        set(rows[m].tolist()) <= set(boot[m].tolist()) for m in range(3)
    )  # each member's batch from its own bootstrap
    assert bootstrap(500, 1, torch.Generator()) is None  # one network: the data as it is
    assert batch_rows(None, 10, 1, 64, torch.Generator()).shape == (1, 10)


def test_nll_training_lowers_the_nll_and_learns_where_the_noise_is():
    """A toy function with noise that grows with |o|: training lowers the
    NLL, and the learned variance is larger where the noise is."""
    gen = torch.Generator().manual_seed(0)
    o, a = torch.rand(2000, 1, generator=gen) * 2 - 1, torch.rand(2000, 1, generator=gen) * 2 - 1
    noise = (0.02 + 0.5 * o.abs()) * torch.randn(2000, 1, generator=gen)
    x, y = torch.cat([o, a], 1), torch.cat([torch.sin(3 * o) + noise, a], 1)
    torch.manual_seed(0)
    model = EnsembleDynamics(1, 1, ensemble=3, hidden=32, layers=2)
    model.fit_normaliser(x, y)
    xn, yn = model.normalise_x(x), model.normalise_y(y)
    trainer = registry.create_trainer("fp32", model, torch.optim.Adam(model.parameters(), lr=3e-3))
    whole = (xn.expand(3, -1, -1), yn.expand(3, -1, -1))
    with torch.no_grad():
        before = float(ensemble_loss(model, whole))
    boot = bootstrap(2000, 3, gen)
    for _ in range(400):
        rows = batch_rows(boot, 2000, 3, 128, gen)
        trainer.backward_and_step(trainer.training_step((xn[rows], yn[rows]), ensemble_loss))
    with torch.no_grad():
        assert float(ensemble_loss(model, whole)) < before - 1.0
    probe = model.normalise_x(torch.tensor([[0.0, 0.0], [0.95, 0.0], [-0.95, 0.0]]))
    _, logvar, _ = model.heads(model(probe.expand(3, -1, -1)))
    assert (logvar[:, 1:, 0] > logvar[:, :1, 0] + 1.0).all()  # noisier at |o| = 0.95 than at 0, for every member


def test_the_log_variance_stays_within_its_learned_bounds():
    model = _model()
    raw = torch.zeros(4, 3, 8)
    raw[..., 4:] = torch.tensor([1e4, -1e4, 0.0, 3.0])  # the logvar outputs, far out both ways
    _, logvar, _ = model.heads(raw)
    # soft bounds: past max_logvar by at most log(1 + exp(-(max - min))), 3e-5 here
    assert (logvar <= model.max_logvar + 1e-4).all() and (logvar >= model.min_logvar).all()
    assert (
        float(logvar[..., 0].detach().min()) > 0.49 and float(logvar[..., 1].detach().max()) < -9.99
    )  # the bounds are reached
    assert torch.isfinite(logvar).all()
    loss = ensemble_loss(model, (torch.zeros(4, 3, 5), torch.zeros(4, 3, 4)))
    loss.backward()
    assert model.max_logvar.grad is not None and model.min_logvar.grad is not None  # the bounds are learned


def test_elites_are_the_members_with_the_lowest_validation_loss():
    model = _model(ensemble=5, elites=3)
    model.set_elites(torch.tensor([3.0, 1.0, float("nan"), 2.0, 0.5]))
    assert model.elites == [4, 1, 3]  # best first; a NaN loss ranks last
    with pytest.raises(ValueError, match=r"elites=6: at most ensemble=5"):
        EnsembleDynamics(3, 1, ensemble=5, elites=6)
    with pytest.raises(ValueError, match=r"ensemble=0: expected an integer of at least 1.*hidden=0"):
        EnsembleDynamics(3, 1, ensemble=0, hidden=0)


async def test_train_chooses_elites_by_validation(tmp_path):
    wm = WorldModel(
        3, 1, precision="fp32", guard=UNGUARDED, ensemble=4, elites=2, hidden=16, seed=0, checkpoint_dir=tmp_path
    )
    report = await wm.train(150, trajectories=_linear_trajs(4, 60), save=False)
    losses = report.member_val_loss
    assert len(losses) == 4 and len(set(losses)) == 4  # each member its own bootstrap and initialisation: its own loss
    assert report.elites == sorted(range(4), key=lambda m: losses[m])[:2] == wm.model.elites
    assert report.device == "cpu"
    # the reported validation loss is the mean over all members (model and FP32 reference alike)
    assert report.val_loss == pytest.approx(float(np.mean(losses)), rel=1e-5)


async def test_a_single_deterministic_network_still_trains():
    wm = WorldModel(3, 1, precision="fp32", guard=UNGUARDED, ensemble=1, probabilistic=False, hidden=64, seed=0)
    assert not any(name.endswith("logvar") for name, _ in wm.model.named_parameters())
    report = await wm.train(400, trajectories=_linear_trajs(), save=False)
    assert report.val_loss < 0.02 and report.elites == [0]
    start = np.zeros((3, 3), np.float32)
    a, b = [await wm.rollouts(lambda obs: torch.zeros(len(obs), 1), start, 10, seed=seed) for seed in (0, 1)]
    assert len(a.transitions) == 30 and a.stats.cut == 0  # one network cannot disagree with itself
    assert torch.equal(a.transitions.next_obs, b.transitions.next_obs)  # deterministic: no draw changes anything


async def test_checkpoint_round_trip_of_the_ensemble(tmp_path):
    trajs = _linear_trajs(3, 50)
    wm = WorldModel(
        3, 1, precision="fp32", guard=UNGUARDED, ensemble=3, elites=2, hidden=16, checkpoint_dir=tmp_path, device="cpu"
    )
    await wm.train(60, trajectories=trajs)
    other = WorldModel(
        3, 1, precision="fp32", guard=UNGUARDED, ensemble=3, elites=2, hidden=16, checkpoint_dir=tmp_path, seed=9
    )
    other.load()
    assert other.trained and other.model.elites == wm.model.elites
    for name in ("reward_low", "reward_high", "x_mean", "y_std", "member_val_loss"):
        torch.testing.assert_close(getattr(other.model, name), getattr(wm.model, name), equal_nan=True)
    obs, act = torch.tensor(trajs[0].obs), torch.tensor(trajs[0].action)
    torch.testing.assert_close(other.predict_sync(obs, act)[0], wm.predict_sync(obs, act)[0])


def _untouched(wm: WorldModel, before: dict[str, torch.Tensor]) -> bool:
    now = wm.model.state_dict()
    return (
        not wm.trained
        and before.keys() == now.keys()
        and all(torch.equal(before[k].nan_to_num(7.0), now[k].nan_to_num(7.0)) for k in now)
    )


async def test_an_ensemble_of_another_size_is_refused(tmp_path):
    wm = WorldModel(3, 1, precision="fp32", guard=UNGUARDED, ensemble=3, hidden=16, checkpoint_dir=tmp_path)
    await wm.train(20, trajectories=_linear_trajs(3, 30))
    other = WorldModel(3, 1, precision="fp32", guard=UNGUARDED, ensemble=2, hidden=16, checkpoint_dir=tmp_path)
    before = {k: v.clone() for k, v in other.model.state_dict().items()}
    with pytest.raises(
        CheckpointError, match=r"extra.architecture: saved from a world model with ensemble=3.*this one has ensemble=2"
    ):
        other.load()
    assert _untouched(other, before)


def test_an_old_single_network_checkpoint_is_refused_clearly(tmp_path):
    """A checkpoint of the DynamicsMLP of earlier versions (its own trainer,
    the extra fields it wrote) into an ensemble: one clear error, nothing changed."""
    old = DynamicsMLP(3, 1, 64)
    trainer = registry.create_trainer("fp32", old, torch.optim.Adam(old.parameters()))
    path = trainer.save_checkpoint(tmp_path / "world_model.pt", extra={"trained": True, "agent": "world_model"})
    wm = WorldModel(3, 1, precision="fp32", guard=UNGUARDED, checkpoint_dir=tmp_path)
    before = {k: v.clone() for k, v in wm.model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"single-network world model \(DynamicsMLP\).*train this model afresh"):
        wm.load(path)
    assert _untouched(wm, before) and not wm.optimizer.state


def test_member_losses_are_per_member():
    model = _model()
    x, y = torch.randn(9, 5), torch.randn(9, 4)
    losses = member_losses(model, x, y)
    assert losses.shape == (4,)
    mean, _, _ = model.heads(model(x.expand(4, -1, -1)))
    torch.testing.assert_close(losses[1], ((mean[1] - y) ** 2).mean())

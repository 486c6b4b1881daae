"""A probabilistic ensemble of dynamics networks, as PETS builds it (Chua et
al. 2018; mbrl-lib's ``GaussianMLP`` is the reference for the shapes and the
soft-bounded log-variance).

E members are held as batched weights: each layer is a weight ``[E, in, out]``
and a bias ``[E, 1, out]``, applied with one ``torch.baddbmm`` to inputs
``[E, B, in]``, so the members train and predict together, never in a Python
loop. Each member has SiLU hidden layers and a head that predicts, in the
normaliser's units, the mean of the next-observation delta and the reward,
with a Gaussian log-variance (``probabilistic``, trained by the Gaussian
negative log-likelihood) or without one (trained by squared error), and a
termination logit where the task has a done head (binary cross-entropy, as
before). ``ensemble=1`` without the Gaussian head is the single deterministic
network of earlier versions, kept for comparison.

The normaliser, the reward range seen in the training data (the model's
rollouts clip rewards into it, `infrastructure.model_env`) and the elite
members (the best by validation loss; what rollouts sample) are buffers, so
every checkpoint carries them.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Optional

import torch
from torch import nn
from torch.nn import functional as F

from genesis_fp16.training.checkpoint import CheckpointError
from genesis_fp16.base.seeds import torch_generator

from .dynamics import features

Weights = list[tuple[torch.Tensor, torch.Tensor]]
"""One ``(weight [M, in, out], bias [M, 1, out])`` per layer, for M members."""

NLL_BETA = 0.5
"""beta-NLL (Seitzer et al. 2022, "On the Pitfalls of Heteroscedastic
Uncertainty Estimation"): each point's Gaussian NLL is weighted by its
predicted variance to the power beta (held constant in the gradient). Plain
NLL (beta 0) lets a point with a large predicted variance stop pulling on the
mean: on the tests' linear system it fitted the reward 6x worse than beta 0.5
after 600 steps (mean absolute error 0.47 vs 0.08); the variances it learns
have the same optimum."""
LOGVAR_PENALTY = 0.01
"""The weight of ``max_logvar.sum() - min_logvar.sum()`` in the loss (mbrl-lib's): it keeps the learned bounds tight."""


@dataclass(frozen=True)
class EnsembleSpec:
    """The shape of an ensemble, as its checkpoints record it: ``ensemble``
    members (``elites`` of them used by rollouts and prediction), ``layers`` hidden layers
    of ``hidden`` units, a Gaussian head or not, a done head or not."""

    ensemble: int
    elites: int
    hidden: int
    layers: int
    probabilistic: bool
    done_head: bool

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.as_dict().items())


def check_spec(ensemble: int, elites: Optional[int], hidden: int, layers: int) -> int:
    """Refuse sizes a network cannot have; returns the number of elites (``None``: every member)."""
    problems = []

    def count(name: str, value: object, least: int, example: str) -> None:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
            problems.append(f"{name}={value!r}: expected an integer of at least {least} ({example})")

    count("ensemble", ensemble, 1, "the number of members, e.g. 5; 1 for a single network")
    count("hidden", hidden, 1, "units per hidden layer, e.g. 64")
    count("layers", layers, 1, "hidden layers per member, e.g. 2")
    if elites is not None:
        count("elites", elites, 1, "the best members rollouts and prediction use; None for every member")
        if not problems and elites > ensemble:
            problems.append(f"elites={elites}: at most ensemble={ensemble} (the best members among them)")
    if problems:
        raise ValueError("WorldModel: " + "; ".join(problems))
    return int(ensemble if elites is None else elites)


def check_architecture(payload: Mapping[str, Any], spec: EnsembleSpec, source: str) -> None:
    """Refuse, before anything changes, a checkpoint of another shape than
    ``spec``: one recorded with other sizes, or one of the single network
    (``DynamicsMLP``, keys ``net.*``) that the ensemble replaced."""
    extra = payload.get("extra")
    saved = extra.get("architecture") if isinstance(extra, Mapping) else None
    model = payload.get("model")
    if saved is None and isinstance(model, Mapping) and any(str(key).startswith("net.") for key in model):
        raise CheckpointError(
            f"{source}: a checkpoint of the single-network world model (DynamicsMLP) of earlier versions; its weights "
            "do not "
            f"fit this ensemble ({spec.describe()}) nor any other: train this model afresh with `await train()`"
        )
    if saved is not None and saved != spec.as_dict():
        described = ", ".join(f"{k}={v}" for k, v in saved.items()) if isinstance(saved, Mapping) else repr(saved)[:80]
        raise CheckpointError(
            f"{source}: field extra.architecture: saved from a world model with {described}; this one has "
            f"{spec.describe()}: build the WorldModel with the saved sizes to load it"
        )


class EnsembleLinear(nn.Module):
    """E linear layers as one: ``x [E, B, in] -> [E, B, out]`` by ``baddbmm``.
    Initialised as ``nn.Linear`` is (uniform within 1/sqrt(in)), member by member,
    from ``generator`` (None: torch's global generator, as ``nn.Linear``)."""

    def __init__(self, members: int, n_in: int, n_out: int, generator: Optional[torch.Generator] = None) -> None:
        super().__init__()
        bound = 1.0 / math.sqrt(n_in)
        self.weight = nn.Parameter(torch.empty(members, n_in, n_out).uniform_(-bound, bound, generator=generator))
        self.bias = nn.Parameter(torch.empty(members, 1, n_out).uniform_(-bound, bound, generator=generator))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias, x, self.weight)


def run_layers(x: torch.Tensor, weights: Weights) -> torch.Tensor:
    """The members' MLP on ``x [M, B, in]``: SiLU after every layer but the last."""
    for k, (weight, bias) in enumerate(weights):
        x = torch.baddbmm(bias, x, weight)
        if k < len(weights) - 1:
            x = F.silu(x)
    return x


class EnsembleDynamics(nn.Module):
    """E dynamics networks on normalised features (see the module's docstring).

    ``forward(x_norm [E, B, in])`` gives the head's raw output ``[E, B, out]``;
    `heads` splits it into the normalised mean, the soft-bounded log-variance
    (None without the Gaussian head) and the done logit (None without a done head).
    ``generator``: what the initial weights are drawn from (`EnsembleLinear`).
    """

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        *,
        ensemble: int = 5,
        elites: Optional[int] = None,
        hidden: int = 64,
        layers: int = 2,
        probabilistic: bool = True,
        done_head: bool = False,
        generator: Optional[torch.Generator] = None,
    ) -> None:
        super().__init__()
        n_elites = check_spec(ensemble, elites, hidden, layers)
        self.spec = EnsembleSpec(
            int(ensemble), n_elites, int(hidden), int(layers), bool(probabilistic), bool(done_head)
        )
        self.obs_dim, self.act_dim, self.done_head, self.probabilistic = (
            obs_dim,
            act_dim,
            bool(done_head),
            bool(probabilistic),
        )
        self.members = int(ensemble)
        n_in, self.n_gauss = obs_dim + act_dim, obs_dim + 1  # delta obs and reward
        sizes = [n_in] + [int(hidden)] * int(layers)
        self.hidden_layers = nn.ModuleList(
            EnsembleLinear(self.members, a, b, generator) for a, b in zip(sizes[:-1], sizes[1:])
        )
        self.head = EnsembleLinear(
            self.members, sizes[-1], self.n_gauss * (2 if probabilistic else 1) + int(done_head), generator
        )
        if probabilistic:  # learned bounds of the log-variance, shared by the members (mbrl-lib's initial values)
            self.max_logvar = nn.Parameter(torch.full((1, 1, self.n_gauss), 0.5))
            self.min_logvar = nn.Parameter(torch.full((1, 1, self.n_gauss), -10.0))
        n_y = self.n_gauss + int(done_head)
        self.register_buffer("x_mean", torch.zeros(n_in))
        self.register_buffer("x_std", torch.ones(n_in))
        self.register_buffer("y_mean", torch.zeros(n_y))
        self.register_buffer("y_std", torch.ones(n_y))
        self.register_buffer("reward_low", torch.zeros(()))
        self.register_buffer("reward_high", torch.zeros(()))
        self.register_buffer("elite_index", torch.arange(n_elites))
        self.register_buffer("member_val_loss", torch.full((self.members,), float("inf")))  # inf: not measured yet

    # -- the normaliser and the data's range ------------------------------------------
    def fit_normaliser(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Fit the normaliser (and the reward range) to raw features ``x`` and targets ``y``."""
        with torch.no_grad():
            self.x_mean.copy_(x.mean(0))
            self.x_std.copy_(x.std(0).nan_to_num(1.0).clamp_min(1e-6))
            self.y_mean.copy_(y.mean(0))
            self.y_std.copy_(y.std(0).nan_to_num(1.0).clamp_min(1e-6))
            if self.done_head:  # the done logit is learned as is
                self.y_mean[-1], self.y_std[-1] = 0.0, 1.0
            reward = y[:, self.obs_dim]
            self.reward_low.copy_(reward.min())
            self.reward_high.copy_(reward.max())

    def normalise_x(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.x_mean) / self.x_std

    def normalise_y(self, y: torch.Tensor) -> torch.Tensor:
        return (y - self.y_mean) / self.y_std

    def observed_region(self, spread: float = 4.0) -> tuple[torch.Tensor, torch.Tensor]:
        """(low, high) per observation dimension: the normaliser's mean -/+
        ``spread`` standard deviations, where predictions rest on data."""
        mean, std = self.x_mean[: self.obs_dim].float(), self.x_std[: self.obs_dim].float()
        return mean - spread * std, mean + spread * std

    # -- the networks --------------------------------------------------------------
    def layer_weights(self, members: Optional[torch.Tensor] = None) -> Weights:
        """Every layer's ``(weight, bias)``, of all members or of ``members`` (an index tensor) only."""
        layers = [*self.hidden_layers, self.head]
        if members is None:
            return [(layer.weight, layer.bias) for layer in layers]
        return [(layer.weight.index_select(0, members), layer.bias.index_select(0, members)) for layer in layers]

    def forward(self, x_norm: torch.Tensor) -> torch.Tensor:
        return run_layers(x_norm, self.layer_weights())

    def heads(self, raw: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
        """``(mean, logvar, done_logit)`` of a raw output, in float32 and the
        normaliser's units. The log-variance is soft-bounded into the learned
        ``[min_logvar, max_logvar]`` (mbrl-lib's ``GaussianMLP``)."""
        raw = raw.float()
        n = self.n_gauss
        mean = raw[..., :n]
        done = raw[..., -1] if self.done_head else None
        if not self.probabilistic:
            return mean, None, done
        logvar = raw[..., n : 2 * n]
        logvar = self.max_logvar - F.softplus(self.max_logvar - logvar)
        logvar = self.min_logvar + F.softplus(logvar - self.min_logvar)
        return mean, logvar, done

    # -- prediction --------------------------------------------------------------------
    @property
    def elites(self) -> list[int]:
        """The members rollouts and prediction use, best first."""
        return [int(i) for i in self.elite_index]

    def set_elites(self, losses: torch.Tensor) -> None:
        """Keep each member's validation loss and choose the elites: the
        ``spec.elites`` lowest (a non-finite loss ranks last; ties by index)."""
        losses = losses.detach().float().to(self.member_val_loss.device)
        ranked = torch.where(torch.isfinite(losses), losses, torch.full_like(losses, float("inf")))
        order = torch.sort(ranked, stable=True).indices
        with torch.no_grad():
            self.member_val_loss.copy_(losses)
            self.elite_index.copy_(order[: self.spec.elites])

    def predict_next(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(next_obs, reward) for batches of raw observations and actions, in
        FP32: the mean of the elites' predicted means."""
        self.eval()
        with torch.no_grad():
            return self.mean_next(obs, action)

    def mean_next(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`predict_next` with gradients: differentiable in ``obs`` and ``action``
        (the refinement looks through the model, `agents.refine`)."""
        x = self.normalise_x(features(obs, action)).reshape(1, -1, self.obs_dim + self.act_dim)
        weights = self.layer_weights(self.elite_index)
        mean, _, _ = self.heads(run_layers(x.expand(len(self.elite_index), -1, -1), weights))
        out = (
            (mean * self.y_std[: self.n_gauss] + self.y_mean[: self.n_gauss])
            .mean(0)
            .reshape(*obs.shape[:-1], self.n_gauss)
        )
        return obs + out[..., : self.obs_dim], out[..., self.obs_dim]


def bootstrap(n: int, members: int, generator: torch.Generator) -> Optional[torch.Tensor]:
    """Each member's bootstrap of ``n`` training rows, ``[members, n]``
    indices drawn with replacement from ``generator`` (on the CPU); None for
    a single network, which trains on the data as it is."""
    return torch.randint(n, (members, n), generator=generator) if members > 1 else None


def batch_rows(
    boot: Optional[torch.Tensor], n: int, members: int, batch: int, generator: torch.Generator
) -> torch.Tensor:
    """The rows of one optimizer step, ``[members, min(batch, n)]``: each
    member's batch, drawn uniformly from its bootstrap (or from all ``n`` rows)."""
    idx = torch.randint(n, (members, min(batch, n)), generator=generator)
    return boot.gather(1, idx) if boot is not None else idx


def ensemble_loss(model: EnsembleDynamics, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The training loss of a batch ``x [E, B, in]``, ``y [E, B, out]``
    (normalised; one batch per member), averaged over the members and
    computed in float32 from the autocast outputs: the Gaussian negative
    log-likelihood (without its constant, weighted as `NLL_BETA` says) plus
    `LOGVAR_PENALTY` times the bounds' width, or the squared error for a
    deterministic head; with a done head, plus the binary cross-entropy of
    the termination logit."""
    x, y = batch
    mean, logvar, done = model.heads(model(x))
    n = model.n_gauss
    error = (mean - y[..., :n]) ** 2
    if logvar is None:
        loss = error.mean()
    else:
        nll = error * torch.exp(-logvar) + logvar
        loss = (nll * torch.exp(NLL_BETA * logvar.detach())).mean()
        loss = loss + LOGVAR_PENALTY * (model.max_logvar.sum() - model.min_logvar.sum())
    if done is not None:
        loss = loss + F.binary_cross_entropy_with_logits(done, y[..., -1])
    return loss


def member_losses(model: EnsembleDynamics, x_norm: torch.Tensor, y_norm: torch.Tensor) -> torch.Tensor:
    """Each member's validation loss ``[E]`` on normalised ``(x [N, in], y [N, out])``:
    the squared error of its normalised mean (plus the done head's cross-entropy)."""
    mean, _, done = model.heads(model(x_norm.unsqueeze(0).expand(model.members, -1, -1)))
    target = y_norm.unsqueeze(0)
    losses = ((mean - target[..., : model.n_gauss]) ** 2).mean(dim=(1, 2))
    if done is not None:
        bce = F.binary_cross_entropy_with_logits(done, target[..., -1].expand_as(done), reduction="none")
        losses = losses + bce.mean(dim=1)
    return losses


def sample_batch(model: EnsembleDynamics, batch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of ``model``'s workload for a measured ``auto``
    (`genesis_fp16.precision.measure`), before any data: a training step's shapes,
    ``(x [E, B, in], y [E, B, out])``, normalised data being near N(0, 1),
    drawn from a generator of its own (the run's streams are not touched);
    a done column of zeros."""
    g = torch_generator(0, "ensemble.auto_sample")
    n_out = model.n_gauss + int(model.done_head)
    x = torch.randn(model.members, batch, model.obs_dim + model.act_dim, generator=g)
    y = torch.randn(model.members, batch, n_out, generator=g)
    if model.done_head:
        y[..., -1] = 0.0
    return x.to(device), y.to(device)

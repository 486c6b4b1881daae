"""The critic's network and its pure pieces: the twin-Q MLP (`TwinQ`), the
TD3 target (`compute_targets`), the target-smoothing noise, the training
loss, and the checks of its inputs and checkpoints. `infrastructure.critic`
trains it.

Design:

* Both twins are ONE module (`EnsembleLinear` layers with 2 members, one
  ``baddbmm`` per layer), so `GuardedTraining` trains, checkpoints and rolls
  back one model.
* Inputs are normalised inside the module: observations by a normaliser
  fitted per training call, actions by the action box onto [-1, 1]. Outputs
  are in value units ``(Q - q_offset) / q_scale``, a value scale fitted per
  call from the rewards, so the network learns values near N(0, 1) whatever
  the task's reward scale. A refit keeps the function the network computes
  (the first layer and the head are rescaled exactly, as PopArt does for the
  head), so a trained critic and its lagged target stay what they were when
  the next call brings new statistics.
* The head runs in FP32 even under autocast: Q values of hundreds in BF16
  would be quantised to steps of ~1 (8 bits of mantissa), which is the size
  of the TD errors the critic learns from. The hidden layers, where the
  time goes, follow the trainer's precision.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional

import torch
from torch import nn
from torch.nn import functional as F

from genesis_fp16.training.checkpoint import CheckpointError, generator_state_problem

from .dynamics import NonFiniteDataError
from .ensemble import EnsembleLinear
from .transitions import Transitions

TWINS = 2
CONSTANT_STD = 1e-4
"""An observation dimension whose spread in a call's data is below this is
constant there: it is centred but not scaled (std 1), so that no refit
rescales weights by the ratio to a near-zero spread."""

TargetQ = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``(obs [N, obs_dim], act [N, act_dim]) -> [2, N]``: both twins' values, raw units."""


@dataclass(frozen=True)
class CriticSpec:
    """The shape of a critic as its checkpoints record it."""

    obs_dim: int
    act_dim: int
    hidden: int
    layers: int
    activation: str
    action_low: tuple[float, ...]
    action_high: tuple[float, ...]

    def as_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.as_dict().items())


ACTIVATIONS = {"silu": F.silu, "relu": F.relu}


def check_spec(
    obs_dim: int, act_dim: int, hidden: int, layers: int, activation: str, low: torch.Tensor, high: torch.Tensor
) -> None:
    """Refuse sizes and action boxes a critic cannot have, all problems in one `ValueError`."""
    problems = []
    for name, value, example in (
        ("obs_dim", obs_dim, "3 for Pendulum"),
        ("act_dim", act_dim, "1 for Pendulum"),
        ("hidden", hidden, "units per hidden layer, e.g. 64"),
        ("layers", layers, "hidden layers, e.g. 2"),
    ):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            problems.append(f"{name}={value!r}: expected a positive integer ({example})")
    if activation not in ACTIVATIONS:
        problems.append(f"activation={activation!r}: expected one of {sorted(ACTIVATIONS)}")
    if not problems:
        if low.shape != (act_dim,) or high.shape != (act_dim,):
            problems.append(
                f"action_low/action_high have shapes {tuple(low.shape)}/{tuple(high.shape)}; expected ({act_dim},) "
                "each (the env's action box, e.g. env.action_space.low/high)"
            )
        elif not (torch.isfinite(low).all() and torch.isfinite(high).all() and (low < high).all()):
            problems.append(
                f"action box low={low.tolist()}, high={high.tolist()}: expected finite bounds with low < high "
                "in every dimension"
            )
    if problems:
        raise ValueError("Critic: " + "; ".join(problems))


class TwinQ(nn.Module):
    """Two Q networks as one: ``forward(x_norm [N, in]) -> [2, N]`` in value
    units (see the module's docstring); `q` takes raw observations and
    actions and returns raw values. ``generator``: what the initial weights are drawn from (`EnsembleLinear`)."""

    def __init__(self, spec: CriticSpec, generator: Optional[torch.Generator] = None) -> None:
        super().__init__()
        self.spec = spec
        self.obs_dim, self.act_dim = spec.obs_dim, spec.act_dim
        self.act_fn = ACTIVATIONS[spec.activation]
        sizes = [spec.obs_dim + spec.act_dim] + [spec.hidden] * spec.layers
        self.hidden_layers = nn.ModuleList(
            EnsembleLinear(TWINS, a, b, generator) for a, b in zip(sizes[:-1], sizes[1:])
        )
        self.head = EnsembleLinear(TWINS, sizes[-1], 1, generator)
        low, high = torch.tensor(spec.action_low), torch.tensor(spec.action_high)
        self.register_buffer("act_mid", (high + low) / 2)
        self.register_buffer("act_half", (high - low) / 2)
        self.register_buffer("obs_mean", torch.zeros(spec.obs_dim))
        self.register_buffer("obs_std", torch.ones(spec.obs_dim))
        self.register_buffer("q_offset", torch.zeros(()))
        self.register_buffer("q_scale", torch.ones(()))
        self.register_buffer("fitted", torch.zeros((), dtype=torch.bool))

    def inputs(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        """The network's input ``[N, obs_dim + act_dim]`` for raw observations and actions."""
        return torch.cat(((obs - self.obs_mean) / self.obs_std, (act - self.act_mid) / self.act_half), dim=-1)

    def forward(self, x_norm: torch.Tensor) -> torch.Tensor:
        h = x_norm.unsqueeze(0).expand(TWINS, -1, -1)
        for layer in self.hidden_layers:
            h = self.act_fn(layer(h))
        head = self.head
        with torch.autocast(h.device.type, enabled=False):  # the values in FP32 (module docstring)
            out = torch.baddbmm(head.bias, h.to(head.weight.dtype), head.weight)
        return out.squeeze(-1).float()

    def q(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        """Both twins' values ``[2, N]`` in raw units."""
        return self(self.inputs(obs, act)) * self.q_scale + self.q_offset

    @torch.no_grad()
    def refit(
        self, obs_mean: torch.Tensor, obs_std: torch.Tensor, q_offset: torch.Tensor, q_scale: torch.Tensor
    ) -> None:
        """Take new normaliser statistics. Once fitted, the first layer and
        the head are rescaled so that ``q`` computes the same function as
        before (exactly, up to FP32 rounding); the first fit just sets them."""
        if bool(self.fitted):
            first = self.hidden_layers[0]
            w_obs = first.weight[:, : self.obs_dim, :]  # [2, obs, hidden]
            shift = ((obs_mean - self.obs_mean) / self.obs_std).view(1, -1, 1)
            first.bias.add_((w_obs * shift).sum(dim=1, keepdim=True))
            w_obs.mul_((obs_std / self.obs_std).view(1, -1, 1))
            self.head.bias.mul_(self.q_scale).add_(self.q_offset - q_offset).div_(q_scale)
            self.head.weight.mul_(self.q_scale / q_scale)
        self.obs_mean.copy_(obs_mean)
        self.obs_std.copy_(obs_std)
        self.q_offset.copy_(q_offset)
        self.q_scale.copy_(q_scale)
        self.fitted.fill_(True)


def normaliser_stats(data: Transitions, gamma: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(obs_mean, obs_std, q_offset, q_scale)`` of a call's data. The value
    scale is the rewards' mean and spread times the effective horizon
    ``1 / (1 - gamma * (1 - terminal rate))``: 1 where every step ends the
    episode (Q = r), 1 / (1 - gamma) where none does."""
    obs = torch.cat((data.obs, data.next_obs))
    mean, std = obs.mean(0), obs.std(0).nan_to_num(1.0)
    std = torch.where(std < CONSTANT_STD, torch.ones_like(std), std)
    horizon = 1.0 / (1.0 - gamma * (1.0 - data.terminal.mean()))
    rew_std = data.rew.std().nan_to_num(0.0) if len(data.rew) > 1 else torch.zeros(())
    return mean, std, data.rew.mean() * horizon, (rew_std * horizon).clamp_min(1e-3)


def smoothing_noise(
    n: int, half_range: torch.Tensor, target_noise: float, noise_clip: float, generator: torch.Generator
) -> torch.Tensor:
    """TD3's target policy smoothing, ``[n, act_dim]`` on the CPU:
    ``clip(N(0, target_noise), -noise_clip, noise_clip)`` in fractions of the
    half action range, times ``half_range``; drawn from ``generator``."""
    draw = torch.randn((n, len(half_range)), generator=generator) * target_noise
    return draw.clamp(-noise_clip, noise_clip) * half_range.cpu()


@torch.no_grad()
def compute_targets(
    rew: torch.Tensor,
    terminal: torch.Tensor,
    next_obs: torch.Tensor,
    next_act: torch.Tensor,
    noise: torch.Tensor,
    target_q: TargetQ,
    *,
    gamma: float,
    low: torch.Tensor,
    high: torch.Tensor,
) -> torch.Tensor:
    """The TD3 target in FP32, ``[N]``:
    ``y = r + gamma * (1 - terminal) * min_i Q'_i(s', clip(pi(s') + noise, low, high))``,
    ``next_act`` being ``pi(s')`` and ``noise`` the smoothing noise (`smoothing_noise`)."""
    act = torch.maximum(torch.minimum(next_act.float() + noise, high), low)
    q_next = target_q(next_obs.float(), act).float().min(dim=0).values
    return rew.float() + gamma * (1.0 - terminal.float()) * q_next


def td_loss(model: TwinQ, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """``mse(q1, y) + mse(q2, y)`` of a batch ``(x_norm [B, in], y_norm [B])``, in value units."""
    x, y = batch
    return ((model(x) - y.unsqueeze(0)) ** 2).mean(dim=1).sum()


def check_transitions(data: Transitions, obs_dim: int, act_dim: int) -> None:
    """Refuse, before anything is trained, transitions that do not fit (a
    `ValueError` naming the field and sizes) or hold NaN or inf (a
    `NonFiniteDataError` naming the field and the first bad row)."""
    if not isinstance(data, Transitions):
        raise TypeError(
            f"Critic.train: data is a {type(data).__name__}; expected infrastructure.transitions.Transitions"
        )
    want = {"obs": (obs_dim,), "act": (act_dim,), "rew": (), "next_obs": (obs_dim,), "terminal": ()}
    bad = [
        f"{k} has shape {tuple(getattr(data, k).shape)}, expected (N, {', '.join(map(str, v))})".replace(", )", ")")
        for k, v in want.items()
        if tuple(getattr(data, k).shape[1:]) != v
    ]
    if bad:
        raise ValueError(
            f"Critic.train: transitions do not fit a critic built for obs_dim={obs_dim}, act_dim={act_dim}: "
            + "; ".join(bad)
            + "; build the Critic with this env's sizes"
        )
    if len(data) < 2:
        raise ValueError(
            f"Critic.train: {len(data)} transition(s); at least 2 are needed (one to train on, one to validate)"
        )
    for name in want:
        tensor = getattr(data, name)
        finite = torch.isfinite(tensor.reshape(len(data), -1)).all(dim=1)
        if not bool(finite.all()):
            row = int((~finite).nonzero()[0])
            raise NonFiniteDataError(
                f"Critic.train: transitions.{name} holds NaN or inf at row {row} "
                f"(of {len(data)}); drop those transitions before training; nothing was trained"
            )
    if not bool(((data.terminal == 0) | (data.terminal == 1)).all()):
        raise ValueError(
            "Critic.train: transitions.terminal holds values other than 0 and 1; expected 1.0 where the task "
            "itself ended the episode, 0.0 elsewhere (a time limit is 0)"
        )


def check_critic_payload(
    payload: Mapping[str, Any], spec: CriticSpec, target_keys: Mapping[str, torch.Size], source: str
) -> None:
    """Refuse, before anything changes, a checkpoint that is not of a critic
    of ``spec``'s shape: another model's (a world model's), other sizes or
    action box, or one without a usable target network or sampler state."""
    extra = payload.get("extra")
    saved = extra.get("critic") if isinstance(extra, Mapping) else None
    if saved is None:
        what = "a world model's" if isinstance(extra, Mapping) and "architecture" in extra else "not a critic's"
        raise CheckpointError(
            f"{source}: {what} checkpoint (no extra.critic); load a checkpoint that Critic.save() wrote"
        )
    if saved != spec.as_dict():
        described = ", ".join(f"{k}={v}" for k, v in saved.items()) if isinstance(saved, Mapping) else repr(saved)[:80]
        raise CheckpointError(
            f"{source}: field extra.critic: saved from a critic with {described}; this one has "
            f"{spec.describe()}: build the Critic with the saved sizes to load it"
        )
    target = extra.get("target")
    shapes = (
        {k: v.shape for k, v in target.items()}
        if isinstance(target, Mapping) and all(isinstance(v, torch.Tensor) for v in target.values())
        else None
    )
    if shapes != dict(target_keys):
        raise CheckpointError(f"{source}: field extra.target: not this critic's target network state")
    state = extra.get("sampler_state")
    problem = "missing" if state is None else generator_state_problem(state)
    if problem:
        raise CheckpointError(f"{source}: field extra.sampler_state: {problem}")

"""Benchmark workloads: world-model-shaped MLPs at three sizes and an LSTM
outcome model, each with a fixed synthetic task.

The task is a teacher network with a different shape from the student: the
student learns to imitate it, so the validation loss keeps falling during the
fixed number of steps (no noise floor that would hide a precision effect).
Inputs, targets and the student's initial weights depend only on the seed, so
every precision trains the same network on the same batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn
from torch.nn import functional as F

from genesis_fp16.base.seeds import init_parameters, torch_generator

OBS_DIM = 24
ACT_DIM = 8


class WorldModelMLP(nn.Module):
    """(observation, action) -> (next-observation delta, reward), as the world
    model of an agent predicts them."""

    def __init__(self, hidden: int, depth: int = 3, obs_dim: int = OBS_DIM, act_dim: int = ACT_DIM) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(obs_dim + act_dim, hidden), nn.GELU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(hidden, hidden), nn.GELU()]
        layers.append(nn.Linear(hidden, obs_dim + 1))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class OutcomeLSTM(nn.Module):
    """A trajectory (sequence of per-step features) -> its outcome (a scalar
    return): the recurrent case of the bench, beside the MLP sizes."""

    def __init__(self, features: int, hidden: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out[:, -1]).squeeze(-1)


@dataclass(frozen=True)
class SizeSpec:
    """One benchmark workload.

    name: what ``--sizes`` calls it. kind: ``mlp`` or ``lstm``.
    hidden / batch: width and samples per step. seq_len / features: LSTM only.
    quality_steps: optimizer steps before the validation loss is read (same
    for every precision). lr: Adam learning rate.
    """

    name: str
    kind: str
    hidden: int
    batch: int
    quality_steps: int
    lr: float = 1e-3
    seq_len: int = 0
    features: int = 0

    @property
    def label(self) -> str:
        if self.kind == "lstm":
            return f"LSTM h{self.hidden} b{self.batch} T{self.seq_len}"
        return f"MLP h{self.hidden} b{self.batch}"


SIZES: dict[str, SizeSpec] = {
    # S: a step is well under a millisecond of math: Python and dispatch dominate.
    "S": SizeSpec("S", "mlp", hidden=64, batch=64, quality_steps=300),
    "M": SizeSpec("M", "mlp", hidden=256, batch=256, quality_steps=200),
    # L: matmul-bound on a CPU (hidden 1024, batch 1024), where reduced precision pays there.
    "L": SizeSpec("L", "mlp", hidden=1024, batch=1024, quality_steps=60, lr=3e-4),
    # XL: compute-bound on a GPU too (about 0.83 TFLOP per step; L is 13 GFLOP, which
    # an H200 runs in launch overhead). Seconds per step on a CPU: not a CPU default.
    # lr: L's lr x 1024 / 4096, so Adam moves each layer's output about as much as at L.
    "XL": SizeSpec("XL", "mlp", hidden=4096, batch=4096, quality_steps=40, lr=7.5e-5),
    "LSTM": SizeSpec("LSTM", "lstm", hidden=64, batch=128, quality_steps=60, seq_len=16, features=32),
}

QUICK_STEPS = {"S": 50, "M": 40, "L": 10, "XL": 5, "LSTM": 10}

# the sizes a run measures when --sizes is not given; XL only where it takes
# seconds, not minutes (on a CPU it is one step every few seconds: ask for it by name)
DEFAULT_SIZES = {"cpu": ("S", "M", "L", "LSTM"), "cuda": ("S", "M", "L", "XL", "LSTM")}
SLOW_ON_CPU = ("XL",)


def default_sizes(device_type: str) -> list[SizeSpec]:
    """The sizes a run on a ``device_type`` (``cpu``, ``cuda``) measures by default."""
    return [SIZES[name] for name in DEFAULT_SIZES.get(device_type, DEFAULT_SIZES["cpu"])]


def parse_sizes(text: str) -> list[SizeSpec]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise ValueError(f"--sizes {text!r}: expected a comma-separated list of {', '.join(SIZES)}")
    lookup = {name.upper(): spec for name, spec in SIZES.items()}
    unknown = [n for n in names if n.upper() not in lookup]
    if unknown:
        raise ValueError(f"--sizes: unknown size(s) {', '.join(unknown)}; expected some of {', '.join(SIZES)}")
    seen: dict[str, SizeSpec] = {}
    for n in names:
        seen.setdefault(lookup[n.upper()].name, lookup[n.upper()])
    return list(seen.values())


@dataclass
class Task:
    """Fixed training batches, a validation set and the loss."""

    spec: SizeSpec
    train: list[tuple[torch.Tensor, torch.Tensor]]
    val: tuple[torch.Tensor, torch.Tensor]
    loss_fn: Callable[[nn.Module, Any], torch.Tensor]

    def make_model(self, seed: int, device: torch.device) -> nn.Module:
        """The student at its initial weights: identical for every call with the same seed (drawn from
        its own generator: torch's global one is left as it was)."""
        if self.spec.kind == "lstm":
            model: nn.Module = OutcomeLSTM(self.spec.features, self.spec.hidden)
        else:
            model = WorldModelMLP(self.spec.hidden)
        return init_parameters(model, torch_generator(seed, "bench.student_init")).to(device)


def _mse(model: nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    # loss in float32 under autocast, as the AMP docs advise
    return F.mse_loss(model(x).float(), y)


def make_task(spec: SizeSpec, seed: int, device: torch.device, n_train_batches: int = 8, n_val: int = 2048) -> Task:
    gen = torch_generator(seed, "bench.task")
    with torch.no_grad():
        if spec.kind == "lstm":
            teacher = _lstm_teacher(spec, gen)
            make_x = lambda n: torch.randn(n, spec.seq_len, spec.features, generator=gen)  # noqa: E731
        else:
            teacher = _mlp_teacher(gen)
            make_x = lambda n: torch.randn(n, OBS_DIM + ACT_DIM, generator=gen)  # noqa: E731
        train = []
        for _ in range(n_train_batches):
            x = make_x(spec.batch)
            train.append((x.to(device), teacher(x).to(device)))
        xv = make_x(n_val)
        val = (xv.to(device), teacher(xv).to(device))
    return Task(spec, train, val, _mse)


def _mlp_teacher(gen: torch.Generator) -> Callable[[torch.Tensor], torch.Tensor]:
    w1 = torch.randn(OBS_DIM + ACT_DIM, 48, generator=gen) / (OBS_DIM + ACT_DIM) ** 0.5
    w2 = torch.randn(48, OBS_DIM + 1, generator=gen) / 48**0.5
    return lambda x: torch.tanh(x @ w1) @ w2


def _lstm_teacher(spec: SizeSpec, gen: torch.Generator) -> Callable[[torch.Tensor], torch.Tensor]:
    # outcome = a discounted sum of a nonlinear per-step reward
    w = torch.randn(spec.features, 16, generator=gen) / spec.features**0.5
    v = torch.randn(16, generator=gen) / 4.0
    discount = 0.9 ** torch.arange(spec.seq_len - 1, -1, -1, dtype=torch.float32)
    return lambda x: (torch.tanh(x @ w) @ v * discount).sum(-1)


@torch.no_grad()
def validation_loss(model: nn.Module, task: Task) -> float:
    """Validation loss in float32 (no autocast): the quality of the trained weights."""
    was_training = model.training
    model.eval()
    try:
        return float(task.loss_fn(model, task.val))
    finally:
        model.train(was_training)

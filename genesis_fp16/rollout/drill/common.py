"""What every drill scenario shares: its result, the tiny model, its data."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from genesis_fp16.rollout.ledger import RolloutLedger
from genesis_fp16.base.seeds import init_parameters, torch_generator
from genesis_fp16.base.settings import Settings

REDUCED = "fp16" if torch.cuda.is_available() else "bf16"


class DrillScratch(Protocol):
    """What a scenario needs of the drill (`Drill` is one): its scratch
    settings, ledger and directory, and the training batch."""

    state_dir: Path
    settings: Settings
    ledger: RolloutLedger
    batch: tuple[torch.Tensor, torch.Tensor]


@dataclass
class ScenarioResult:
    name: str
    passed: bool
    detail: str
    seconds: float
    checks: dict[str, Any] = field(default_factory=dict)


class TinyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def mse(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return ((model(x).float() - y) ** 2).mean()  # loss in FP32, as the AMP docs advise


def drill_data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch_generator(seed, "drill.data")
    x = torch.randn(64, 8, generator=g)
    y = (x[:, :1] * 0.5 - x[:, 1:2] * 0.25).tanh()
    return x, y


def model_and_optimizer(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = init_parameters(TinyModel(), torch_generator(seed, "drill.init"))  # torch's global generator untouched
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)

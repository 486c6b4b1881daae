"""Model-free baselines for the evolution loop's table (issue 26): tuned
CMA-ES on one-episode scores (with and without observation normalisation),
ARS V2-t, and Stable-Baselines3 SAC. Each returns a report in the shape of
the loop's (``benchmarks.baselines.common``)."""

from .ars import HYPERPARAMETERS as ARS_HYPERPARAMETERS
from .ars import ARSHyper, ars_update, run_ars
from .cma_tuned import run_cma_tuned
from .common import BaselineConfig, Clock, TargetWatch, host, target_states
from .normalization import RunningStats, fold
from .sac import run_sac, sac_steps

__all__ = [
    "ARS_HYPERPARAMETERS",
    "ARSHyper",
    "BaselineConfig",
    "Clock",
    "RunningStats",
    "TargetWatch",
    "ars_update",
    "fold",
    "host",
    "run_ars",
    "run_cma_tuned",
    "run_sac",
    "sac_steps",
    "target_states",
]

"""What the evolution loop reports: one record per committed generation, and
the run's report (the CLI's table and ``--json``)."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Optional, Sequence

from .evaluation import Evaluation
from .evolve_config import Candidate, EvolveConfig

if TYPE_CHECKING:
    from infrastructure.world_model import TrainReport

# the part of a finished run's report its manifest keeps
SUMMARY_KEYS = ("real_episodes", "target_reached", "episodes_to_target", "train_return", "heldout_return", "stop_reason")


def generation_record(
    generation: int, *, real_episodes: int, env_steps: int, best: Optional[Candidate], evaluated: Sequence[Candidate], proposals: int,
    wm_report: Optional["TrainReport"], precision: str, elapsed_s: float,
) -> dict[str, Any]:
    return {
        "generation": generation,
        "real_episodes": real_episodes,
        "env_steps": env_steps,  # of the episodes that finished so far
        "best_return": best.real_return if best else None,
        "best_full": bool(best.full) if best else False,
        "best_episodes": best.real_episodes if best else 0,  # 1 for a probe, the training start states for a full evaluation
        "evaluated": [{"id": c.id, "operator": c.operator, "imagined": c.imagined, "real_return": c.real_return} for c in evaluated],
        "proposals": proposals,
        "wm_val_loss": wm_report.val_loss if wm_report else None,
        "wm_train_loss": wm_report.train_loss if wm_report else None,
        "wm_wall_s": wm_report.wall_s if wm_report else None,
        "wm_rolled_back": wm_report.rolled_back if wm_report else False,
        "wm_rollback_reason": wm_report.rollback_reason if wm_report else None,
        "fp32_val_loss": wm_report.fp32_val_loss if wm_report else None,
        "precision": wm_report.precision if wm_report else precision,
        "elapsed_s": elapsed_s,
    }


def run_report(
    cfg: EvolveConfig, *, best: Optional[Candidate], heldout: Optional[Evaluation], heldout_episodes: int, real_episodes: int,
    env_steps: int, failures: list[dict[str, Any]],
    reached_at: Optional[int], precision: str, wall_s: float, stop_reason: str, generations: list[dict[str, Any]],
    run_id: str, replay_db: str, run_manifest: str, resumed_from: Optional[dict[str, Any]], train_start_states: int,
) -> dict[str, Any]:
    report = {
        "mode": "full" if cfg.use_world_model else "no_world_model",
        "env": cfg.env_id,
        "seed": cfg.seed,
        "budget": cfg.budget,
        "target": cfg.target,
        "real_episodes": real_episodes,
        "env_steps": env_steps,  # of the episodes that finished (a lost candidate's steps are not known)
        "episodes_to_target": reached_at,
        "target_reached": reached_at is not None,
        "train_return": best.real_return if best and best.full else None,
        "heldout_return": heldout.mean_return if heldout is not None else None,
        "heldout_episodes": heldout_episodes,
        "train_start_states": train_start_states,
        "best_candidate": {"id": best.id, "operator": best.operator, "params": [float(v) for v in best.params]} if best else None,
        "precision": precision,
        "wall_s": wall_s,
        "stop_reason": stop_reason,
        "generations": generations,
        "failed_candidates": failures,  # charged and skipped: {candidate, generation, episodes, error}
        "run_id": run_id,
        "replay_db": replay_db,
        "run_manifest": run_manifest,
        "resumed": resumed_from is not None,
        "resumed_from": resumed_from,
        "config": asdict(cfg),
    }
    report["stop_detail"] = stop_detail(report)
    return report


def return_set(full: bool, episodes: int, train_start_states: Optional[int] = None) -> str:
    """Which set a real return was measured on, in words: a probe is one
    episode on one start state; a full evaluation covers the training start states."""
    if not full:
        return f"probe: {episodes} episode on 1 start state" if episodes == 1 else f"probe: {episodes} episodes"
    return f"full: {train_start_states or episodes} training start states"


def stop_detail(report: dict[str, Any]) -> str:
    """Why the run stopped, in one sentence, from its report (``stop_reason``
    is the machine-readable word: ``target``, ``budget``, or ``failed``
    when every real evaluation failed)."""
    n_train = report["train_start_states"]
    if report["stop_reason"] == "failed":
        failures = report.get("failed_candidates") or []
        first = f"; the first error: {failures[0]['error']}" if failures else ""
        return (f"every candidate failed: {len(failures)} real evaluation(s), {report['real_episodes']} of {report['budget']} "
                f"real episodes charged, none gave a usable return{first}")
    if report["stop_reason"] == "target":
        reached = "-" if report["train_return"] is None else f"{report['train_return']:.1f}"
        return (f"target reached on the {n_train} training start states: mean return {reached} >= "
                f"{report['target']:g} after {report['episodes_to_target']} real episodes")
    return (f"budget spent: {report['real_episodes']} of {report['budget']} real episodes used, and another full evaluation "
            f"needs {n_train}; target {report['target']:g} not reached on the training start states")

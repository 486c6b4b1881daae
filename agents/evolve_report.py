"""What the evolution loop reports: one record per committed generation, and
the run's report (the CLI's table and ``--json``)."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Optional, Sequence

from .evaluation import Evaluation
from .evolve_config import Candidate, EvolveConfig
from .imagination_stats import run_summary

if TYPE_CHECKING:
    from infrastructure.world_model import TrainReport

# the part of a finished run's report its manifest keeps
SUMMARY_KEYS = ("real_episodes", "target_reached", "episodes_to_target", "train_return", "heldout_return", "stop_reason")


def generation_record(
    generation: int, *, real_episodes: int, env_steps: int, best: Optional[Candidate], evaluated: Sequence[Candidate], proposals: int,
    wm_report: Optional["TrainReport"], precision: str, elapsed_s: float, imagination: Optional[dict[str, Any]] = None,
    time: Optional[dict[str, float]] = None, confirmations: Sequence[dict[str, Any]] = (), probe: Optional[dict[str, Any]] = None,
    precision_decision: Optional[dict[str, Any]] = None,
) -> dict[str, Any]:
    """One committed generation. ``imagination``: the imagined-vs-real
    comparison of its candidates (`agents.imagination_stats`, with their
    ``records``), None when nothing was imagined; ``time``: its wall seconds
    per bucket (`agents.time_share`); ``confirmations``: the validation runs it tried;
    ``probe``: a probe generation's search (`agents.probe_search`), None in the others;
    ``precision``/``precision_decision``: what the world model in use trained in
    and why (`genesis_fp16.decision`): this generation's training's, else
    (no training this generation) the last training's that the caller passes."""
    return {
        "generation": generation,
        "real_episodes": real_episodes,
        "env_steps": env_steps,  # of the episodes that finished so far
        "best_return": best.real_return if best else None,
        "best_full": bool(best.full) if best else False,
        "best_episodes": best.real_episodes if best else 0,  # 1 for a probe, the training start states for a full evaluation
        "evaluated": [{"id": c.id, "operator": c.operator, "imagined": c.imagined, "real_return": c.real_return,
                       "episodes": c.real_episodes, "full": c.full} for c in evaluated],
        "proposals": proposals,
        "wm_val_loss": wm_report.val_loss if wm_report else None,
        "wm_train_loss": wm_report.train_loss if wm_report else None,
        "wm_wall_s": wm_report.wall_s if wm_report else None,
        "wm_rolled_back": wm_report.rolled_back if wm_report else False,
        "wm_rollback_reason": wm_report.rollback_reason if wm_report else None,
        "fp32_val_loss": wm_report.fp32_val_loss if wm_report else None,
        "precision": wm_report.precision if wm_report else precision,
        "precision_decision": wm_report.precision_decision if wm_report else precision_decision,
        "elapsed_s": elapsed_s,
        "imagination": imagination,
        "time": time,
        "confirmations": list(confirmations),
        "probe": probe,
    }


def run_report(
    cfg: EvolveConfig, *, best: Optional[Candidate], heldout: Optional[Evaluation], heldout_episodes: int, real_episodes: int,
    env_steps: int, failures: list[dict[str, Any]], confirmations: list[dict[str, Any]],
    reached_at: Optional[int], precision: str, wall_s: float, stop_reason: str, budget_exhausted: Optional[str], unconfirmed: Optional[str],
    precision_decision: Optional[dict[str, Any]] = None,
    generations: list[dict[str, Any]], run_id: str, replay_db: str, run_manifest: str, resumed_from: Optional[dict[str, Any]],
    train_start_states: int, validation_start_states: int, time_share: dict[str, Any],
) -> dict[str, Any]:
    """The run's report (docs/EVOLUTION.md lists its keys)."""
    report = {
        "mode": "full" if cfg.use_world_model else "no_world_model",
        "env": cfg.env_id,
        "seed": cfg.seed,
        "budget": cfg.budget,
        "budget_steps": cfg.budget_steps,
        "budget_exhausted": budget_exhausted,  # with stop_reason budget: "episodes" or "env_steps"
        "target": cfg.target,
        "real_episodes": real_episodes,
        "env_steps": env_steps,  # of the episodes that finished (a lost candidate's steps are not known)
        "episodes_to_target": reached_at,
        "target_reached": reached_at is not None,
        "train_return": best.real_return if best and best.full else None,
        "heldout_return": heldout.mean_return if heldout is not None else None,
        "heldout_episodes": heldout_episodes,
        "train_start_states": train_start_states,
        "validation_start_states": validation_start_states,
        "validation_return": best.validation_return if best else None,
        "confirmations": confirmations,  # each target met on the training start states, run on the validation ones
        "unconfirmed": unconfirmed,  # a candidate that met the target with no budget left to confirm it
        "imagination": run_summary(generations),
        "time_share": time_share,
        "best_candidate": {"id": best.id, "operator": best.operator, "params": [float(v) for v in best.params]} if best else None,
        "precision": precision,
        "precision_decision": precision_decision or last_training(generations)[1],  # of the world model's last training
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
    is the machine-readable word: ``target``, ``budget`` (``budget_exhausted``
    says which: ``episodes`` or ``env_steps``), or ``failed`` when every real
    evaluation failed)."""
    n_train = report["train_start_states"]
    if report["stop_reason"] == "failed":
        failures = report.get("failed_candidates") or []
        first = f"; the first error: {failures[0]['error']}" if failures else ""
        return (f"every candidate failed: {len(failures)} real evaluation(s), {report['real_episodes']} of {report['budget']} "
                f"real episodes charged, none gave a usable return{first}")
    if report["stop_reason"] == "target":
        reached = "-" if report["train_return"] is None else f"{report['train_return']:.1f}"
        confirmed = ""
        if report.get("validation_return") is not None:
            confirmed = f", confirmed on the {report['validation_start_states']} validation start states (mean {report['validation_return']:.1f}),"
        return (f"target reached on the {n_train} training start states: mean return {reached} >= "
                f"{report['target']:g}{confirmed} after {report['episodes_to_target']} real episodes")
    if report.get("budget_exhausted") == "env_steps":
        steps = report["config"]["episode_steps"]
        used = f"{report['env_steps']} of {report['budget_steps']} real env steps used ({report['real_episodes']} real episodes)"
        more = f"another full evaluation may take {n_train * steps} ({n_train} episodes of up to {steps} steps)"
    else:
        used = f"{report['real_episodes']} of {report['budget']} real episodes used"
        more = f"another full evaluation needs {n_train}"
    n_val = report.get("validation_start_states")
    if report.get("unconfirmed"):
        return (f"budget spent: {used}; {report['unconfirmed']} met the target {report['target']:g} on the training start states, "
                f"but the budget has no room to confirm it on the {n_val} validation start states")
    refuted = len(report.get("confirmations") or [])
    if refuted:
        return (f"budget spent: {used}, and {more}; target {report['target']:g} met on the training start states but not confirmed "
                f"on the {n_val} validation start states ({refuted} tries)")
    return f"budget spent: {used}, and {more}; target {report['target']:g} not reached on the training start states"


def report_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The rows of `genesis-fp16 evolve`'s final table: (metric, value)."""
    def fmt(value: Any, spec: str = ".1f") -> str:
        return "-" if value is None else format(value, spec)

    n_train, n_heldout = report["train_start_states"], report["heldout_episodes"]
    heldout = fmt(report["heldout_return"])
    if report["target_reached"] and report["heldout_return"] is not None and report["heldout_return"] < report["target"]:
        heldout += " (below the target, which is judged on the training and validation start states only)"
    steps_budget = f" of {report['budget_steps']}" if report.get("budget_steps") is not None else ""
    rows = [
        ("stopped", report["stop_detail"]),
        ("target reached", f"{report['target_reached']} (target {report['target']:g}: mean return on the {n_train} training start states)"),
        ("real episodes", f"{report['real_episodes']} of {report['budget']}"),
        ("real env steps", f"{report['env_steps']}{steps_budget}"),
        ("episodes to target", str(report["episodes_to_target"]) if report["episodes_to_target"] is not None else "-"),
        (f"best return, full ({n_train} training start states)", fmt(report["train_return"])),
    ]
    if report.get("validation_start_states"):
        rows.append((f"best return, validation ({report['validation_start_states']} validation start states)", fmt(report.get("validation_return"))))
    rows += [
        (f"best return, held-out ({n_heldout} held-out start states)", heldout),
        ("world-model precision", str(report["precision"]) + _decision_text(report.get("precision_decision"))),
        ("generations", str(len(report["generations"]))),
        ("wall time (s)", f"{report['wall_s']:.1f}"),
    ]
    imagination, share = report.get("imagination") or {}, report.get("time_share") or {}
    if imagination.get("candidates"):
        rows.append(("imagined vs real", f"Spearman {fmt(imagination['spearman'], '.2f')}, {fmt(imagination['calibration'], '.0%')} inside "
                     f"the imagined interval, median relative error {fmt(imagination['rel_error'], '.2f')} ({imagination['candidates']} candidates)"))
    if share.get("model_share") is not None:
        rows.append(("wall time in the model", f"{share['model_share']:.0%} (train {share['model_train']:.1f} s, imagine "
                     f"{share['imagine']:.1f} s, search {share['search']:.1f} s; real episodes {share['real_episodes']:.1f} s)"))
    failures = report.get("failed_candidates", [])
    if failures:
        charged = sum(f.get("episodes", 0) for f in failures)
        rows.append(("failed candidates", f"{len(failures)} (charged {charged} real episodes)"))
    for failure in failures:
        rows.append((f"skipped {failure['candidate']}", failure["error"]))
    if report.get("replay_db"):
        rows.append(("replay buffer", report["replay_db"]))
    if report.get("run_id"):
        rows.append(("run", report["run_id"]))
    if report.get("resumed"):
        origin = report["resumed_from"]
        rows.append(("resumed after", f"generation {origin['generation']}, {origin['real_episodes']} real episodes"))
    return rows


def _decision_text(decision: Optional[dict[str, Any]]) -> str:
    """`` (source: reason)`` of a precision decision, empty without one."""
    return f" ({decision['source']}: {decision['reason'].removeprefix('measured here: ')})" if decision else ""


def last_training(generations: Sequence[dict[str, Any]]) -> tuple[Optional[str], Optional[dict[str, Any]]]:
    """(precision, decision) of the last generation that trained the world
    model (resumed stretches included: the records come from the manifest);
    (None, None) before any."""
    for record in reversed(generations):
        if record.get("wm_wall_s") is not None:  # that generation trained the model
            return record.get("precision"), record.get("precision_decision")
    return None, None

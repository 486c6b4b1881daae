"""What the evolution loop reports: one record per committed generation, and
the run's report (the CLI's table and ``--json``)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Optional, Sequence

from .evaluation import Evaluation
from .evolve_config import Candidate, EvolveConfig
from .fail_fast import common_error, env_said, fix_for, normalised
from .time_share import BUCKETS

# the part of a finished run's report its manifest keeps
SUMMARY_KEYS = (
    "real_episodes",
    "target_reached",
    "episodes_to_target",
    "train_return",
    "heldout_return",
    "stop_reason",
)


def _learner_fields(prefix: str, report: Any, rounds: Sequence[Any] = ()) -> dict[str, Any]:
    """A learner's training report (world model or critic) as flat record
    fields; ``rounds``: every call of the generation (the critic trains once
    per actor round), so a rollback in any of them shows, not only the last's."""
    if report is None:
        return {
            f"{prefix}_{k}": None for k in ("val_loss", "train_loss", "steps", "wall_s", "precision", "rollback_reason")
        } | {f"{prefix}_rolled_back": False}
    rolled = [r for r in rounds or [report] if r.rolled_back]
    return {
        f"{prefix}_val_loss": report.val_loss,
        f"{prefix}_train_loss": report.train_loss,
        f"{prefix}_steps": sum(r.steps for r in rounds or [report]),  # optimizer steps the generation took
        f"{prefix}_wall_s": report.wall_s,
        f"{prefix}_precision": report.precision,
        f"{prefix}_rolled_back": bool(rolled),
        f"{prefix}_rollback_reason": "; ".join(r.rollback_reason for r in rolled) if rolled else None,
    }


def candidates_record(candidates: Sequence[Candidate]) -> dict[str, Any]:
    """The candidates' part of a generation record: each one's operator, real return (its one episode; a verified
    one's mean over the training start states it ran) and verdicts, and the best one-episode return of each kind
    (what `agents.extras.refined_count` reads)."""

    def best(cands: Sequence[Candidate]) -> Optional[float]:
        scores = [c.returns[0] for c in cands if c.returns]
        return max(scores) if scores else None

    return {
        "candidates": [
            {
                "id": c.id,
                "operator": c.operator,
                "real_return": c.real_return,
                "episodes": c.real_episodes,
                "full": c.full,
                "accepted": c.accepted,
                "joined": c.joined,
                "cut": c.cut,
                "steps": c.steps,
            }
            for c in candidates
        ],
        "best_return": best(candidates),  # the best one-episode return of the generation
        "refined_best": best([c for c in candidates if c.refined]),
        "cma_best": best([c for c in candidates if c.operator == "cma"]),
    }


def generation_record(
    generation: int,
    *,
    real_episodes: int,
    env_steps: int,
    new_steps: int,
    candidates: Sequence[Candidate],
    sigma: float,
    reports: dict[str, Any],
    elapsed_s: float,
    time: Optional[dict[str, float]] = None,
    confirmations: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """One committed generation: each candidate's operator (``cma``,
    ``refined:<mean|elite>:N`` for a copy of the mean or of the last
    generation's best after N actor-gradient steps, ``refined:actor``) and
    real return (its one episode; a verified one's mean over the training
    start states it ran), the best of each kind, CMA-ES's step size, the
    world model's and the critic's losses and precisions, the model
    rollouts, and the wall seconds per bucket (`agents.time_share`). ``new_steps``: the real env steps of the
    generation's episodes, what its learners trained on anew (`EvolveConfig.per_generation`: a resumed run
    sizes the next refinement from it)."""
    rollouts = reports.get("rollouts")
    wm, critic = reports.get("world_model"), reports.get("critic")
    return {
        "generation": generation,
        "real_episodes": real_episodes,
        "env_steps": env_steps,  # of the episodes that finished so far
        "new_steps": new_steps,
        **candidates_record(candidates),
        "sigma": sigma,
        **_learner_fields("wm", wm),
        **_learner_fields("critic", critic, reports.get("critic_rounds") or ()),
        "learners_skipped": reports.get("skipped"),  # why the learners did not train this generation (too little data)
        "wm_decision": wm.precision_decision if wm is not None else None,
        "critic_decision": critic.precision_decision if critic is not None else None,
        "rollouts": rollouts.as_dict() if rollouts is not None else None,
        "elapsed_s": elapsed_s,
        "time": time,
        "confirmations": list(confirmations),
    }


def run_report(
    cfg: EvolveConfig,
    *,
    best: Optional[Candidate],
    heldout: Optional[Evaluation],
    heldout_episodes: int,
    policy_file: Optional[str] = None,
    real_episodes: int,
    env_steps: int,
    failures: list[dict[str, Any]],
    confirmations: list[dict[str, Any]],
    reached_at: Optional[int],
    wall_s: float,
    stop_reason: str,
    budget_exhausted: Optional[str],
    unconfirmed: Optional[str],
    learners: dict[str, Any],
    generations: list[dict[str, Any]],
    run_id: str,
    replay_db: str,
    run_manifest: str,
    resumed_from: Optional[dict[str, Any]],
    train_start_states: int,
    validation_start_states: int,
    time_share: dict[str, Any],
) -> dict[str, Any]:
    """The run's report (docs/EVOLUTION.md lists its keys)."""
    report = {
        "mode": mode_of(cfg),
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
        "train_return": best.real_return
        if best and (best.full or best.accepted)
        else None,  # accepted: the mean of the states it ran
        "heldout_return": heldout.mean_return if heldout is not None else None,
        "heldout_episodes": heldout_episodes,
        "train_start_states": train_start_states,
        "train_states_run": len(best.returns) if best else None,  # of the answer: fewer than all when the test accepted
        "validation_start_states": validation_start_states,
        "validation_return": best.validation_return if best else None,
        "confirmations": confirmations,  # each target met on the training start states, run on the validation ones
        "unconfirmed": unconfirmed,  # a candidate that met the target with no budget left to confirm it
        "time_share": time_share,
        "best_candidate": {"id": best.id, "operator": best.operator, "params": [float(v) for v in best.params]}
        if best
        else None,
        "policy_file": policy_file,  # the answer as a policy file (agents.policies); None without one
        "learners": learners,  # per learned part: its ledger agent, precision and the decision's reason
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


def failed_alike(report: dict[str, Any]) -> Optional[tuple[int, str]]:
    """(generation, error) when the report's last generation's candidates all failed with the same error (the run
    stopped then: `agents.fail_fast`); else None."""
    generations = report.get("generations") or []
    if not generations:
        return None
    last = generations[-1]
    error = common_error(report.get("failed_candidates") or [], [c["id"] for c in last.get("candidates") or []])
    return None if error is None else (int(last["generation"]), error)


def mode_of(cfg: EvolveConfig) -> str:
    """The run's method in one word: ``loop`` (critic and model), ``no_model``, ``no_critic``, or ``cma`` (nothing
    refines: the floor)."""
    refines = cfg.refined > 0 and (cfg.use_critic or (cfg.use_world_model and cfg.refine_horizon > 0))
    if not refines:
        return "cma"
    if cfg.use_critic and cfg.use_world_model:
        return "loop"
    return "no_model" if cfg.use_critic else "no_critic"


def stop_detail(report: dict[str, Any]) -> str:
    """Why the run stopped, in one sentence, from its report (``stop_reason``
    is the machine-readable word: ``target``, ``budget`` (``budget_exhausted``
    says which: ``episodes`` or ``env_steps``), or ``failed`` when every real
    evaluation failed, or every candidate of a generation with the same error)."""
    n_train = report["train_start_states"]
    if report["stop_reason"] == "failed":
        failures = report.get("failed_candidates") or []
        alike = failed_alike(report)
        if alike is not None:
            generation, error = alike
            return (
                f"every candidate of generation {generation} failed with the same error: {env_said(error)}; "
                f"{fix_for(error)} ({report['real_episodes']} of {report['budget']} real episodes charged, the rest "
                "not spent)"
            )
        first = f"; the first error: {failures[0]['error']}" if failures else ""
        return (
            f"every candidate failed: {len(failures)} real evaluation(s), {report['real_episodes']} of "
            f"{report['budget']} "
            f"real episodes charged, none gave a usable return{first}"
        )
    if report["stop_reason"] == "target":
        reached = "-" if report["train_return"] is None else f"{report['train_return']:.1f}"
        ran = report.get("train_states_run") or n_train
        on = f"all {n_train}" if ran >= n_train else f"{ran} of the {n_train}"
        confirmed = ""
        if report.get("validation_return") is not None:
            n_val = report["validation_start_states"]
            tried = next(
                (c.get("episodes") for c in reversed(report.get("confirmations") or []) if c.get("confirmed")), None
            )
            val_on = f"all {n_val}" if tried is None or tried >= n_val else f"{tried} of the {n_val}"
            confirmed = f", confirmed on {val_on} validation start states (mean {report['validation_return']:.1f}),"
        test = "" if ran >= n_train else " (the sequential test's bound on the mean over all of them)"
        return (
            f"target reached on {on} training start states{test}: mean return {reached} >= "
            f"{report['target']:g}{confirmed} after {report['episodes_to_target']} real episodes"
        )
    if report.get("budget_exhausted") == "env_steps":
        steps = report["config"]["episode_steps"]
        # a failed episode is charged at its longest (its steps are not known), as the loop charges it
        charged = (
            report["env_steps"]
            + sum(int(f.get("episodes") or 0) for f in report.get("failed_candidates") or []) * steps
        )
        left = max(0, report["budget_steps"] - charged)
        used = f"{charged} of {report['budget_steps']} real env steps used ({report['real_episodes']} real episodes)"
        more = (
            "none is left"
            if left == 0
            else f"the {left} left are too few for another episode, which may run {steps} steps"
            if left < steps
            else f"{left} are left"
        )
    else:
        left = max(0, report["budget"] - report["real_episodes"])
        used = f"{report['real_episodes']} of {report['budget']} real episodes used"
        more = "none is left" if left == 0 else f"the {left} left are too few for what comes next"
    n_val = report.get("validation_start_states")
    if report.get("unconfirmed"):
        return (
            f"budget spent: {used}; {report['unconfirmed']} met the target {report['target']:g} on the training start "
            "states, "
            f"but the budget has no room to confirm it on the {n_val} validation start states"
        )
    refuted = len(report.get("confirmations") or [])
    if refuted:
        return (
            f"budget spent: {used}, and {more}; target {report['target']:g} met on the training start states but not "
            "confirmed "
            f"on the {n_val} validation start states ({refuted} tries)"
        )
    return f"budget spent: {used}, and {more}; target {report['target']:g} not reached on the training start states"


def report_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The rows of `genesis-fp16 evolve`'s final table: (metric, value)."""

    def fmt(value: Any, spec: str = ".1f") -> str:
        return "-" if value is None else format(value, spec)

    n_train, n_heldout = report["train_start_states"], report["heldout_episodes"]
    heldout = fmt(report["heldout_return"])
    if (
        report["target_reached"]
        and report["heldout_return"] is not None
        and report["heldout_return"] < report["target"]
    ):
        heldout += " (below the target, which is judged on the training and validation start states only)"
    steps_budget = f" of {report['budget_steps']}" if report.get("budget_steps") is not None else ""
    rows = [
        ("stopped", report["stop_detail"]),
        (
            "target reached",
            f"{report['target_reached']} (target {report['target']:g}: mean return on the {n_train} training start "
            "states)",
        ),
        ("real episodes", f"{report['real_episodes']} of {report['budget']}"),
        ("real env steps", f"{report['env_steps']}{steps_budget}"),
        ("episodes to target", str(report["episodes_to_target"]) if report["episodes_to_target"] is not None else "-"),
        (f"best return, full ({n_train} training start states)", fmt(report["train_return"])),
    ]
    if report.get("validation_start_states"):
        rows.append(
            (
                f"best return, validation ({report['validation_start_states']} validation start states)",
                fmt(report.get("validation_return")),
            )
        )
    rows += [
        (f"best return, held-out ({n_heldout} held-out start states)", heldout),
        ("answer", str((report.get("best_candidate") or {}).get("operator") or "-")),
    ]
    if report.get("policy_file"):
        rows.append(("policy file", report["policy_file"]))
    for name, learner in (report.get("learners") or {}).items():
        if learner.get("precision") is None:  # never built: the run never trained it
            text = f"- ({learner['agent']}): never trained, so never built nor its precision decided"
        else:
            text = f"{learner['precision']} ({learner['agent']})" + _decision_text(learner.get("decision"))
        rows.append((f"{name.replace('_', ' ')} precision", text))
    rows += [("generations", str(len(report["generations"]))), ("wall time (s)", f"{report['wall_s']:.1f}")]
    share = report.get("time_share") or {}
    if share:
        parts = [f"{k.replace('_', ' ')} {share[k]:.1f} s" for k in BUCKETS if share.get(k)]
        if share.get("other"):
            parts.append(f"other {share['other']:.1f} s")
        rows.append(("wall time", ", ".join(parts) or "-"))
    failures = report.get("failed_candidates", [])
    if failures:
        charged = sum(f.get("episodes", 0) for f in failures)
        rows.append(("failed candidates", f"{len(failures)} (charged {charged} real episodes)"))
    # one row per distinct error: a broken env fails every candidate alike, and one line says it
    by_error: dict[str, list[str]] = {}
    for failure in failures:
        by_error.setdefault(normalised(failure["error"]), []).append(failure["candidate"])
    for failure in failures:
        same = by_error.pop(normalised(failure["error"]), None)
        if same is None:
            continue
        who = same[0] if len(same) == 1 else f"{same[0]} and {len(same) - 1} more"
        rows.append((f"skipped {who}", failure["error"]))
    if report.get("replay_db"):
        rows.append(("replay buffer", report["replay_db"]))
    if report.get("run_id"):
        rows.append(("run", report["run_id"]))
    if report.get("resumed"):
        origin = report["resumed_from"]
        rows.append(("resumed" if origin["generation"] < 0 else "resumed after", resumed_text(origin)))
    return rows


def resumed_text(origin: dict[str, Any]) -> str:
    """Where a resumed run went on from, in words (the value of the row `report_rows` names ``resumed after``, or
    ``resumed`` for a run resumed before its first generation)."""
    if origin["generation"] < 0:
        carried = f"; {origin['real_episodes']} real episodes carried over" if origin["real_episodes"] else ""
        return f"before its first generation was committed (it began again at generation 0{carried})"
    return f"generation {origin['generation']}, {origin['real_episodes']} real episodes"


def _decision_text(decision: Optional[dict[str, Any]]) -> str:
    """`` (source: reason)`` of a precision decision, empty without one."""
    return f" ({decision['source']}: {decision['reason'].removeprefix('measured here: ')})" if decision else ""

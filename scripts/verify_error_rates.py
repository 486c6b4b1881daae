#!/usr/bin/env python
"""The sequential verification's error rates, by simulation (`agents/verify.py`).

    .venv/bin/python scripts/verify_error_rates.py [--trials 4000] [--seed 0] [--json PATH]

Each trial draws the returns of one policy on N start states (16: the training
states; 8: the validation states) from a family of return sets, a target, and
a random order of the states, and runs `agents.verify.verify` on them with a
fake evaluation (the returns are the set's). A training verification starts
from the candidate's one episode that met the target (its state drawn among
those at or above the target: the loop verifies only those); a validation
confirmation starts from nothing.

* false accept: the mean over the N states is below the target (by up to a
  quarter of the set's spread, where a test is most easily fooled) and the
  verification accepted;
* cost: the episodes run (the first one included) when the mean is above the
  target by a quarter to one spread, and how often those are accepted.

Rules compared: ``prior`` (the loop's: the prior spread is the set's own
standard deviation, which the loop's scale, the spread of the run's
one-episode returns across candidates and states, is usually above),
``prior+alike`` (the same, with the spread of 7 more returns of the same
policy on other states of the kind pooled in: a confirmation pools the
candidate's training returns), ``bare`` (no scale: only the mean over all the
states accepts) and
``student-t`` (the sample's spread alone at 90% per look, the selected first
episode among the evidence: the rule before issue 52, which two equal returns
fool). Families: normal,
bimodal by state (exact values), capped (many returns equal at the cap),
a minority of equal returns above the rest, and heavy tails (Student's t, 1.5
degrees of freedom). Prints a table and, with --json, writes every rate.
Takes about a minute on one core at the default 4000 trials.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents import verify as V  # noqa: E402
from agents.evaluation import Evaluation  # noqa: E402
from genesis_fp16.base.seeds import numpy_rng  # noqa: E402

FAMILIES = ("normal", "bimodal", "capped", "minority_equal", "heavy_tail")
RULES = ("prior", "prior+alike", "bare", "student-t")


def policy(family: str, rng: np.random.Generator):
    """One policy of ``family``: a function drawing its returns on ``n`` start states of the task's kind."""
    if family == "normal":
        return lambda n: rng.normal(0.0, 1.0, n)
    if family == "bimodal":  # the return depends on the state's kind only
        p = rng.uniform(0.05, 0.95)
        return lambda n: np.where(rng.random(n) < p, 50.0, -1000.0)
    if family == "capped":  # InvertedPendulum's 1000 on the states it holds
        return lambda n: np.minimum(rng.normal(1000.0, 300.0, n), 1000.0)
    if family == "minority_equal":
        p = rng.uniform(0.05, 0.5)  # fewer than half of the states, on average
        return lambda n: np.where(rng.random(n) < p, 1000.0, rng.normal(0.0, 50.0, n))
    if family == "heavy_tail":
        return lambda n: rng.standard_t(1.5, n)
    raise ValueError(family)


async def run(
    returns: np.ndarray, order: list[int], first: bool, target: float, rule: str, alike: np.ndarray
) -> tuple[bool, int]:
    async def evaluate(params: np.ndarray, states: np.ndarray) -> Evaluation:
        return Evaluation(returns=[float(returns[int(i)]) for i in states[:, 0]], episodes=[])

    states = np.arange(len(returns), dtype=np.float64)[:, None]
    start = (order[0], float(returns[order[0]])) if first else None
    if rule == "student-t":
        res = await _student_t(evaluate, states, order, start, target)
    else:
        scale = float(np.std(returns)) if rule.startswith("prior") else None
        res = await V.verify(
            evaluate,
            np.zeros(1),
            states,
            order,
            first=start,
            target=target,
            scale=scale,
            alike=list(alike) if rule == "prior+alike" else (),
        )
    return res.accepted, res.episodes + (1 if first else 0)


async def _student_t(evaluate, states, order, first, target):  # a plain Student-t rule, simulated for comparison
    real = V.decide

    def plain(returns, population, target, scale, first_selected=False, alike=()):
        if len(returns) >= population:
            return "accept" if float(np.mean(returns)) >= target else "reject"
        n, mean = len(returns), float(np.mean(returns))
        sd = float(np.std(returns, ddof=1)) if n > 1 else math.inf
        half = (
            V.t_quantile(0.9, n - 1) * sd / math.sqrt(n) * math.sqrt((population - n) / (population - 1))
            if n > 1
            else math.inf
        )
        if mean + half < target:
            return "reject"
        if mean - half >= target:
            return "accept"
        return None

    V.decide = plain
    try:
        return await V.verify(evaluate, np.zeros(1), states, order, first=first, target=target)
    finally:
        V.decide = real


async def simulate(trials: int, seed: int) -> dict:
    rng = numpy_rng(seed, "scripts.verify_error_rates")
    out: dict = {}
    for n, first in ((16, True), (8, False)):
        for family in FAMILIES:
            counts = {
                r: {"false_accept": 0, "below": 0, "accepted_above": 0, "above": 0, "episodes_above": 0} for r in RULES
            }
            for _ in range(trials):
                draw = policy(family, rng)
                returns, alike = draw(n), draw(7)  # alike: 7 returns of the same policy on other states of the kind
                mean, sd = float(returns.mean()), float(returns.std())
                if sd == 0:
                    continue
                below = bool(rng.random() < 0.5)
                target = mean + (rng.uniform(1e-6, 0.25) if below else -rng.uniform(0.25, 1.0)) * sd
                at_target = [i for i in range(n) if returns[i] >= target]
                if first and not at_target:
                    continue
                rest = [int(i) for i in rng.permutation(n)]
                if first:
                    head = int(rng.choice(at_target))
                    rest = [head] + [i for i in rest if i != head]
                for rule in RULES:
                    accepted, episodes = await run(returns, rest, first, target, rule, alike)
                    c = counts[rule]
                    if below:
                        c["below"] += 1
                        c["false_accept"] += accepted
                    else:
                        c["above"] += 1
                        c["accepted_above"] += accepted
                        c["episodes_above"] += episodes
            for rule, c in counts.items():
                out[f"N={n} {family} {rule}"] = {
                    "false_accept_rate": c["false_accept"] / max(1, c["below"]),
                    "below": c["below"],
                    "accept_rate_above": c["accepted_above"] / max(1, c["above"]),
                    "mean_episodes_above": c["episodes_above"] / max(1, c["above"]),
                    "above": c["above"],
                }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4000, help="return sets per family and N (default 4000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="write every rate here")
    args = parser.parse_args(argv)
    rates = asyncio.run(simulate(args.trials, args.seed))
    print(f"{'case':40s} {'false accept':>12s} {'accept (above)':>15s} {'episodes (above)':>17s}")
    for case, r in rates.items():
        print(
            f"{case:40s} {r['false_accept_rate']:12.3f} {r['accept_rate_above']:15.3f} {r['mean_episodes_above']:17.2f}"
        )
    worst = max(r["false_accept_rate"] for case, r in rates.items() if not case.endswith("student-t"))
    print(
        f"worst false-accept rate of the prior and bare rules: {worst:.3f} (stated: at most "
        f"{V.STATED_FALSE_ACCEPT:.2f})"
    )
    if args.json is not None:
        args.json.write_text(json.dumps({"trials": args.trials, "seed": args.seed, "rates": rates}, indent=1) + "\n")
    return 0 if worst <= V.STATED_FALSE_ACCEPT and not math.isnan(worst) else 1


if __name__ == "__main__":
    sys.exit(main())

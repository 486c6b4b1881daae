"""The extras' schedule, read from the generation records alone (so a resumed run decides alike): how many refined
candidates the next generation runs beside CMA-ES's population (`refined_count`), and whether they join CMA-ES's update
as parents or only by winning (`won_lately`; `agents.cma_search.CMASearch.tell` applies it)."""

from __future__ import annotations

from typing import Any, Optional, Sequence

WINDOW = 3
"""Generations whose extras decide how many refined candidates the next one gets (`refined_count`)."""
FIRST_EXTRAS = 2
"""Refined candidates of the first generation that has a learner to refine with, before any has been judged."""
PLATEAU_LENGTH = 0.9
"""The share of the episode's steps the extras' episodes run, on average, to count as holding a plateau."""
MAX_PROBE_WAIT = 7
"""The most generations a probe waits while no extra has won in the run (`refined_count`)."""


def _extras(records: Sequence[dict[str, Any]]) -> list[tuple[dict[str, Any], Optional[float]]]:
    """The refined candidates of ``records``, each with its generation's best own one-episode return (``cma_best``)."""
    return [
        (c, record.get("cma_best"))
        for record in records
        for c in record.get("candidates") or []
        if c.get("operator", "").startswith("refined")
    ]


def _wins(pairs: Sequence[tuple[dict[str, Any], Optional[float]]]) -> int:
    """How many of `_extras`' pairs won: a return above their generation's best own sample."""
    return sum(
        bar is not None and c.get("real_return") is not None and float(c["real_return"]) > float(bar)
        for c, bar in pairs
    )


def won_lately(generations: Sequence[dict[str, Any]]) -> bool:
    """Whether an extra won in the last `WINDOW` generation records: the next generation's extras then join
    CMA-ES's update by ranking among its parents, a probe's only by winning (`agents.cma_search.CMASearch.tell`)."""
    return _wins(_extras(generations[-WINDOW:])) > 0


def probing(generations: Sequence[dict[str, Any]]) -> bool:
    """Whether the next generation's extras are probes: the last extras judged against a population (a record whose
    own samples ran: ``cma_best`` known) lost, and none won in the last `WINDOW` records. Extras not yet judged (the
    first ones, or those whose population the budget or a met target cut) are not probes: they may be the run's answer
    (Pendulum-v1 at 4,000 steps runs the first extras and never the population beside them). The loop runs probes
    after the population where the budget may not hold both (`agents.se_darwin_agent`)."""
    judged = [r for r in generations if r.get("cma_best") is not None and _extras([r])]
    return bool(judged) and not _wins(_extras(judged[-1:])) and not won_lately(generations)


def refined_count(generations: Sequence[dict[str, Any]], most: int, episode_steps: Optional[int] = None) -> int:
    """How many refined candidates (extras beside CMA-ES's population) the
    next generation gets, read from the generation records alone (so a
    resumed run decides alike): over the last `WINDOW` records, twice the
    extras that won (a return above the best of the population's own
    samples: ranking among its parents, which lets an extra join CMA-ES's
    update once extras have won, is not enough where half the population is
    poor), at most ``most``. None won lately: a probe of one each generation
    (one episode beside the population: where only the learners solve the
    task, they keep learning and the next actor gets its chance); while no
    extra has won in the whole run, the probe waits a while that doubles
    with each generation whose extras lost (none after the first, then 1, 3,
    at most `MAX_PROBE_WAIT` generations: where the learners never win, as on
    Swimmer-v5, a probe each generation cost the population 8 of its 100
    episodes and the loop ended at 0.93x its floor, with the wait at 1.00x).
    None, whatever won before, while the extras that ran last
    held a plateau (`_plateau`: longer episodes than the population's, no
    gain over its best, each run to (nearly) ``episode_steps``, the
    episode's length), until none has run for `WINDOW` generations; none
    ever ran: `FIRST_EXTRAS`."""
    if most <= 0:
        return 0
    ran = [i for i, record in enumerate(generations) if _extras([record])]
    if not ran:
        return min(most, FIRST_EXTRAS)
    last = generations[ran[-1]]
    waited = len(generations) - 1 - ran[-1]  # generations since extras last ran
    if not _wins(_extras([last])) and _plateau(last, episode_steps):
        return 1 if waited >= WINDOW else 0  # the last extras only held a plateau: earlier wins do not keep them
    won = _wins(_extras(generations[-WINDOW:]))
    if won:
        return min(most, 2 * won)
    if not _wins(_extras(generations)):  # the learners never won in this run: the probes grow rarer
        return 1 if waited >= min(MAX_PROBE_WAIT, 2 ** (len(ran) - 1) - 1) else 0
    return 1


def _plateau(record: dict[str, Any], episode_steps: Optional[int] = None) -> bool:
    """Whether the extras of ``record`` (a generation whose extras lost) held a plateau: they ran the whole episode
    (at least `PLATEAU_LENGTH` of ``episode_steps``, where it is given) and longer on average than the population's
    own (a Hopper that stands still for 1000 steps, where the population falls early and costs less); or the record
    does not say (a run from before candidates' steps were recorded). Where every episode runs its full length
    (Pendulum, Swimmer) no extra is longer than the population's; where a longer episode is a better one (a pole
    balanced longer) but not yet a whole one, the probe goes on."""
    cands = record.get("candidates") or []
    own = [c.get("steps") for c in cands if c.get("operator") == "cma"]
    theirs = [c.get("steps") for c in cands if c.get("operator", "").startswith("refined")]
    if not own or not theirs or any(not isinstance(v, int) for v in own + theirs):
        return True
    mean = sum(theirs) / len(theirs)
    whole = episode_steps is None or mean >= PLATEAU_LENGTH * episode_steps
    return whole and mean > sum(own) / len(own)

"""The loop's real episodes under its budgets: one episode per candidate,
the verification of a candidate that met the target on the training start
states (`agents.verify`), and the confirmation of a target on the validation start states. Every episode run
is charged, a failed or stopped candidate's too; the held-out start states
are not used here (only by the final report)."""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np

from .evaluation import Evaluation, EvaluationBackend, EvaluationEnvError, EvaluationError, EvaluationTimeout
from .evolve_config import Candidate, EvolveConfig
from .fail_fast import normalised
from .progress import EPISODES, VERIFICATION, Phase, RunProgress
from .run_state import Spent
from .tasks import StartStates
from .time_share import TimeShare
from .verify import start_order, verify

if TYPE_CHECKING:
    import structlog


class RealEpisodes:
    """What the run spent (``real_episodes``, ``env_steps`` of the episodes
    that finished), what failed (``failures``) and every confirmation tried
    (``confirmations``), charged to ``spent`` (the run state's: `agents.run_state.Spent`)."""

    def __init__(
        self,
        evaluator: EvaluationBackend,
        config: EvolveConfig,
        starts: StartStates,
        time: TimeShare,
        log: "structlog.stdlib.BoundLogger",
        spent: Spent,
        progress: Optional[RunProgress] = None,
    ) -> None:
        self.evaluator, self.config, self.starts, self.time, self._log, self.spent = (
            evaluator,
            config,
            starts,
            time,
            log,
            spent,
        )
        self.progress = progress or RunProgress()
        self._warned: set[str] = set()  # the failures warned of (`charge_failure`)
        self.order = start_order(len(starts.train), config.seed)
        self.cut = False  # the last verification stopped because its next stage did not fit the budgets

    failures = property(
        lambda self: self.spent.failures, doc="Candidates charged and skipped (or not confirmed), and why."
    )
    confirmations = property(lambda self: self.spent.confirmations, doc="Every confirmation tried.")

    @property
    def real_episodes(self) -> int:
        return self.spent.real_episodes

    @real_episodes.setter
    def real_episodes(self, value: int) -> None:
        self.spent.real_episodes = value

    @property
    def env_steps(self) -> int:
        return self.spent.env_steps

    @env_steps.setter
    def env_steps(self, value: int) -> None:
        self.spent.env_steps = value

    @property
    def target(self) -> float:
        assert self.config.target is not None  # resolve() fills it in
        return self.config.target

    # -- budgets --------------------------------------------------------------------------
    def steps_charged(self) -> int:
        """Env steps counted against ``budget_steps``: those of the episodes that
        finished, and a failed episode at its longest (its steps are not known)."""
        assert self.config.episode_steps is not None
        return self.env_steps + sum(int(f["episodes"]) for f in self.failures) * self.config.episode_steps

    def over_budget(self, episodes: int, episode_steps: Optional[int] = None) -> Optional[str]:
        """Which budget ``episodes`` more real episodes could exceed:
        ``episodes``, ``env_steps`` (each may run ``episode_steps`` steps, by default the task's longest), or None."""
        cfg = self.config
        assert cfg.episode_steps is not None
        steps = cfg.episode_steps if episode_steps is None else episode_steps
        if self.real_episodes + episodes > cfg.budget:
            return "episodes"
        if cfg.budget_steps is not None and self.steps_charged() + episodes * steps > cfg.budget_steps:
            return "env_steps"
        return None

    def steps_left(self) -> Optional[int]:
        """Env steps ``budget_steps`` has left (None: no step budget)."""
        cfg = self.config
        return None if cfg.budget_steps is None else max(0, cfg.budget_steps - self.steps_charged())

    def exhausted(self) -> Optional[str]:
        """Which budget has no room for even a cut episode (`episodes` with ``max_steps``): ``episodes`` (not one
        more), ``env_steps`` (not one more step), or None. A step budget with fewer steps left than a full episode
        is not exhausted: its last steps run as a cut episode."""
        over = self.over_budget(1)
        return None if over == "env_steps" and self.steps_left() else over

    def fits(self, episodes: int, episode_steps: Optional[int] = None) -> bool:
        """Whether ``episodes`` more real episodes (of ``episode_steps`` steps, by default the task's longest) fit both
        budgets (`over_budget`)."""
        return self.over_budget(episodes, episode_steps) is None

    # -- evaluations ----------------------------------------------------------------------
    def told(self, phase: Phase) -> dict[str, object]:
        """The evaluator's keyword that reports ``phase``'s episodes as they finish; none while nothing listens
        (an evaluator of one's own may not take it)."""
        return {"on_episodes": phase.add} if self.progress.enabled else {}

    async def evaluate(self, params: np.ndarray, states: np.ndarray, phase: Optional[Phase] = None) -> Evaluation:
        told = self.told(phase) if phase is not None else {}
        with self.time.measure("real_episodes"):
            return await asyncio.to_thread(functools.partial(self.evaluator.evaluate, params, states, **told))

    def charge_failure(self, cand: Candidate, exc: EvaluationError, *, episodes: int, score: bool = True) -> None:
        """Record why ``cand`` failed and how many real episodes it was
        charged; with ``score`` it is scored -inf (the caller keeps it in the pool)."""
        if score:
            cand.real_return, cand.full = float("-inf"), True
        event = "evolve.candidate_timeout" if isinstance(exc, EvaluationTimeout) else "evolve.candidate_failed"
        # a warning the first time an error is seen in the session; the same error again (its numbers aside: a broken
        # env fails every candidate alike) is an INFO event with ``repeat`` true, in the event log, not on the terminal
        key = normalised(str(exc))
        if key in self._warned:
            self._log.info(event, candidate=cand.id, error=str(exc), repeat=True)
        else:
            self._warned.add(key)
            self._log.warning(event, candidate=cand.id, error=str(exc))
        self.failures.append(
            {"candidate": cand.id, "generation": cand.generation, "episodes": episodes, "error": str(exc)}
        )

    async def episodes(
        self, cands: Sequence[tuple[Candidate, int]], *, max_steps: Optional[int] = None
    ) -> list[tuple[Candidate, Evaluation]]:
        """One episode per candidate on its training start state (index). An
        env that raises loses its own candidate only (scored -inf, not
        returned): the others' episodes ran and count. ``max_steps``: the
        episodes end after at most this many steps (the step budget's last
        steps); one that the cap, not the env, ended is ``cut``: charged, its
        transitions returned for the replay buffer, its return not judged
        (no return, so nothing ranks, verifies or answers by it)."""
        train = self.starts.train
        cap = {} if max_steps is None else {"max_steps": max_steps}
        with (
            self.time.measure("real_episodes"),
            self.progress.phase(EPISODES, len(cands), "episodes", episodes=True) as phase,
        ):
            results = await asyncio.to_thread(
                functools.partial(
                    self.evaluator.evaluate_many,
                    [(c.params, train[[i]]) for c, i in cands],
                    per_job_env_errors=True,
                    **self.told(phase),
                    **cap,
                )
            )
        out = []
        for (cand, i), res in zip(cands, results):
            self.real_episodes += 1
            if isinstance(res, EvaluationEnvError):
                self.charge_failure(cand, res, episodes=1)
                continue
            cand.steps = res.env_steps
            if max_steps is not None and _cut(res, max_steps, self.config.episode_steps):
                cand.cut, cand.real_episodes = True, 1
                self.env_steps += res.env_steps
            else:
                self._score(cand, [i], res)
            out.append((cand, res))
        return out

    async def verify(self, cand: Candidate, scale: Optional[float]) -> Optional[Evaluation]:
        """``cand`` (one episode so far, at the target) run on the other
        training start states until the sequential test decides (`agents.verify`); its returns,
        episodes, whether it is full and whether it was accepted are set on it. Returns the new
        episodes (None when an evaluation failed: it is then charged, its one
        episode's return kept). ``scale``: the spread of the task's returns (`agents.verify.return_scale`)."""
        assert len(cand.starts) == 1
        with self.progress.phase(VERIFICATION, None, "episodes", episodes=True, detail="training states") as phase:
            result = await verify(
                functools.partial(self.evaluate, phase=phase),
                cand.params,
                self.starts.train,
                self.order,
                first=(cand.starts[0], cand.returns[0]),
                target=self.target,
                fits=self.fits,
                scale=scale,
            )
        self.real_episodes += result.episodes
        self.cut = result.decided == "budget"
        if result.error is not None:
            self.charge_failure(cand, result.error, episodes=result.episodes, score=False)
            return None
        self._score(cand, result.starts, result.evaluation, returns=result.returns)
        cand.accepted = result.accepted
        return result.evaluation

    def _score(
        self, cand: Candidate, starts: list[int], res: Evaluation, returns: Optional[Sequence[float]] = None
    ) -> None:
        """``cand``'s returns on ``starts`` (``returns``, else ``res``'s), the env steps of ``res`` charged."""
        cand.starts, cand.returns = list(starts), [float(r) for r in (res.returns if returns is None else returns)]
        cand.real_return, cand.real_episodes = float(np.mean(cand.returns)), len(cand.returns)
        cand.full = len(cand.returns) == len(self.starts.train)
        self.env_steps += res.env_steps

    async def confirm(self, cand: Candidate, generation: int, scale: Optional[float]) -> Optional[bool]:
        """Run ``cand`` (which met the target on the training start states) on
        the validation start states, stage by stage until the sequential test
        decides (`agents.verify`): whether their mean meets the target too (an
        evaluation that fails does not); None when the budgets have no room
        for the next stage (what ran is charged). The episodes never reach the
        replay buffer, so the validation set stays out of the search."""
        states = self.starts.validation
        n = len(states)
        # the candidate's training returns (its first, picked for meeting the target, left out) show how its return
        # varies across start states of this kind: their spread is pooled into the bound's
        with self.progress.phase(VERIFICATION, None, "episodes", episodes=True, detail="validation states") as phase:
            result = await verify(
                functools.partial(self.evaluate, phase=phase),
                cand.params,
                states,
                list(range(n)),
                target=self.target,
                fits=self.fits,
                scale=scale,
                alike=cand.returns[1:],
            )
        self.real_episodes += result.episodes
        if result.decided == "budget":  # the next stage did not fit: what ran is charged, nothing is decided
            self.env_steps += result.evaluation.env_steps
            return None
        if result.error is not None:
            self.charge_failure(cand, result.error, episodes=result.episodes, score=False)
            cand.confirmed = False
        else:
            self.env_steps += result.evaluation.env_steps
            cand.validation_return = float(np.mean(result.returns))
            cand.confirmed = result.decided == "accept"
        self.confirmations.append(
            {
                "candidate": cand.id,
                "generation": generation,
                "train_return": cand.real_return,
                "validation_return": cand.validation_return,
                "episodes": result.episodes,
                "confirmed": cand.confirmed,
            }
        )
        self._log.info("evolve.confirmation", **self.confirmations[-1])
        return cand.confirmed


def _cut(res: Evaluation, max_steps: int, episode_steps: Optional[int]) -> bool:
    """Whether the one episode of ``res`` ran into ``max_steps`` (below the task's ``episode_steps``) without the env
    ending it: cut by the budget, not an episode's return."""
    episode = res.episodes[0] if res.episodes else {}
    done = episode.get("done")
    steps = len(done) if done is not None else 0
    return episode_steps is not None and max_steps < episode_steps and steps >= max_steps and not (steps and done[-1])

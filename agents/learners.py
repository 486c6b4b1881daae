"""The loop's learned parts, each a guarded agent of its own: the world
model (``world_model.<task>``) and the critic (``critic.<task>``), both
trained in the precision their rollout policy decides, and the refinement
that uses them.

Per generation (`Learners.learn`), on every real transition so far: the world
model trains (``learn_per_step`` steps per new real env step, up to
``wm_steps``); ``model_rollouts`` short rollouts (``rollout_horizon`` steps)
branch from real replay states under the CMA-ES mean policy with exploration
noise (MBPO); the critic trains on the real and the model transitions (TD3
targets of the mean policy), ``critic_updates`` steps per new real
transition. `Learners.refine` then ascends copies of the mean through the
critic (`agents.refine`), the longest ``learn_per_step`` steps per new real
env step, up to ``refine_steps`` (a generation of short episodes, as
InvertedDoublePendulum's first ones, trains as much as it brought).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np

from genesis_fp16.base.seeds import stream_seed, torch_generator
from genesis_fp16.base.settings import Settings
from genesis_fp16.base.telemetry import get_logger
from infrastructure.replay_buffer import ReplayBuffer

from .evolve_config import EvolveConfig
from .manifest_fields import RunError
from .progress import CRITIC, MODEL_ROLLOUTS, REFINEMENT, WORLD_MODEL, Phase, RunProgress
from .search_space import SearchSpace
from .tasks import ResolvedTask
from .tasks.task import DEFAULT_DISCOUNT

if TYPE_CHECKING:
    import torch

    from genesis_fp16.precision.decision import PrecisionDecision

    from .run_state import RunState

    from infrastructure.critic import Critic
    from infrastructure.world_model import WorldModel

EXPLORATION_NOISE = 0.1
"""The model rollouts' action noise, a fraction of the half action range (TD3's exploration noise)."""
REFINE_STATES = 4096
"""The most recent real states the refinement draws its minibatches from."""
MIN_TRANSITIONS = 2
"""The fewest real transitions the learners train from (the world model holds one out to validate); fewer: the
generation's learning is skipped, logged and recorded (``learners_skipped``), and the run goes on."""


class Learners:
    """The world model and the critic of one run (either may be left out: the ablations). ``state``: the run's
    (`agents.run_state.RunState`), where the refinement's actor lives and where the wall time is counted;
    ``progress``: where each phase's steps are reported (`agents.progress.RunProgress`).

    A learner is built when it is first needed: at the first `learn` (to train it) or by `build` (a resumed run
    loading its snapshot). Building decides its precision (and measures an ``auto``), so a run that never trains
    builds and measures none; until then `world_model` and `critic` are None, and `summary` says so."""

    def __init__(
        self,
        config: EvolveConfig,
        task: ResolvedTask,
        settings: Settings,
        buffer: ReplayBuffer,
        data_agent: str,
        run_id: str,
        state: RunState,
        *,
        world_model: Optional[WorldModel] = None,
        critic: Optional[Critic] = None,
        progress: Optional[RunProgress] = None,
    ) -> None:
        self.config, self.task, self.settings, self.buffer, self.data_agent, self.run_id, self.state = (
            config,
            task,
            settings,
            buffer,
            data_agent,
            run_id,
            state,
        )
        self.progress = progress or RunProgress()
        self.world_model: Optional[WorldModel] = world_model
        """The world model once built (given, or by `build`); None before, and in the ablation without one."""
        self.critic: Optional[Critic] = critic
        """The critic once built; None before, and in the ablation without one."""
        self.uses = {
            "world_model": world_model is not None or config.use_world_model,
            "critic": critic is not None or config.use_critic,
        }
        """Which learners the run has (built or not): ``world_model``, ``critic``."""
        self.last: dict[str, Any] = {}

    @property
    def discount(self) -> float:
        """The learners' discount: the resolved config's (`EvolveConfig.discount`), else `DEFAULT_DISCOUNT`."""
        return DEFAULT_DISCOUNT if self.config.discount is None else float(self.config.discount)

    def build(self, name: str) -> Any:
        """The learner ``name`` (``world_model`` or ``critic``), built now if the run has it and it is not yet (its
        precision decided, an ``auto`` measured: a begin and an end event of its phase say so); None if the run has
        none."""
        if not self.uses[name]:
            return None
        learner = getattr(self, name)
        if learner is None:
            phase = WORLD_MODEL if name == "world_model" else CRITIC
            with self.progress.phase(phase, None, "", detail="deciding precision"):
                learner = self._make_world_model() if name == "world_model" else self._make_critic()
            setattr(self, name, learner)
        return learner

    time = property(lambda self: self.state.time, doc="Where the run's wall time goes (`RunState.time`).")

    @property
    def actor(self) -> Optional[np.ndarray]:
        """The policy (raw parameters) the last `learn` improved round by round, injected first by the next `refine`
        (`RunState.actor`: a resumed run injects it too)."""
        return self.state.actor

    @actor.setter
    def actor(self, value: Optional[np.ndarray]) -> None:
        self.state.actor = value

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.settings.state_dir) / "world_model" / self.run_id

    def _run_decision(self, key: str) -> Optional[PrecisionDecision]:
        """The learner's precision decision from the run's state (a resumed run's manifest, `RunState.decisions`):
        trained on instead of deciding again; None for a new run."""
        from genesis_fp16.precision.decision import PrecisionDecision

        data = self.state.decisions.get(key)
        if data is None:
            return None
        try:
            return PrecisionDecision.from_dict(data)
        except ValueError as exc:
            raise RunError(
                f"run {self.run_id!r}: its manifest's decisions.{key}: {exc}; the run cannot be resumed"
            ) from None

    def _make_world_model(self) -> WorldModel:
        from infrastructure.world_model import WorldModel

        assert self.config.wm_agent is not None  # resolve() names it after the task
        return WorldModel(
            self.task.policy.obs_dim,
            self.task.policy.act_dim,
            done_head=self.task.learns_termination,
            buffer=self.buffer,
            agent=self.config.wm_agent,
            data_agent=self.data_agent,
            settings=self.settings,
            precision=self.config.precision,
            seed=self.config.seed,
            ensemble=self.config.ensemble,
            probabilistic=self.config.ensemble > 1,
            checkpoint_dir=self.checkpoint_dir,
            decision=self._run_decision("world_model_checkpoint"),
        )

    def _make_critic(self) -> Critic:
        from infrastructure.critic import Critic

        assert self.config.critic_agent is not None
        spec = self.task.policy
        return Critic(
            spec.obs_dim,
            spec.act_dim,
            action_low=spec.action_low,
            action_high=spec.action_high,
            agent=self.config.critic_agent,
            settings=self.settings,
            precision=self.config.critic_precision,
            seed=self.config.seed,
            checkpoint_dir=self.checkpoint_dir,
            decision=self._run_decision("critic_checkpoint"),
            gamma=self.discount,
        )

    # -- policies in torch --------------------------------------------------------------------
    def _mean_policy(
        self, z: np.ndarray, space: SearchSpace, noise: float = 0.0, generator: Optional[torch.Generator] = None
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """``obs (N, obs_dim) -> actions (N, act_dim)`` of the policy at ``z``, with Gaussian ``noise`` (a fraction of
        the half range) drawn from ``generator`` (required with noise)."""
        import torch

        from .refine import ZPolicy

        policy, zt = ZPolicy(space), torch.tensor(np.asarray(z, dtype=np.float32)[None])
        spec = self.task.policy
        low, high = (
            torch.tensor(spec.action_low, dtype=torch.float32),
            torch.tensor(spec.action_high, dtype=torch.float32),
        )
        half = (high - low) / 2
        if noise > 0 and generator is None:
            raise ValueError("_mean_policy: noise without a generator: pass the stream the noise is drawn from")

        def act(obs: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                a = policy(zt, obs.float().cpu()[None])[0]
                if noise > 0:
                    step = noise * half * torch.randn(a.shape, generator=generator)
                    a = torch.maximum(torch.minimum(a + step, high), low)
            return a.to(obs.device)

        return act

    # -- learning -------------------------------------------------------------------------------
    async def learn(
        self,
        z_mean: np.ndarray,
        space: SearchSpace,
        generation: int,
        *,
        new_steps: int,
        elite: Optional[np.ndarray] = None,
    ) -> dict[str, Any]:
        """The world model and the critic learn from every real transition so
        far; returns their reports (``world_model``, ``rollouts``, ``critic``).
        With ``actor_rounds`` > 0 the critic's updates are split into rounds,
        each followed by actor-gradient steps on a policy that starts at
        ``elite`` (else the mean) and that the next round's critic values
        (policy iteration, as TD3 interleaves its critic and actor); that
        actor joins the next population (`refine`)."""
        from infrastructure.transitions import Transitions

        cfg, reports = self.config, {}
        transitions = self.buffer.count(self.data_agent)["transitions"]
        if transitions < MIN_TRANSITIONS:
            reports["skipped"] = (
                f"only {transitions} real transition(s) so far; the learners train from {MIN_TRANSITIONS} "
                "(one to train on, one to validate)"
            )
            get_logger("agents.learners", run_id=self.run_id).info(
                "evolve.learners_skipped", generation=generation, reason=reports["skipped"]
            )
            return reports
        progress = self.progress
        if self.uses["world_model"]:
            with self.time.measure("model_train"):
                world_model = self.build("world_model")
                wm_steps = cfg.per_generation(cfg.wm_steps, new_steps)
                with progress.phase(WORLD_MODEL, wm_steps) as phase:
                    reports["world_model"] = await world_model.train(wm_steps, on_step=phase.advance)
        if not self.uses["critic"]:
            return reports
        with self.time.measure("critic"):
            critic = self.build("critic")
        trajectories = await self.buffer.asample(self.data_agent)
        real = Transitions.from_trajectories(trajectories)
        parts = [real]
        if self.world_model is not None and cfg.model_rollouts > 0:
            import torch

            from infrastructure.model_env import branched_rollouts

            # one stream per use: the replay rows, the exploration noise, the model env's member and Gaussian draws
            with (
                self.time.measure("model_rollouts"),
                progress.phase(MODEL_ROLLOUTS, cfg.model_rollouts, "rollouts") as phase,
            ):
                rows = torch.randint(
                    len(real), (cfg.model_rollouts,), generator=torch_generator(cfg.seed, "learners.rows", generation)
                )
                explore = self._mean_policy(
                    z_mean, space, EXPLORATION_NOISE, torch_generator(cfg.seed, "learners.exploration", generation)
                )
                model, stats = branched_rollouts(
                    self.world_model,
                    explore,
                    real.obs[rows],
                    cfg.rollout_horizon,
                    terminated=self.task.task.termination,
                    project=self.task.task.project,
                    seed=stream_seed(cfg.seed, "learners.model_env", generation),
                )
                phase.advance(cfg.model_rollouts)
            parts.append(model)
            reports["rollouts"] = stats
        data, steps = Transitions.cat(parts), max(1, math.ceil(cfg.critic_updates * new_steps))
        if cfg.actor_rounds == 0 or cfg.refined == 0:
            with self.time.measure("critic"), progress.phase(CRITIC, steps) as phase:
                policy = self._mean_policy(z_mean, space)
                reports["critic"] = await critic.train(data, policy, steps, on_step=phase.advance)
            self.last = reports
            return reports
        import asyncio

        from .refine import refine

        actor = np.asarray(elite if elite is not None else z_mean, dtype=np.float64)
        per_round, rounds = max(1, steps // cfg.actor_rounds), []
        actor_steps = max(1, cfg.per_generation(cfg.refine_steps, new_steps) // cfg.actor_rounds)
        reports["critic_rounds"] = rounds  # a rollback in any round shows in the generation's record
        for r in range(cfg.actor_rounds):
            # one phase per round, its steps counted over all the rounds
            with (
                self.time.measure("critic"),
                progress.phase(CRITIC, per_round * cfg.actor_rounds, done=r * per_round) as phase,
            ):
                reports["critic"] = await critic.train(
                    data,
                    self._mean_policy(actor, space),
                    per_round,
                    save=r == cfg.actor_rounds - 1,
                    on_step=_offset(phase, r * per_round),
                )
            rounds.append(reports["critic"])
            with (
                self.time.measure("refine"),
                progress.phase(REFINEMENT, actor_steps * cfg.actor_rounds, done=r * actor_steps) as phase,
            ):
                actor = (
                    await asyncio.to_thread(
                        refine,
                        actor,
                        data.obs,
                        space,
                        value=critic.value,
                        gamma=self.discount,
                        snapshots=[actor_steps],
                        seed=stream_seed(cfg.seed, "learners.actor_round", generation, r),
                        on_step=_offset(phase, r * actor_steps),
                    )
                )[0]
        self.actor = space.to_raw(actor)
        self.last = reports
        return reports

    async def refine(
        self,
        z_mean: np.ndarray,
        space: SearchSpace,
        generation: int,
        elite: Optional[np.ndarray] = None,
        count: Optional[int] = None,
        new_steps: Optional[int] = None,
    ) -> list[tuple[np.ndarray, str]]:
        """Refined copies, (z, operator) pairs: ascents of the critic's value
        (through ``refine_horizon`` model steps first) from the CMA-ES mean and,
        given, from ``elite`` (the last generation's best candidate, z), with
        snapshots at 1 / 4^k of the longest ascent; the mean gets the first,
        the elite every other copy. Empty while there is nothing to refine with
        (no critic trained yet, or ``refined`` 0). ``count``: how many (default
        ``refined``; `refined_count` adapts it to how the refined candidates fare). ``new_steps``: the real env steps
        the critic last learned from, which size the ascents (`EvolveConfig.per_generation`; None: ``refine_steps``)."""
        import asyncio

        cfg = self.config
        horizon = cfg.refine_horizon if self.world_model is not None and self.world_model.trained else 0
        value = self.critic.value if self.critic is not None and self.critic.trained else None
        count = cfg.refined if count is None else count
        if count == 0 or (value is None and horizon == 0):
            return []
        longest = cfg.per_generation(cfg.refine_steps, new_steps)
        from infrastructure.transitions import Transitions

        from .refine import model_step, refine

        trajectories = await self.buffer.asample(self.data_agent, max_transitions=REFINE_STATES)
        states = Transitions.from_trajectories(trajectories).obs
        out: list[tuple[np.ndarray, str]] = (
            [(space.to_z(self.actor), "refined:actor")] if self.actor is not None else []
        )
        left = count - len(out)
        starts = [("mean", z_mean)] + ([("elite", elite)] if elite is not None and left > 1 else [])
        starts = starts[:left]
        plan = []
        for k, (name, z0) in enumerate(starts):
            copies = len(range(k, left, len(starts)))
            plan.append((k, name, z0, sorted({max(1, longest // 4**j) for j in range(copies)})))
        total, done = sum(snapshots[-1] for *_, snapshots in plan), 0
        with self.progress.phase(REFINEMENT, total) as phase:
            for k, name, z0, snapshots in plan:
                with self.time.measure("refine"):
                    zs = await asyncio.to_thread(
                        refine,
                        z0,
                        states,
                        space,
                        value=value,
                        model=model_step(self.world_model) if horizon else None,
                        horizon=horizon,
                        gamma=self.discount,
                        snapshots=snapshots,
                        seed=stream_seed(cfg.seed, "learners.refine", generation, k),
                        on_step=_offset(phase, done),
                    )
                done += snapshots[-1]
                out += [(z, f"refined:{name}:{n}") for z, n in zip(zs, snapshots)]
        return out

    def summary(self, generations: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
        """Each learner's agent, precision and decision, for the report: those
        of its last training in ``generations`` (the run's records, resumed
        stretches included), else what its trainer would run now; a learner
        never built (the run never trained it) is not built here: its
        precision and decision are None and ``trained`` False."""
        out: dict[str, Any] = {}
        for name, prefix, learner in (("world_model", "wm", self.world_model), ("critic", "critic", self.critic)):
            if not self.uses[name]:
                continue
            trained = [r for r in generations if r.get(f"{prefix}_wall_s") is not None]
            agent = learner.agent if learner is not None else getattr(self.config, f"{prefix}_agent")
            if trained:
                precision, decision = trained[-1][f"{prefix}_precision"], trained[-1][f"{prefix}_decision"]
            elif learner is not None:
                precision, decision = learner.precision, learner.decision.as_dict()
            else:
                precision, decision = None, None
            out[name] = {"agent": agent, "precision": precision, "decision": decision, "trained": bool(trained)}
        return out


def _offset(phase: Phase, before: int) -> Callable[[int], None]:
    """``on_step`` for a call whose steps follow ``before`` steps of ``phase``."""
    return lambda done: phase.advance(before + done)

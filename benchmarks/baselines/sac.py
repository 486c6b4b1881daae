"""Stable-Baselines3 SAC with its default settings, for a given number of
real env steps (the loop's), judged on the same start states as the loop.

SAC trains on the env's own resets (SB3 seeds the env once with the run's
seed), in episodes of the task's length; the target checks (every
``check_every`` finished episodes, 5 when left None) and the final train and
held-out returns run its deterministic policy from the task's start states,
off the budget, in a second env of this process. Needs the ``bench`` extra
(stable-baselines3).
"""

from __future__ import annotations

from typing import Any, Optional

from genesis_fp16.base.extras import require

from agents.tasks import Task
from .common import BaselineConfig, Clock, TargetWatch, baseline_report, target_states
from .rollout import EpisodeRunner, mean_return

PURPOSE = "the SAC baseline"
CHECK_EVERY = 5


def sac_steps(
    cfg: BaselineConfig, episode_steps: int, total_steps: Optional[int], max_steps: Optional[int]
) -> tuple[int, int]:
    """(env steps asked for, env steps SAC will run): ``total_steps``, else
    the config's env-step budget, else its episode budget at full length; at most ``max_steps``."""
    asked = (
        total_steps
        if total_steps is not None
        else cfg.budget_steps
        if cfg.budget_steps is not None
        else cfg.budget * episode_steps
    )
    if asked < 1:
        raise ValueError(f"total_steps={asked}: expected at least 1 env step")
    if max_steps is not None and max_steps < 1:
        raise ValueError(f"max_steps={max_steps}: expected at least 1 env step, or None (no cap)")
    return asked, min(asked, max_steps) if max_steps is not None else asked


def run_sac(
    cfg: Optional[BaselineConfig] = None,
    *,
    total_steps: Optional[int] = None,
    max_steps: Optional[int] = None,
    task: Optional[Task] = None,
) -> dict[str, Any]:
    """SAC for ``total_steps`` env steps (see `sac_steps`), capped at
    ``max_steps``; the report's method is ``sac`` and its settings say when it was capped."""
    sb3 = require("stable_baselines3", PURPOSE)
    require("gymnasium", PURPOSE)
    from gymnasium.wrappers import TimeLimit
    from stable_baselines3.common.callbacks import BaseCallback

    cfg = cfg or BaselineConfig()
    resolved = cfg.resolve(task)
    asked, steps = sac_steps(cfg, resolved.episode_steps, total_steps, max_steps)
    starts = resolved.start_states(cfg.seed)
    check_states, checked_on = target_states(starts)
    watch = TargetWatch(resolved.target, every=cfg.check_every or CHECK_EVERY)
    clock = Clock()
    runner = EpisodeRunner(resolved.episode_spec)
    env = TimeLimit(resolved.task.make_env(), max_episode_steps=resolved.episode_steps)
    model = sb3.SAC("MlpPolicy", env, seed=cfg.seed, verbose=0)

    def policy(obs: Any) -> Any:
        return model.predict(obs, deterministic=True)[0]

    class Watch(BaseCallback):
        episodes = 0

        def _on_step(self) -> bool:
            if not self.locals["dones"][0]:
                return True
            self.episodes += 1
            if watch.due(self.episodes):
                watch.record(
                    self.episodes, self.episodes, self.num_timesteps, mean_return(runner.evaluate(policy, check_states))
                )
            return not (watch.reached and cfg.stop_at_target)

    callback = Watch()
    try:
        model.learn(total_timesteps=steps, callback=callback)
        train = mean_return(runner.evaluate(policy, starts.train))
        heldout = mean_return(runner.evaluate(policy, starts.heldout))
    finally:
        runner.close()
        env.close()
    settings = {
        "algorithm": "SAC",
        "stable_baselines3": sb3.__version__,
        "hyperparameters": "Stable-Baselines3 defaults (MlpPolicy)",
        "device": str(model.device),
        "steps_asked": asked,
        "steps_run": steps,
        "capped": steps < asked,
        "training_starts": "the env's own resets, seeded once with the run's seed",
    }
    report = baseline_report(
        "sac",
        cfg,
        resolved,
        starts,
        watch=watch,
        checked_on=checked_on,
        real_episodes=callback.episodes,
        env_steps=int(model.num_timesteps),
        train_return=train,
        heldout_return=heldout,
        clock=clock,
        settings=settings,
    )
    if steps < asked:
        report["stop_detail"] += f"; capped at {steps} of the {asked} env steps asked (max_steps)"
    return report

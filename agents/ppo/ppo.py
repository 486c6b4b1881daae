"""PPO (clipped objective, GAE, value loss, entropy bonus, advantage
normalisation, linear LR annealing) over gymnasium vector environments,
for discrete and continuous actions. Reads top to bottom like CleanRL's
``ppo.py``: set-up, the rollout, the loss, the update, evaluation. The update
step goes through `FP16Trainer` (autocast, gradient scaler, clipping,
checkpoints); the policy is `ActorCritic`.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from genesis_fp16.extras import require
from genesis_fp16.telemetry import get_logger
from genesis_fp16.trainer import FP16Trainer

from .config import PPOConfig, as_dict
from .envs import ActionRepeat, VecEnvChoice, build_envs, check_spaces
from .guarding import PPOGuard
from .loss import LossSettings, ppo_loss
from .policy import ActorCritic, CompiledFallback
from .results import TrainResult
from .rollout import RolloutBuffer, RunningMeanStd, check_extra, load_normalisers, sample_minibatch

gym = require("gymnasium", "genesis-fp16 ppo")


def _log():
    # looked up per call: the telemetry configuration (sinks) may change after import
    return get_logger("agents.ppo")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"training.device={name!r}: CUDA is not available on this machine; use auto or cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"training.device={name!r}: this machine has {torch.cuda.device_count()} visible CUDA device(s)")
    return device


class PPO:
    """Build with a config, call `train`, then `evaluate`."""

    def __init__(self, cfg: PPOConfig, envs: Optional[gym.vector.VectorEnv] = None, vec_choice: Optional[VecEnvChoice] = None) -> None:
        self.cfg = cfg
        opts = cfg.optimizations
        self.device = resolve_device(cfg.device)
        if opts.num_workers > 0:
            torch.set_num_threads(opts.num_workers)
        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed)
        if envs is None:
            envs, vec_choice = build_envs(cfg.env_id, cfg.num_envs, cfg.seed, opts)
        self.envs = envs
        self.vec_choice = vec_choice
        check_spaces(envs, cfg.env_id)
        act_space = envs.single_action_space
        self.discrete = isinstance(act_space, gym.spaces.Discrete)
        self.obs_dim = int(np.prod(envs.single_observation_space.shape))
        self.act_shape: tuple[int, ...] = () if self.discrete else tuple(act_space.shape)
        act_dim = int(act_space.n) if self.discrete else int(np.prod(act_space.shape))
        if not self.discrete:
            self.act_low, self.act_high = act_space.low, act_space.high
        self.net = ActorCritic(self.obs_dim, act_dim, self.discrete, cfg.hidden_size).to(self.device)
        # fused Adam: one kernel over all parameters; torch's CPU default is a
        # per-tensor Python loop, which shows in a launch-bound update
        optimizer = torch.optim.Adam(self.net.parameters(), lr=cfg.learning_rate, eps=1e-5, fused=True)
        overrides = {"max_grad_norm": cfg.max_grad_norm}
        self.obs_rms = RunningMeanStd((self.obs_dim,)) if cfg.normalize_obs else None
        self.ret_rms = RunningMeanStd(()) if cfg.normalize_reward else None
        self._ret_acc = np.zeros(cfg.num_envs)
        self.noise_gen = torch.Generator().manual_seed(cfg.seed)
        self.forward, self.actor = self.net.forward, self.net.actor
        self.loss_settings = LossSettings.of(cfg)
        if opts.use_torch_compile:
            self.forward = CompiledFallback(self.net.forward, opts.compile_mode, "ActorCritic.forward")
            self.actor = CompiledFallback(self.net.actor, opts.compile_mode, "ActorCritic.actor")
        self.pin = opts.use_pinned_memory and self.device.type == "cuda"
        self.buffer = RolloutBuffer(cfg.num_steps, cfg.num_envs, self.obs_dim, self.act_shape, self.discrete, self.pin)
        sample = (sample_minibatch(cfg.minibatch_size, self.obs_dim, act_dim, self.act_shape, self.discrete, self.device),
                  lambda net, mb: self._loss(net, mb)[0])  # a measured auto times it, before the trainer exists
        self.guard = PPOGuard("ppo", self.net, optimizer, opts.precision, overrides, self.save_checkpoint, self._restore, seed=cfg.seed, sample=sample)
        self.global_step = 0
        self.iteration = 0
        self.time_split = {"env": 0.0, "inference": 0.0, "update": 0.0, "other": 0.0}
        self.episode_returns: list[float] = []
        self.history: list[dict[str, Any]] = []

    trainer = property(lambda self: self.guard.trainer, doc="The trainer in use: the guard's (a new FP32 one after a rollback).")

    # -- observations, actions, rewards ------------------------------------------
    def _prep_obs(self, obs: np.ndarray, update_stats: bool = True) -> np.ndarray:
        obs = np.asarray(obs, dtype=np.float32).reshape(obs.shape[0], -1)
        if self.obs_rms is not None:
            if update_stats:
                self.obs_rms.update(obs)
            obs = np.clip((obs - self.obs_rms.mean) / np.sqrt(self.obs_rms.var + 1e-8), -10, 10).astype(np.float32)
        return obs

    def _to_device(self, host: torch.Tensor, staging: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.device.type == "cpu":
            return host
        if self.pin and staging is not None:
            staging.copy_(host)
            return staging.to(self.device, non_blocking=True)
        return host.to(self.device, non_blocking=self.pin)

    def _draw_noise(self) -> torch.Tensor:
        """One rollout's sampling noise, (num_steps, num_envs, ...), drawn at once from the run's generator."""
        t, n = self.cfg.num_steps, self.cfg.num_envs
        if self.discrete:
            return torch.rand((t, n, self.net.actor_head.out_features), generator=self.noise_gen)
        return torch.randn((t, n, *self.act_shape), generator=self.noise_gen)

    @torch.inference_mode()
    def act(self, obs: torch.Tensor, perturbation: torch.Tensor) -> torch.Tensor:
        """Actions for a batch of host observations: the actor's output plus
        this step's perturbation (`ActorCritic.perturbation`), honouring
        ``batch_inference`` / ``inference_batch_size``. On the host."""
        o = self.cfg.optimizations
        n = obs.shape[0]
        chunk = (o.inference_batch_size or n) if o.batch_inference else 1
        if chunk >= n:  # one forward: no slicing or concatenation (per-op dispatch shows at 8 envs)
            x = self._to_device(obs, self.buffer.obs_stage if self.pin else None)
            return self.net.pick(self.actor(x), perturbation.to(self.device, non_blocking=self.pin)).cpu()
        acts = []
        for start in range(0, n, chunk):
            sl = slice(start, min(n, start + chunk))
            x = self._to_device(obs[sl], self.buffer.obs_stage[sl] if self.pin else None)
            # pick makes a new tensor: a compiled actor's static output buffer (CUDA graphs) may be overwritten next call
            acts.append(self.net.pick(self.actor(x), perturbation[sl].to(self.device, non_blocking=self.pin)))
        return torch.cat(acts).cpu()

    def _rollout_actor(self, perturbation: torch.Tensor) -> Callable[[torch.Tensor, int], torch.Tensor]:
        """Step ``t``'s actions in this rollout: `act` with ``perturbation[t]``, or on a CPU with one
        forward for all envs and no compiled actor `ActorCritic.rollout_actor` (the same, in fewer ops)."""
        o = self.cfg.optimizations
        one_forward = o.batch_inference and (o.inference_batch_size or self.cfg.num_envs) >= self.cfg.num_envs
        if self.device.type == "cpu" and one_forward and not isinstance(self.actor, CompiledFallback):
            return self.net.rollout_actor(perturbation)
        return lambda obs, t: self.act(obs, perturbation[t])

    @torch.inference_mode()
    def _score_rollout(self) -> None:
        """The rollout's log-probabilities and values, in one forward over all
        of it (the policy does not change during a rollout), into the buffer."""
        b = self.buffer
        out, value = self.forward(self._to_device(b.obs.view(-1, self.obs_dim)))
        acts = self._to_device(b.act.view(-1, *self.act_shape))
        logp, _ = self.net.log_prob_entropy(out, acts, with_entropy=False)
        b.logp.copy_(logp.view_as(b.logp))
        b.val.copy_(value.float().view_as(b.val))

    @torch.inference_mode()
    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """Critic values of host observations, on the host."""
        _, value = self.net(self._to_device(obs))
        return value.float().cpu()

    def _env_action(self, action: torch.Tensor) -> np.ndarray:
        a = action.numpy()
        return a if self.discrete else np.clip(a, self.act_low, self.act_high)

    def _scale_reward(self, reward: np.ndarray, done: np.ndarray) -> np.ndarray:
        if self.ret_rms is None:
            return reward
        self._ret_acc = self._ret_acc * self.cfg.gamma + reward
        self.ret_rms.update(self._ret_acc)
        self._ret_acc[done] = 0.0
        return np.clip(reward / np.sqrt(self.ret_rms.var + 1e-8), -10, 10)

    # -- training --------------------------------------------------------------------
    def train(self, callback: Optional[Callable[[dict[str, Any]], None]] = None) -> TrainResult:
        cfg = self.cfg
        n = cfg.num_envs
        repeat = cfg.optimizations.action_repeat
        t_start = time.perf_counter()
        obs_np, _ = self.envs.reset(seed=cfg.seed)
        obs = torch.from_numpy(self._prep_obs(obs_np))
        ep_ret = np.zeros(n)
        split = self.time_split
        rows = self.buffer.rows
        self.guard.start()
        for iteration in range(1, cfg.num_iterations + 1):
            if cfg.anneal_lr:
                for group in self.trainer.optimizer.param_groups:
                    group["lr"] = cfg.learning_rate * (1.0 - (iteration - 1.0) / cfg.num_iterations)
            t0 = time.perf_counter()
            with torch.inference_mode():
                perturbation = self.net.perturbation(self._draw_noise())
            actor = self._rollout_actor(perturbation)
            split["inference"] += time.perf_counter() - t0
            for step in range(cfg.num_steps):
                t0 = time.perf_counter()
                action = actor(obs, step)
                t1 = time.perf_counter()
                next_obs_np, reward, terminated, truncated, infos = self.envs.step(self._env_action(action))
                t2 = time.perf_counter()
                done = np.logical_or(terminated, truncated)
                ep_ret += reward
                reward_used = self._scale_reward(np.asarray(reward, dtype=np.float64), done)
                if truncated.any():
                    # bootstrap truncated (time-limit) episodes from the final observation's value
                    idx = np.nonzero(truncated & ~terminated)[0]
                    if idx.size:
                        final = np.stack([infos["final_obs"][i] for i in idx])
                        final_v = self.value(torch.from_numpy(self._prep_obs(final, update_stats=False)))
                        reward_used = reward_used.copy()
                        reward_used[idx] += cfg.gamma * final_v.numpy()
                rows["obs"][step] = obs.numpy()
                rows["act"][step] = action.numpy()
                rows["rew"][step] = reward_used
                rows["done"][step] = done
                if done.any():
                    for i in np.nonzero(done)[0]:
                        self.episode_returns.append(float(ep_ret[i]))
                    ep_ret[done] = 0.0
                obs = torch.from_numpy(self._prep_obs(next_obs_np))
                t3 = time.perf_counter()
                split["inference"] += t1 - t0
                split["env"] += t2 - t1
                split["other"] += t3 - t2
                self.global_step += n * repeat
            t0 = time.perf_counter()
            self._score_rollout()
            t1 = time.perf_counter()
            advantages, returns = self.buffer.gae(self.value(obs), cfg.gamma, cfg.gae_lambda)
            split["inference"] += t1 - t0
            split["other"] += time.perf_counter() - t1
            t0 = time.perf_counter()
            self.guard.begin_iteration()
            metrics = self._update(advantages, returns)
            self.guard.end_iteration()
            split["update"] += time.perf_counter() - t0
            self.iteration = iteration
            elapsed = time.perf_counter() - t_start
            recent = self.episode_returns[-20:]
            record = {
                "iteration": iteration,
                "global_step": self.global_step,
                "env_steps_per_s": self.global_step / elapsed,
                "mean_return": float(np.mean(recent)) if recent else None,
                **metrics,
            }
            self.history.append(record)
            _log().info("ppo.iteration", **record, loss_scale=self.trainer.current_scale, overflow_rate=self.trainer.overflow_rate)
            if callback is not None:
                callback(record)
        wall = time.perf_counter() - t_start
        _log().info(
            "ppo.trained", env=cfg.env_id, seed=cfg.seed, env_steps=self.global_step, wall_s=round(wall, 3),
            env_steps_per_s=round(self.global_step / wall, 1),
        )
        return TrainResult(
            env_id=cfg.env_id, seed=cfg.seed, env_steps=self.global_step, wall_s=wall,
            env_steps_per_s=self.global_step / wall, time_split_s=dict(split),
            episode_returns=list(self.episode_returns), eval_return=None, eval_returns=[],
            optimizations=self.resolved_optimizations(), trainer_stats=self.trainer.get_stats(),
            iterations=self.iteration, history=self.history,
        )

    def _loss(self, net: ActorCritic, mb: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(loss, diagnostics) for one minibatch (`agents.ppo.loss`)."""
        return ppo_loss(net, self.forward if net is self.net else net, mb, self.loss_settings)  # a copy (auto's calibration): its own

    def _update(self, advantages: torch.Tensor, returns: torch.Tensor) -> dict[str, Any]:
        """``update_epochs`` passes over the rollout in shuffled minibatches;
        returns the last minibatch's diagnostics and the step counts."""
        cfg = self.cfg
        b = cfg.batch_size
        data = self.buffer.flat(advantages, returns)
        self.guard.hold(data)
        if self.device.type != "cpu":
            data = {k: v.to(self.device, non_blocking=self.pin) for k, v in data.items()}
        skipped = 0
        steps = 0
        diagnostics: dict[str, torch.Tensor] = {}  # the last minibatch's, filled in by loss_fn

        def loss_fn(net: ActorCritic, mb: dict[str, torch.Tensor]) -> torch.Tensor:
            loss, last = self._loss(net, mb)
            return diagnostics.update(last) or loss
        gen = torch.Generator().manual_seed(cfg.seed * 100_003 + self.iteration)
        for _epoch in range(cfg.update_epochs):
            perm = torch.randperm(b, generator=gen)
            if self.device.type != "cpu":
                perm = perm.to(self.device, non_blocking=True)
            shuffled = {k: v[perm] for k, v in data.items()}  # one gather per epoch; minibatches are views
            for start in range(0, b, cfg.minibatch_size):
                mb = {k: v[start : start + cfg.minibatch_size] for k, v in shuffled.items()}
                ok = self.guard.step(mb, loss_fn)  # a P0 trip is rolled back inside: FP32 from here on
                steps += 1
                skipped += 0 if ok else 1
            if cfg.target_kl is not None and float(diagnostics["approx_kl"]) > cfg.target_kl:
                break
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return {**{k: float(v) for k, v in diagnostics.items()}, "update_steps": steps, "skipped_steps": skipped}

    # -- evaluation and checkpoints ----------------------------------------------------
    def evaluate(self, episodes: Optional[int] = None, seed: Optional[int] = None) -> list[float]:
        """Deterministic episodes (argmax / mean action) on a fresh single env."""
        episodes = self.cfg.eval_episodes if episodes is None else episodes
        seed = self.cfg.seed + 10_000 if seed is None else seed
        env = gym.make(self.cfg.env_id)
        if self.cfg.optimizations.action_repeat > 1:
            env = ActionRepeat(env, self.cfg.optimizations.action_repeat)
        returns = []
        try:
            for ep in range(episodes):
                obs, _ = env.reset(seed=seed + ep)
                total, done = 0.0, False
                while not done:
                    x = torch.from_numpy(self._prep_obs(np.asarray(obs)[None], update_stats=False))
                    with torch.inference_mode():
                        out, _ = self.net(self._to_device(x))
                    if self.discrete:
                        action = int(out.argmax(-1).item())
                    else:
                        action = np.clip(out.float().cpu().numpy()[0], self.act_low, self.act_high)
                    obs, reward, terminated, truncated, _ = env.step(action)
                    total += float(reward)
                    done = terminated or truncated
                returns.append(total)
        finally:
            env.close()
        return returns

    def save_checkpoint(self, path: str | Path) -> Path:
        extra = {
            "config": as_dict(self.cfg),
            "global_step": self.global_step,
            "iteration": self.iteration,
            "obs_rms": None if self.obs_rms is None else self.obs_rms.state_dict(),
            "ret_rms": None if self.ret_rms is None else self.ret_rms.state_dict(),
        }
        return self.trainer.save_checkpoint(path, extra=extra)

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        extra = self._restore(path, restore_rng=True)
        self.global_step = int(extra.get("global_step", 0))
        self.iteration = int(extra.get("iteration", 0))
        return extra

    def _restore(self, path: str | Path, restore_rng: bool = False, trainer: Optional[FP16Trainer] = None) -> dict[str, Any]:
        """Weights, optimizer and normalisation statistics into ``trainer`` (default: the current one); the counters stay."""
        normalisers = (self.obs_rms, self.ret_rms)  # checked with the checkpoint, before the trainer changes anything
        extra = (trainer or self.trainer).load_checkpoint(path, restore_rng=restore_rng, check_extra=partial(check_extra, normalisers=normalisers))
        load_normalisers(extra, normalisers)
        return extra

    # -- reporting ---------------------------------------------------------------------
    def optimization_summary(self) -> list[tuple[str, str]]:
        """One (name, state) line per optimization, printed at start."""
        o = self.cfg.optimizations
        vec = self.vec_choice
        rows = [
            ("vectorized envs", f"{vec.mode if vec else type(self.envs).__name__} x{self.cfg.num_envs} ({vec.reason if vec else 'given'})"),
            (
                "AMP",
                f"on: {self.trainer.precision.name} autocast" + (", gradient scaler" if self.trainer.scaler.is_enabled() else "")
                if self.trainer.precision.name != "fp32"
                else "off" if o.precision == "fp32" else f"off ({self.guard.training.decision.line()})",
            ),
            ("torch.compile", self._compile_state()),
            (
                "pinned memory",
                "on (pinned buffers, non_blocking copies)" if self.pin else ("off (CPU device: nothing to copy)" if o.use_pinned_memory else "off"),
            ),
            ("num_workers (torch threads)", f"{torch.get_num_threads()}" + (" (set)" if o.num_workers else " (torch default)")),
            (
                "batched inference",
                f"on, {o.inference_batch_size or self.cfg.num_envs} envs per forward" if o.batch_inference else "off (one forward per env)",
            ),
            ("action repeat", f"{o.action_repeat}" + (" (off)" if o.action_repeat == 1 else " (rewards summed)")),
        ]
        return rows

    def _compile_state(self) -> str:
        compiled = [f for f in (self.forward, self.actor) if isinstance(f, CompiledFallback)]
        if not compiled:
            return "off"
        failed = [f"{f.name}: {f.failed_reason}" for f in compiled if not f.active]
        if not failed:
            return f"on (mode {compiled[0].mode})" if compiled[0].mode != "default" else "on"
        return f"fallback to eager ({'; '.join(failed)})"

    def resolved_optimizations(self) -> dict[str, Any]:
        o = as_dict(self.cfg)["optimizations"]
        o["resolved"] = {name: state for name, state in self.optimization_summary()}
        o["vec_env_resolved"] = self.vec_choice.mode if self.vec_choice else None
        o["precision_requested"] = o["precision"]
        o["precision"] = self.trainer.precision.name
        o["compile_active"] = all(isinstance(f, CompiledFallback) and f.active for f in (self.forward, self.actor))
        o["pinned_active"] = self.pin
        return o

    def close(self) -> None:
        self.envs.close()


def run(cfg: PPOConfig, callback: Optional[Callable[[dict[str, Any]], None]] = None, evaluate: bool = True) -> TrainResult:
    """Train and (optionally) evaluate; closes the envs."""
    ppo = PPO(cfg)
    try:
        result = ppo.train(callback)
        if evaluate and cfg.eval_episodes:
            result.eval_returns = ppo.evaluate()
            result.eval_return = float(np.mean(result.eval_returns))
    finally:
        ppo.close()
    return result

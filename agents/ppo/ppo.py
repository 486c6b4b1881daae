"""PPO (clipped objective, GAE, value loss, entropy bonus, advantage
normalisation, linear LR annealing) over gymnasium vector environments, for
discrete and continuous actions, top to bottom like CleanRL's ``ppo.py``: the
network, the loss, then set-up, rollout, GAE and the minibatch update. The
update goes through `FP16Trainer` (autocast, gradient scaler, clipping) behind
the rollback guard. This file is what PPO means here; the CPU fast path
(`agents.ppo.fast`, ``optimizations.cpu_fast_path``) computes the same forward,
loss and rollout actions in fewer operations.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from genesis_fp16.base.extras import require
from genesis_fp16.base.seeds import torch_generator
from genesis_fp16.base.telemetry import get_logger
from genesis_fp16.training.trainer import FP16Trainer

from .config import PPOConfig, as_dict
from .envs import ActionRepeat, VecEnvChoice, build_envs, check_spaces
from .fast import PIECES, FastPath, MujocoVectorEnv, lean_mujoco_supported, tanh
from .guarding import PPOGuard
from .results import CompiledFallback, TrainResult, optimization_summary, resolved_optimizations
from .rollout import RolloutBuffer, RunningMeanStd, check_extra, load_normalisers, sample_minibatch

gym = require("gymnasium", "genesis-fp16 ppo")
Diagnostics = dict[str, torch.Tensor]


def _log():
    return get_logger("agents.ppo")  # looked up per call: the telemetry sinks may change after import


def _layer(inp: int, out: int, std: float, generator: Optional[torch.Generator] = None) -> nn.Linear:
    layer = nn.Linear(inp, out)
    nn.init.orthogonal_(layer.weight, std, generator=generator)
    nn.init.constant_(layer.bias, 0.0)
    return layer


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs (two `fast.tanh` layers each, orthogonal init: SB3's default ``MlpPolicy``),
    stacked so both towers run in one matmul per layer (half the launches; a 64-unit MLP is launch-bound): rows
    ``[:hidden]`` of ``w1`` and ``w2[0]`` are the actor's, the rest the critic's; no weight is shared. Sampling is
    ``pick(out, perturbation(noise))``, noise drawn for a whole rollout at once (Gumbel-max for discrete actions,
    ``mean + std * eps`` for continuous), so chunked inference picks batched inference's actions; no
    ``torch.distributions`` (its argument checks cost more than this forward). ``generator``: what the orthogonal
    init draws from (PPO passes its seed's ``ppo.init`` stream; None: torch's global generator, as torch's layers)."""

    def __init__(
        self, obs_dim: int, act_dim: int, discrete: bool, hidden: int = 64, generator: Optional[torch.Generator] = None
    ) -> None:
        super().__init__()
        self.discrete, self.hidden = discrete, hidden
        self.w1 = nn.Parameter(torch.empty(2 * hidden, obs_dim))
        self.b1 = nn.Parameter(torch.zeros(2 * hidden))
        self.w2 = nn.Parameter(torch.empty(2, hidden, hidden))  # [actor, critic], (in, out)
        self.b2 = nn.Parameter(torch.zeros(2, 1, hidden))
        self.actor_head, self.critic_head = _layer(hidden, act_dim, 0.01, generator), _layer(hidden, 1, 1.0, generator)
        for block in (self.w1.data[:hidden], self.w1.data[hidden:], self.w2.data[0], self.w2.data[1]):
            nn.init.orthogonal_(block, math.sqrt(2), generator=generator)
        self.log_std = nn.Parameter(torch.zeros(act_dim), requires_grad=not discrete)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(actor output: logits or mean, value)."""
        h = tanh(torch.addmm(self.b1, obs, self.w1.t()))  # (B, 2H): both first layers
        h = tanh(torch.baddbmm(self.b2, h.view(-1, 2, self.hidden).transpose(0, 1), self.w2))  # (2, B, H)
        return F.linear(h[0], self.actor_head.weight, self.actor_head.bias), F.linear(
            h[1], self.critic_head.weight, self.critic_head.bias
        ).squeeze(-1)

    def log_prob_entropy(
        self, out: torch.Tensor, actions: torch.Tensor, with_entropy: bool = True
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Log-probability of ``actions`` and the entropy (None when not asked for), in float32."""
        out = out.float()
        if self.discrete:
            logp_all = torch.log_softmax(out, dim=-1)
            logp = logp_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
            return logp, -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
        log_std = self.log_std.float().expand_as(out)
        std = log_std.exp()
        logp = (-((actions - out) ** 2) / (2 * std * std) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        return logp, (0.5 + 0.5 * math.log(2 * math.pi) + log_std).sum(-1) if with_entropy else None

    def perturbation(self, noise: torch.Tensor) -> torch.Tensor:
        """What sampling adds to the actor output, on the noise's device (the host): Gumbel noise from uniform noise
        (discrete), std * noise (continuous)."""
        if self.discrete:
            return -torch.log(-torch.log(noise.clamp(1e-20, 1.0 - 1e-7)))
        return self.log_std.detach().float().exp().to(noise.device) * noise

    def pick(self, out: torch.Tensor, perturbation: torch.Tensor) -> torch.Tensor:
        out = out.float() + perturbation
        return torch.argmax(out, dim=-1) if self.discrete else out


@dataclass(frozen=True)
class LossSettings:
    clip_coef: float
    vf_coef: float
    ent_coef: float
    norm_adv: bool
    clip_vloss: bool

    @classmethod
    def of(cls, cfg: Any) -> "LossSettings":
        return cls(
            float(cfg.clip_coef), float(cfg.vf_coef), float(cfg.ent_coef), bool(cfg.norm_adv), bool(cfg.clip_vloss)
        )


def ppo_loss(
    net: ActorCritic, out: torch.Tensor, value: torch.Tensor, mb: Diagnostics, s: LossSettings
) -> tuple[torch.Tensor, Diagnostics]:
    """``pg_loss + vf_coef * MSE(value, return) - ent_coef * entropy`` from the network's outputs, as
    Stable-Baselines3 writes it (CleanRL halves the MSE: its vf_coef 0.5 is 0.25 here), and the
    detached diagnostics pg_loss, v_loss, entropy, approx_kl."""
    newlogp, entropy = net.log_prob_entropy(out, mb["act"])
    logratio = newlogp - mb["logp"]
    ratio = logratio.exp()
    adv = mb["adv"]
    if s.norm_adv:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    pg_loss = -torch.min(adv * ratio, adv * ratio.clamp(1 - s.clip_coef, 1 + s.clip_coef)).mean()
    value = value.float()
    if s.clip_vloss:
        v_clipped = mb["val"] + torch.clamp(value - mb["val"], -s.clip_coef, s.clip_coef)
        v_loss = torch.max((value - mb["ret"]) ** 2, (v_clipped - mb["ret"]) ** 2).mean()
    else:
        v_loss = (value - mb["ret"]).square().mean()
    entropy = entropy.mean()
    loss = pg_loss + s.vf_coef * v_loss - s.ent_coef * entropy
    with torch.no_grad():
        approx_kl = ((ratio - 1) - logratio).mean()
    return loss, {
        "pg_loss": pg_loss.detach(),
        "v_loss": v_loss.detach(),
        "entropy": entropy.detach(),
        "approx_kl": approx_kl,
    }


def gae(
    rew: np.ndarray, val: np.ndarray, done: np.ndarray, next_value: np.ndarray, gamma: float, lam: float
) -> np.ndarray:
    """Advantages by generalised advantage estimation over ``(num_steps, num_envs)`` arrays; ``done[t]``
    marks that the episode ended at step t (the stored obs at t+1 is a reset one)."""
    adv = np.zeros_like(rew)
    last = np.zeros(rew.shape[1], dtype=np.float32)
    for t in reversed(range(rew.shape[0])):
        next_v = next_value if t == rew.shape[0] - 1 else val[t + 1]
        nonterminal = 1.0 - done[t]
        last = rew[t] + gamma * next_v * nonterminal - val[t] + gamma * lam * nonterminal * last
        adv[t] = last
    return adv


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"training.device={name!r}: CUDA is not available on this machine; use auto or cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(
            f"training.device={name!r}: this machine has {torch.cuda.device_count()} visible CUDA device(s)"
        )
    return device


class PPO:
    """Build with a config, call `train`, then `evaluate`."""

    def __init__(
        self,
        cfg: PPOConfig,
        envs: Optional[gym.vector.VectorEnv] = None,
        vec_choice: Optional[VecEnvChoice] = None,
        fast_pieces: tuple[str, ...] = PIECES,
    ) -> None:
        self.cfg = cfg
        opts = cfg.optimizations
        self.device = resolve_device(cfg.device)
        if opts.num_workers > 0:
            torch.set_num_threads(opts.num_workers)
        fast_on = opts.cpu_fast_path and self.device.type == "cpu" and not opts.use_torch_compile
        if envs is None:
            lean = fast_on and "lean_mujoco" in fast_pieces and lean_mujoco_supported(cfg.env_id)
            envs, vec_choice = build_envs(
                cfg.env_id, cfg.num_envs, cfg.seed, opts, lean=MujocoVectorEnv if lean else None
            )
        self.envs, self.vec_choice = envs, vec_choice
        check_spaces(envs, cfg.env_id)
        act_space = envs.single_action_space
        self.discrete = isinstance(act_space, gym.spaces.Discrete)
        self.obs_dim = int(np.prod(envs.single_observation_space.shape))
        self.act_shape: tuple[int, ...] = () if self.discrete else tuple(act_space.shape)
        act_dim = int(act_space.n) if self.discrete else int(np.prod(act_space.shape))
        if not self.discrete:
            self.act_low, self.act_high = act_space.low, act_space.high
        self.net = ActorCritic(
            self.obs_dim, act_dim, self.discrete, cfg.hidden_size, torch_generator(cfg.seed, "ppo.init")
        ).to(self.device)
        self.fast = FastPath(self.net, fast_pieces) if fast_on else None
        self.forward: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] = (
            self.fast.forward if self.fast else self.net.forward
        )
        if opts.use_torch_compile:
            self.forward = CompiledFallback(self.net.forward, opts.compile_mode, "ActorCritic.forward")
        self.loss_settings = LossSettings.of(cfg)
        self.obs_rms = RunningMeanStd((self.obs_dim,)) if cfg.normalize_obs else None
        self.ret_rms = RunningMeanStd(()) if cfg.normalize_reward else None
        self._ret_acc = np.zeros(cfg.num_envs)
        self.noise_gen = torch_generator(cfg.seed, "ppo.noise")
        self.pin = opts.use_pinned_memory and self.device.type == "cuda"
        self.buffer = RolloutBuffer(cfg.num_steps, cfg.num_envs, self.obs_dim, self.act_shape, self.discrete, self.pin)
        # fused Adam: one kernel over all parameters (torch's CPU default is a per-tensor Python loop)
        optimizer = torch.optim.Adam(self.net.parameters(), lr=cfg.learning_rate, eps=1e-5, fused=True)
        sample = (
            sample_minibatch(cfg.minibatch_size, self.obs_dim, act_dim, self.act_shape, self.discrete, self.device),
            lambda net, mb: self._loss(net, mb)[0],
        )  # a measured auto times the update before the trainer exists
        self.guard = PPOGuard(
            "ppo",
            self.net,
            optimizer,
            opts.precision,
            {"max_grad_norm": cfg.max_grad_norm},
            self.save_checkpoint,
            self._restore,
            seed=cfg.seed,
            sample=sample,
        )
        self.global_step = self.iteration = 0
        self.time_split = {"env": 0.0, "inference": 0.0, "update": 0.0, "other": 0.0}
        self.episode_returns: list[float] = []
        self.history: list[dict[str, Any]] = []

    trainer = property(
        lambda self: self.guard.trainer, doc="The trainer in use: the guard's (a new FP32 one after a rollback)."
    )

    # -- observations, actions, rewards ------------------------------------------------
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
            return staging.copy_(host).to(self.device, non_blocking=True)
        return host.to(self.device, non_blocking=self.pin)

    def _draw_noise(self) -> torch.Tensor:
        """One rollout's sampling noise, (num_steps, num_envs, ...), drawn at once from the run's generator."""
        shape = (
            self.cfg.num_steps,
            self.cfg.num_envs,
            *((self.net.actor_head.out_features,) if self.discrete else self.act_shape),
        )
        return (
            torch.rand(shape, generator=self.noise_gen)
            if self.discrete
            else torch.randn(shape, generator=self.noise_gen)
        )

    @torch.inference_mode()
    def act(self, obs: torch.Tensor, perturbation: torch.Tensor) -> torch.Tensor:
        """Actions for host observations: ``pick(forward(obs)[0], perturbation)``, in chunks of
        ``inference_batch_size`` envs with ``batch_inference`` (else one env per forward). On the host."""
        o, n = self.cfg.optimizations, obs.shape[0]
        chunk = (o.inference_batch_size or n) if o.batch_inference else 1
        acts = []
        for start in range(0, n, chunk):
            sl = slice(start, min(n, start + chunk))
            x = self._to_device(obs[sl], self.buffer.obs_stage[sl] if self.pin else None)
            # pick makes a new tensor: a compiled forward's output buffer (CUDA graphs) may be overwritten next call
            acts.append(self.net.pick(self.forward(x)[0], perturbation[sl].to(self.device, non_blocking=self.pin)))
        return (acts[0] if len(acts) == 1 else torch.cat(acts)).cpu()

    def _rollout_actor(self, perturbation: torch.Tensor) -> Callable[[torch.Tensor, int], torch.Tensor]:
        o = self.cfg.optimizations
        if (
            self.fast is not None
            and o.batch_inference
            and (o.inference_batch_size or self.cfg.num_envs) >= self.cfg.num_envs
        ):
            step = self.fast.rollout_actor(perturbation)
            if step is not None:
                return step
        return lambda obs, t: self.act(obs, perturbation[t])

    @torch.inference_mode()
    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """Critic values of host observations, on the host."""
        return self.forward(self._to_device(obs))[1].float().cpu()

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

    # -- training ------------------------------------------------------------------------
    def train(self, callback: Optional[Callable[[dict[str, Any]], None]] = None) -> TrainResult:
        cfg, split = self.cfg, self.time_split
        t_start = time.perf_counter()
        obs = torch.from_numpy(self._prep_obs(self.envs.reset(seed=cfg.seed)[0]))
        ep_ret = np.zeros(cfg.num_envs)
        self.guard.start()
        for iteration in range(1, cfg.num_iterations + 1):
            if cfg.anneal_lr:
                for group in self.trainer.optimizer.param_groups:
                    group["lr"] = cfg.learning_rate * (1.0 - (iteration - 1.0) / cfg.num_iterations)
            obs, ep_ret = self._collect(obs, ep_ret)
            t0 = time.perf_counter()
            b = self.buffer
            with torch.inference_mode():  # log-probabilities and values in one forward (the policy did not change)
                out, val = self.forward(self._to_device(b.obs.view(-1, self.obs_dim)))
                logp, _ = self.net.log_prob_entropy(
                    out, self._to_device(b.act.view(-1, *self.act_shape)), with_entropy=False
                )
                b.logp.copy_(logp.view_as(b.logp))
                b.val.copy_(val.float().view_as(b.val))
            t1 = time.perf_counter()
            rows = b.rows
            advantages = torch.from_numpy(
                gae(rows["rew"], rows["val"], rows["done"], self.value(obs).numpy(), cfg.gamma, cfg.gae_lambda)
            )
            split["inference"] += t1 - t0
            split["other"] += time.perf_counter() - t1
            t0 = time.perf_counter()
            self.guard.begin_iteration()
            metrics = self._update(advantages, advantages + b.val)
            self.guard.end_iteration()
            split["update"] += time.perf_counter() - t0
            self.iteration = iteration
            recent = self.episode_returns[-20:]
            record = {
                "iteration": iteration,
                "global_step": self.global_step,
                "env_steps_per_s": self.global_step / (time.perf_counter() - t_start),
                "mean_return": float(np.mean(recent)) if recent else None,
                **metrics,
            }
            self.history.append(record)
            _log().info(
                "ppo.iteration",
                **record,
                loss_scale=self.trainer.current_scale,
                overflow_rate=self.trainer.overflow_rate,
            )
            if callback is not None:
                callback(record)
        wall = time.perf_counter() - t_start
        _log().info(
            "ppo.trained",
            env=cfg.env_id,
            seed=cfg.seed,
            env_steps=self.global_step,
            wall_s=round(wall, 3),
            env_steps_per_s=round(self.global_step / wall, 1),
        )
        return TrainResult(
            env_id=cfg.env_id,
            seed=cfg.seed,
            env_steps=self.global_step,
            wall_s=wall,
            env_steps_per_s=self.global_step / wall,
            time_split_s=dict(split),
            episode_returns=list(self.episode_returns),
            eval_return=None,
            eval_returns=[],
            optimizations=resolved_optimizations(self),
            trainer_stats=self.trainer.get_stats(),
            iterations=self.iteration,
            history=self.history,
        )

    def _collect(self, obs: torch.Tensor, ep_ret: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
        """One rollout of ``num_steps`` vector steps into the buffer; returns the next observation and the returns
        so far."""
        cfg, split, rows = self.cfg, self.time_split, self.buffer.rows
        t0 = time.perf_counter()
        with torch.inference_mode():
            actor = self._rollout_actor(self.net.perturbation(self._draw_noise()))
        split["inference"] += time.perf_counter() - t0
        for step in range(cfg.num_steps):
            t0 = time.perf_counter()
            action = actor(obs, step)
            t1 = time.perf_counter()
            next_obs, reward, terminated, truncated, infos = self.envs.step(self._env_action(action))
            t2 = time.perf_counter()
            done = np.logical_or(terminated, truncated)
            ep_ret += reward
            reward_used = self._scale_reward(np.asarray(reward, dtype=np.float64), done)
            if truncated.any() and (idx := np.nonzero(truncated & ~terminated)[0]).size:
                # bootstrap time-limit truncations from the final observation's value
                final = np.stack([infos["final_obs"][i] for i in idx])
                reward_used = reward_used.copy()
                reward_used[idx] += (
                    cfg.gamma * self.value(torch.from_numpy(self._prep_obs(final, update_stats=False))).numpy()
                )
            rows["obs"][step], rows["act"][step], rows["rew"][step], rows["done"][step] = (
                obs.numpy(),
                action.numpy(),
                reward_used,
                done,
            )
            if done.any():
                self.episode_returns.extend(ep_ret[done].tolist())
                ep_ret[done] = 0.0
            obs = torch.from_numpy(self._prep_obs(next_obs))
            split["inference"] += t1 - t0
            split["env"] += t2 - t1
            split["other"] += time.perf_counter() - t2
            self.global_step += cfg.num_envs * cfg.optimizations.action_repeat
        return obs, ep_ret

    def _loss(self, net: ActorCritic, mb: Diagnostics) -> tuple[torch.Tensor, Diagnostics]:
        """(loss, diagnostics) for one minibatch; a copy of the network (auto's calibration) runs the plain code."""
        out, value = self.forward(mb["obs"]) if net is self.net else net(mb["obs"])
        fused = (
            self.fast.loss(out, value, mb, self.loss_settings) if self.fast is not None and net is self.net else None
        )
        return fused if fused is not None else ppo_loss(net, out, value, mb, self.loss_settings)

    def _update(self, advantages: torch.Tensor, returns: torch.Tensor) -> dict[str, Any]:
        """``update_epochs`` passes over the rollout in shuffled minibatches; the last minibatch's diagnostics."""
        cfg, b = self.cfg, self.cfg.batch_size
        data = self.buffer.flat(advantages, returns)
        if self.device.type != "cpu":
            data = {k: v.to(self.device, non_blocking=self.pin) for k, v in data.items()}
        self.guard.hold(data)  # on the network's device: the canary runs the network on it
        steps = skipped = 0
        diagnostics: Diagnostics = {}

        def loss_fn(net: ActorCritic, mb: Diagnostics) -> torch.Tensor:
            loss, last = self._loss(net, mb)
            diagnostics.update(last)
            return loss

        gen = torch_generator(cfg.seed, "ppo.minibatches", self.iteration)
        for _epoch in range(cfg.update_epochs):
            perm = torch.randperm(b, generator=gen).to(self.device, non_blocking=True)
            shuffled = {k: v[perm] for k, v in data.items()}  # one gather per epoch; minibatches are views
            for start in range(0, b, cfg.minibatch_size):
                ok = self.guard.step({k: v[start : start + cfg.minibatch_size] for k, v in shuffled.items()}, loss_fn)
                steps, skipped = steps + 1, skipped + (not ok)  # a P0 trip is rolled back inside: FP32 from here on
            if cfg.target_kl is not None and float(diagnostics["approx_kl"]) > cfg.target_kl:
                break
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return {**{k: float(v) for k, v in diagnostics.items()}, "update_steps": steps, "skipped_steps": skipped}

    # -- evaluation and checkpoints ---------------------------------------------------------
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
                    with torch.inference_mode():
                        out, _ = self.net(
                            self._to_device(torch.from_numpy(self._prep_obs(np.asarray(obs)[None], update_stats=False)))
                        )
                    action = (
                        int(out.argmax(-1).item())
                        if self.discrete
                        else np.clip(out.float().cpu().numpy()[0], self.act_low, self.act_high)
                    )
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
        self.global_step, self.iteration = int(extra.get("global_step", 0)), int(extra.get("iteration", 0))
        return extra

    def _restore(
        self, path: str | Path, restore_rng: bool = False, trainer: Optional[FP16Trainer] = None
    ) -> dict[str, Any]:
        """Weights, optimizer and normalisation statistics into ``trainer`` (default: the current one); the counters
        stay."""
        normalisers = (self.obs_rms, self.ret_rms)  # checked with the checkpoint, before the trainer changes anything
        extra = (trainer or self.trainer).load_checkpoint(
            path, restore_rng=restore_rng, check_extra=partial(check_extra, normalisers=normalisers)
        )
        load_normalisers(extra, normalisers)
        return extra

    def optimization_summary(self) -> list[tuple[str, str]]:
        return optimization_summary(self)

    def close(self) -> None:
        self.envs.close()


def run(
    cfg: PPOConfig, callback: Optional[Callable[[dict[str, Any]], None]] = None, evaluate: bool = True
) -> TrainResult:
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

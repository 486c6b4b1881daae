"""PPO (clipped objective, GAE, value loss, entropy bonus, advantage
normalisation, linear LR annealing) over gymnasium vector environments,
for discrete and continuous actions. Reads top to bottom like CleanRL's
``ppo.py``; the update step goes through :class:`FP16Trainer` (autocast,
gradient scaler, clipping, checkpoints).

Speed notes (measured on a 2-core CPU, docs/PPO.md):
- sampling uses noise drawn for all envs at once from one generator
  (Gumbel-max for discrete, ``mean + std * eps`` for continuous), so chunked
  or per-env inference picks exactly the actions batched inference picks;
- no ``torch.distributions`` objects in the rollout loop (their argument
  validation costs more than the forward of a 64-unit MLP);
- rollout buffers are preallocated tensors; on CUDA they are pinned and copied
  to the device once per rollout with ``non_blocking=True``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from genesis_fp16.extras import require
from genesis_fp16.telemetry import get_logger

from .config import PPOConfig, as_dict
from .envs import ActionRepeat, VecEnvChoice, build_envs

gym = require("gymnasium", "genesis-fp16 ppo")

def _log():
    # looked up per call: the telemetry configuration (sinks) may change after import
    return get_logger("agents.ppo")


# -- network -------------------------------------------------------------------


def _layer(inp: int, out: int, std: float = math.sqrt(2)) -> nn.Linear:
    layer = nn.Linear(inp, out)
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, 0.0)
    return layer


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs (two tanh layers each, orthogonal init),
    the shape of SB3's default ``MlpPolicy`` so the benchmark compares like
    with like. The two towers are computed together: one matmul for both first
    layers (weights stacked) and one batched matmul for both second layers.
    That is exactly two independent MLPs (no weight is shared), with about
    half the kernel launches: a 64-unit MLP is launch-bound, not FLOP-bound
    (measured in docs/PPO.md)."""

    def __init__(self, obs_dim: int, act_dim: int, discrete: bool, hidden: int = 64) -> None:
        super().__init__()
        self.discrete = discrete
        self.hidden = hidden
        # rows [0:hidden] are the actor's first layer, rows [hidden:] the critic's
        self.w1 = nn.Parameter(torch.empty(2 * hidden, obs_dim))
        self.b1 = nn.Parameter(torch.zeros(2 * hidden))
        self.w2 = nn.Parameter(torch.empty(2, hidden, hidden))  # [actor, critic], (in, out)
        self.b2 = nn.Parameter(torch.zeros(2, 1, hidden))
        self.actor_head = _layer(hidden, act_dim, 0.01)
        self.critic_head = _layer(hidden, 1, 1.0)
        for block in (self.w1[:hidden], self.w1[hidden:]):
            nn.init.orthogonal_(block, math.sqrt(2))
        for i in range(2):
            nn.init.orthogonal_(self.w2.data[i], math.sqrt(2))
        self.log_std = nn.Parameter(torch.zeros(act_dim), requires_grad=not discrete)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(actor output: logits or mean, value)."""
        h = torch.tanh(torch.addmm(self.b1, obs, self.w1.t()))  # (B, 2H)
        h = h.view(-1, 2, self.hidden).transpose(0, 1)  # (2, B, H)
        h = torch.tanh(torch.baddbmm(self.b2, h, self.w2))
        # F.linear, not the modules' __call__: hook dispatch costs more than these matmuls
        out = F.linear(h[0], self.actor_head.weight, self.actor_head.bias)
        return out, F.linear(h[1], self.critic_head.weight, self.critic_head.bias).squeeze(-1)


def log_prob_entropy(
    net: ActorCritic, out: torch.Tensor, actions: torch.Tensor, with_entropy: bool = True
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Log-probability of ``actions`` and the entropy (None when not asked for), in float32."""
    out = out.float()
    if net.discrete:
        logp_all = torch.log_softmax(out, dim=-1)
        logp = logp_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
        return logp, entropy
    log_std = net.log_std.float().expand_as(out)
    std = log_std.exp()
    logp = (-((actions - out) ** 2) / (2 * std * std) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
    entropy = (0.5 + 0.5 * math.log(2 * math.pi) + log_std).sum(-1)
    return logp, entropy


def sample_actions(net: ActorCritic, out: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Actions from the actor output and pre-drawn noise (uniform for discrete,
    standard normal for continuous): deterministic given the noise."""
    out = out.float()
    if net.discrete:
        gumbel = -torch.log(-torch.log(noise.clamp_(1e-20, 1.0 - 1e-7)))
        return torch.argmax(out + gumbel, dim=-1)
    return out + net.log_std.float().exp() * noise


class RunningMeanStd:
    """Running mean/variance (parallel algorithm), as gymnasium's normalisers."""

    def __init__(self, shape: tuple[int, ...] = ()) -> None:
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = 1e-4

    def update(self, x: np.ndarray) -> None:
        batch_mean, batch_var, n = x.mean(0), x.var(0), x.shape[0]
        delta = batch_mean - self.mean
        total = self.count + n
        self.mean = self.mean + delta * n / total
        self.var = (self.var * self.count + batch_var * n + delta**2 * self.count * n / total) / total
        self.count = total


# -- results -----------------------------------------------------------------------


@dataclass
class TrainResult:
    env_id: str
    seed: int
    env_steps: int
    wall_s: float
    env_steps_per_s: float
    time_split_s: dict[str, float]
    episode_returns: list[float]
    eval_return: Optional[float]
    eval_returns: list[float]
    optimizations: dict[str, Any]
    trainer_stats: dict[str, Any]
    iterations: int
    history: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        recent = self.episode_returns[-20:]
        return {
            "env_id": self.env_id,
            "seed": self.seed,
            "env_steps": self.env_steps,
            "wall_s": self.wall_s,
            "env_steps_per_s": self.env_steps_per_s,
            "time_split_s": self.time_split_s,
            "train_return_last20": float(np.mean(recent)) if recent else None,
            "episodes": len(self.episode_returns),
            "eval_return": self.eval_return,
            "eval_returns": self.eval_returns,
            "optimizations": self.optimizations,
            "trainer": self.trainer_stats,
            "iterations": self.iterations,
            "history": self.history,
        }


# -- the learner ---------------------------------------------------------------------


class CompiledFallback:
    """Calls ``torch.compile(fn)``; if compiling or running it raises, logs the
    reason once and runs ``fn`` eagerly from then on."""

    def __init__(self, fn: Callable[..., Any], mode: str, name: str) -> None:
        self.eager = fn
        self.name = name
        self.mode = mode
        self.failed_reason: Optional[str] = None
        try:
            self.compiled: Optional[Callable[..., Any]] = torch.compile(fn, mode=mode)
        except Exception as exc:  # noqa: BLE001 - any failure means: run eagerly
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        self.compiled = None
        self.failed_reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        _log().warning("ppo.compile_fallback", function=self.name, mode=self.mode, reason=self.failed_reason)

    @property
    def active(self) -> bool:
        return self.compiled is not None

    def __call__(self, *args: Any) -> Any:
        if self.compiled is not None:
            try:
                return self.compiled(*args)
            except Exception as exc:  # noqa: BLE001
                self._fail(exc)
        return self.eager(*args)


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
    """Build with a config, call :meth:`train`, then :meth:`evaluate`."""

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
        autoreset = getattr(envs, "metadata", {}).get("autoreset_mode")
        if autoreset is not None and autoreset != gym.vector.AutoresetMode.SAME_STEP:
            envs.close()
            raise ValueError(
                f"vector env autoreset_mode={autoreset}: PPO needs AutoresetMode.SAME_STEP "
                "(the final observation in infos['final_obs'] for the truncation bootstrap)"
            )
        obs_space, act_space = envs.single_observation_space, envs.single_action_space
        if obs_space.shape is None or not isinstance(act_space, (gym.spaces.Discrete, gym.spaces.Box)):
            envs.close()
            raise ValueError(
                f"env {cfg.env_id!r}: observation space {obs_space} / action space {act_space} not supported "
                "(expected an observation space with a shape and a Discrete or Box action space)"
            )
        self.discrete = isinstance(act_space, gym.spaces.Discrete)
        self.obs_dim = int(np.prod(obs_space.shape))
        self.act_shape: tuple[int, ...] = () if self.discrete else tuple(act_space.shape)
        act_dim = int(act_space.n) if self.discrete else int(np.prod(act_space.shape))
        if not self.discrete:
            self.act_low, self.act_high = act_space.low, act_space.high
        self.net = ActorCritic(self.obs_dim, act_dim, self.discrete, cfg.hidden_size).to(self.device)
        # fused Adam: one kernel over all parameters; torch's CPU default is a
        # per-tensor Python loop, which shows in a launch-bound update
        optimizer = torch.optim.Adam(self.net.parameters(), lr=cfg.learning_rate, eps=1e-5, fused=True)
        self.trainer = self._make_trainer(optimizer)
        self.obs_rms = RunningMeanStd((self.obs_dim,)) if cfg.normalize_obs else None
        self.ret_rms = RunningMeanStd(()) if cfg.normalize_reward else None
        self._ret_acc = np.zeros(cfg.num_envs)
        self.noise_gen = torch.Generator().manual_seed(cfg.seed)
        self.forward = self.net.forward
        if opts.use_torch_compile:
            self.forward = CompiledFallback(self.net.forward, opts.compile_mode, "ActorCritic.forward")
        self.pin = opts.use_pinned_memory and self.device.type == "cuda"
        self._alloc_buffers()
        self._np = self._numpy_views()
        self.global_step = 0
        self.iteration = 0
        self.time_split = {"env": 0.0, "inference": 0.0, "update": 0.0, "other": 0.0}
        self.episode_returns: list[float] = []
        self.history: list[dict[str, Any]] = []

    # -- setup -----------------------------------------------------------------
    def _make_trainer(self, optimizer: torch.optim.Optimizer):
        from genesis_fp16.registry import trainer_for

        opts = self.cfg.optimizations
        precision = ("fp16" if opts.amp_dtype == "float16" else "bf16") if opts.use_amp else "fp32"
        trainer = trainer_for(
            "ppo", self.net, optimizer, precision=precision, overrides={"max_grad_norm": self.cfg.max_grad_norm}
        )
        return trainer

    def _alloc_buffers(self) -> None:
        n, t = self.cfg.num_envs, self.cfg.num_steps

        def buf(*shape: int, dtype=torch.float32) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, pin_memory=self.pin)

        self.buf_obs = buf(t, n, self.obs_dim)
        self.buf_act = buf(t, n, *self.act_shape, dtype=torch.long if self.discrete else torch.float32)
        self.buf_logp = buf(t, n)
        self.buf_rew = buf(t, n)
        self.buf_done = buf(t, n)
        self.buf_val = buf(t, n)
        self.obs_stage = buf(n, self.obs_dim)  # pinned staging for per-step host->device copies
        self._bufn = {k: getattr(self, f"buf_{k}").numpy() for k in ("obs", "act", "logp", "val", "rew", "done")}

    def optimization_summary(self) -> list[tuple[str, str]]:
        """One (name, state) line per optimization, as the seed printed at start."""
        o = self.cfg.optimizations
        vec = self.vec_choice
        rows = [
            ("vectorized envs", f"{vec.mode if vec else type(self.envs).__name__} x{self.cfg.num_envs} ({vec.reason if vec else 'given'})"),
            (
                "AMP",
                f"on: {self.trainer.precision.name} autocast"
                + (", gradient scaler" if self.trainer.scaler.is_enabled() else "")
                if self.trainer.precision.name != "fp32"
                else ("off" if not o.use_amp else "off (resolved to fp32 by policy/kill switch)"),
            ),
            ("torch.compile", self._compile_state()),
            (
                "pinned memory",
                "on (pinned buffers, non_blocking copies)" if self.pin else ("off (CPU device: nothing to copy)" if o.use_pinned_memory else "off"),
            ),
            ("num_workers (torch threads)", f"{torch.get_num_threads()}" + (" (set)" if o.num_workers else " (torch default)")),
            (
                "batched inference",
                (f"on, {o.inference_batch_size or self.cfg.num_envs} envs per forward" if o.batch_inference else "off (one forward per env)")
                + (" (NumPy fast path: CPU, FP32 rollout)" if self._np is not None else ""),
            ),
            ("action repeat", f"{o.action_repeat}" + (" (off)" if o.action_repeat == 1 else " (rewards summed)")),
        ]
        return rows

    def _compile_state(self) -> str:
        if not isinstance(self.forward, CompiledFallback):
            return "off"
        if self.forward.active:
            return f"on (mode {self.forward.mode})" if self.forward.mode != "default" else "on"
        return f"fallback to eager ({self.forward.failed_reason})"

    def resolved_optimizations(self) -> dict[str, Any]:
        o = as_dict(self.cfg)["optimizations"]
        o["resolved"] = {name: state for name, state in self.optimization_summary()}
        o["vec_env_resolved"] = self.vec_choice.mode if self.vec_choice else None
        o["precision"] = self.trainer.precision.name
        o["compile_active"] = isinstance(self.forward, CompiledFallback) and self.forward.active
        o["pinned_active"] = self.pin
        return o

    # -- observation handling ----------------------------------------------------
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

    # -- inference -------------------------------------------------------------------
    def _numpy_views(self) -> Optional[dict[str, np.ndarray]]:
        """NumPy views of the weights (shared storage: optimizer steps and
        checkpoint loads write in place, so the views stay current). Used for
        rollout inference on the CPU in FP32 without compile: for a batch of 8
        observations torch's per-op dispatch costs more than the arithmetic
        (batched NumPy vs torch inference in docs/PPO.md's stage table)."""
        if self.device.type != "cpu" or isinstance(self.forward, CompiledFallback):
            return None
        net = self.net
        return {
            "w1t": net.w1.detach().numpy().T, "b1": net.b1.detach().numpy(), "w2": net.w2.detach().numpy(),
            "b2": net.b2.detach().numpy()[:, 0], "wat": net.actor_head.weight.detach().numpy().T,
            "ba": net.actor_head.bias.detach().numpy(), "wct": net.critic_head.weight.detach().numpy().T,
            "bc": net.critic_head.bias.detach().numpy(), "log_std": net.log_std.detach().numpy(),
        }

    def _act_numpy(self, x: np.ndarray, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        w, hdim = self._np, self.net.hidden
        h = np.tanh(x @ w["w1t"] + w["b1"])
        ha = np.tanh(h[:, :hdim] @ w["w2"][0] + w["b2"][0])
        hc = np.tanh(h[:, hdim:] @ w["w2"][1] + w["b2"][1])
        out = ha @ w["wat"] + w["ba"]
        value = (hc @ w["wct"] + w["bc"])[:, 0]
        if self.discrete:
            gumbel = -np.log(-np.log(np.clip(noise, 1e-20, 1.0 - 1e-7)))
            action = np.argmax(out + gumbel, axis=-1)
            m = out.max(-1, keepdims=True)
            logp_all = out - m - np.log(np.exp(out - m).sum(-1, keepdims=True))
            logp = np.take_along_axis(logp_all, action[:, None], -1)[:, 0]
        else:
            log_std = w["log_std"]
            action = out + np.exp(log_std) * noise
            logp = (-0.5 * noise * noise - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        return action, logp.astype(np.float32), value.astype(np.float32)

    def act(self, obs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(actions, log-probs, values) for a batch of host observations, honouring
        ``batch_inference`` / ``inference_batch_size``. Results on the host."""
        if self._np is None:
            return self._act_torch(obs, noise)
        o = self.cfg.optimizations
        n = obs.shape[0]
        chunk = (o.inference_batch_size or n) if o.batch_inference else 1
        x, z = obs.numpy(), noise.numpy()
        parts = [self._act_numpy(x[i : i + chunk], z[i : i + chunk]) for i in range(0, n, chunk)]
        if len(parts) == 1:
            a, lp, v = parts[0]
        else:
            a, lp, v = (np.concatenate(c) for c in zip(*parts))
        return torch.from_numpy(a), torch.from_numpy(lp), torch.from_numpy(v)

    @torch.inference_mode()
    def _act_torch(self, obs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(actions, log-probs, values) for a batch of host observations, honouring
        ``batch_inference`` / ``inference_batch_size``. Results on the host."""
        o = self.cfg.optimizations
        n = obs.shape[0]
        chunk = (o.inference_batch_size or n) if o.batch_inference else 1
        acts, logps, vals = [], [], []
        for start in range(0, n, chunk):
            sl = slice(start, min(n, start + chunk))
            x = self._to_device(obs[sl], self.obs_stage[sl] if self.pin else None)
            out, value = self.forward(x)
            eps = noise[sl].to(self.device, non_blocking=self.pin)
            action = sample_actions(self.net, out, eps)
            logp, _ = log_prob_entropy(self.net, out, action)
            acts.append(action)
            logps.append(logp)
            # copied when another chunk follows: a compiled forward (CUDA graphs in
            # reduce-overhead) may return a static buffer that its next call overwrites
            vals.append(value.float() if chunk >= n else value.float().clone())
        if len(acts) == 1:
            return acts[0].cpu(), logps[0].cpu(), vals[0].cpu()
        return torch.cat(acts).cpu(), torch.cat(logps).cpu(), torch.cat(vals).cpu()

    def _draw_noise(self) -> torch.Tensor:
        n = self.cfg.num_envs
        if self.discrete:
            return torch.rand((n, self.net.actor_head.out_features), generator=self.noise_gen)
        return torch.randn((n, *self.act_shape), generator=self.noise_gen)

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
        for iteration in range(1, cfg.num_iterations + 1):
            if cfg.anneal_lr:
                for group in self.trainer.optimizer.param_groups:
                    group["lr"] = cfg.learning_rate * (1.0 - (iteration - 1.0) / cfg.num_iterations)
            for step in range(cfg.num_steps):
                t0 = time.perf_counter()
                noise = self._draw_noise()
                action, logp, value = self.act(obs, noise)
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
                        final_t = torch.from_numpy(self._prep_obs(final, update_stats=False))
                        with torch.inference_mode():
                            _, fv = self.net(self._to_device(final_t))
                        reward_used = reward_used.copy()
                        reward_used[idx] += cfg.gamma * fv.float().cpu().numpy()
                # NumPy views of the (possibly pinned) buffers: a NumPy row write costs
                # well under a microsecond, a torch copy_ several
                bn = self._bufn
                bn["obs"][step] = obs.numpy()
                bn["act"][step] = action.numpy()
                bn["logp"][step] = logp.numpy()
                bn["val"][step] = value.numpy()
                bn["rew"][step] = reward_used
                bn["done"][step] = done
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
            with torch.inference_mode():
                _, next_value = self.net(self._to_device(obs))
            advantages, returns = self._gae(next_value.float().cpu())
            split["other"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            metrics = self._update(advantages, returns)
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

    def _gae(self, next_value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Generalised advantage estimation. ``buf_done[t]`` marks that the
        episode ended at step t (the stored obs at t+1 is a reset one)."""
        cfg = self.cfg
        rew, val, done = self.buf_rew.numpy(), self.buf_val.numpy(), self.buf_done.numpy()
        adv = np.zeros_like(rew)
        last = np.zeros(cfg.num_envs, dtype=np.float32)
        nv = next_value.numpy()
        for t in reversed(range(cfg.num_steps)):
            next_v = nv if t == cfg.num_steps - 1 else val[t + 1]
            nonterminal = 1.0 - done[t]
            delta = rew[t] + cfg.gamma * next_v * nonterminal - val[t]
            last = delta + cfg.gamma * cfg.gae_lambda * nonterminal * last
            adv[t] = last
        adv_t = torch.from_numpy(adv)
        return adv_t, adv_t + self.buf_val

    def _loss(self, net: nn.Module, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        # Written for few ops: a 64-unit network is launch-bound, so every op
        # in the forward (and its node in the backward) shows in updates/s.
        cfg = self.cfg
        record = bool(mb.get("record"))
        out, value = self.forward(mb["obs"])
        need_entropy = bool(cfg.ent_coef) or record
        newlogp, entropy = log_prob_entropy(self.net, out, mb["act"], need_entropy)
        logratio = newlogp - mb["logp"]
        ratio = logratio.exp()
        adv = mb["adv"]
        if cfg.norm_adv:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        pg_loss = -torch.min(adv * ratio, adv * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)).mean()
        value = value.float()
        if cfg.clip_vloss:
            v_unclipped = (value - mb["ret"]) ** 2
            v_clipped = mb["val"] + torch.clamp(value - mb["val"], -cfg.clip_coef, cfg.clip_coef)
            v_loss = 0.5 * torch.max(v_unclipped, (v_clipped - mb["ret"]) ** 2).mean()
        else:
            v_loss = 0.5 * (value - mb["ret"]).square().mean()
        loss = pg_loss + cfg.vf_coef * v_loss
        if cfg.ent_coef:
            loss = loss - cfg.ent_coef * entropy.mean()
        if record:  # diagnostics for the last minibatch of an epoch only
            with torch.no_grad():
                self._last_terms = (pg_loss.detach(), v_loss.detach(), entropy.detach().mean(), ((ratio - 1) - logratio).mean())
        return loss

    def _update(self, advantages: torch.Tensor, returns: torch.Tensor) -> dict[str, Any]:
        cfg = self.cfg
        b = cfg.batch_size
        data = {
            "obs": self.buf_obs.reshape(b, self.obs_dim),
            "act": self.buf_act.reshape(b, *self.act_shape),
            "logp": self.buf_logp.reshape(b),
            "adv": advantages.reshape(b),
            "ret": returns.reshape(b),
            "val": self.buf_val.reshape(b),
        }
        if self.device.type != "cpu":
            data = {k: v.to(self.device, non_blocking=self.pin) for k, v in data.items()}
        skipped = 0
        steps = 0
        stop = False
        gen = torch.Generator().manual_seed(cfg.seed * 100_003 + self.iteration)
        for _epoch in range(cfg.update_epochs):
            perm = torch.randperm(b, generator=gen)
            if self.device.type != "cpu":
                perm = perm.to(self.device, non_blocking=True)
            shuffled = {k: v[perm] for k, v in data.items()}  # one gather per epoch; minibatches are views
            for start in range(0, b, cfg.minibatch_size):
                mb = {k: v[start : start + cfg.minibatch_size] for k, v in shuffled.items()}
                mb["record"] = start + cfg.minibatch_size >= b
                loss = self.trainer.training_step(mb, self._loss)
                ok = self.trainer.backward_and_step(loss)
                steps += 1
                skipped += 0 if ok else 1
            if cfg.target_kl is not None and float(self._last_terms[3]) > cfg.target_kl:
                stop = True
            if stop:
                break
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        pg, vl, ent, kl = (float(x) for x in self._last_terms)
        return {"pg_loss": pg, "v_loss": vl, "entropy": ent, "approx_kl": kl, "update_steps": steps, "skipped_steps": skipped}

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
            "obs_rms": None if self.obs_rms is None else {"mean": self.obs_rms.mean.tolist(), "var": self.obs_rms.var.tolist(), "count": self.obs_rms.count},
            "ret_rms": None if self.ret_rms is None else {"mean": float(self.ret_rms.mean), "var": float(self.ret_rms.var), "count": self.ret_rms.count},
        }
        return self.trainer.save_checkpoint(path, extra=extra)

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        extra = self.trainer.load_checkpoint(path)
        self.global_step = int(extra.get("global_step", 0))
        self.iteration = int(extra.get("iteration", 0))
        rms = extra.get("obs_rms")
        if rms and self.obs_rms is not None:
            self.obs_rms.mean, self.obs_rms.var, self.obs_rms.count = np.array(rms["mean"]), np.array(rms["var"]), rms["count"]
        rms = extra.get("ret_rms")
        if rms and self.ret_rms is not None:
            self.ret_rms.mean, self.ret_rms.var, self.ret_rms.count = np.array(rms["mean"]), np.array(rms["var"]), rms["count"]
        return extra

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

"""PPO's CPU fast path (``optimizations.cpu_fast_path``, on by default where
it applies: the CPU, no ``torch.compile``). Each piece computes what
`agents.ppo.ppo` defines, to float32 rounding, in fewer operations: a 64-unit
network is launch-bound on a CPU, so every torch op and autograd node shows.

- ``towers``: `ActorCritic.forward` in float32 as one autograd node, its
  backward a dozen matmuls written out.
- ``fused_loss``: `ppo_loss` from the network's outputs as one node: NumPy
  forward, the gradients with respect to the outputs written out backward
  (in any precision: the loss is float32 on autocast's outputs too).
- ``rollout_actor``: the rollout's per-step actions from the actor tower alone,
  weights taken as views once per rollout.
- ``lean_mujoco``: HalfCheetah-v5 and Swimmer-v5 stepped without gymnasium's
  per-step Python (`MujocoVectorEnv`), gymnasium's results to the bit.

What each still pays: docs/PPO.md, "The CPU fast path" (``scripts/bench_fast_path.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import torch

from genesis_fp16.base.extras import require

from .envs import EnvFn, InProcessVectorEnv

gym = require("gymnasium", "genesis-fp16 ppo")

PIECES = ("towers", "fused_loss", "rollout_actor", "lean_mujoco")
_add = np.add.reduce  # ndarray.mean and .std are Python-level wrappers, several us each
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
_DIAGNOSTICS = ("pg_loss", "v_loss", "entropy", "approx_kl")


def _plain_float32(*tensors: torch.Tensor) -> bool:
    return (
        not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
        and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
    )


class _Tanh(torch.autograd.Function):
    """tanh through NumPy, its gradient torch's (torch 2.13's float32 CPU tanh: 13x NumPy's time on an AVX512 EPYC)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(y := torch.from_numpy(np.tanh(x.detach().numpy())))
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.tanh_backward(grad, ctx.saved_tensors[0])


def tanh(x: torch.Tensor) -> torch.Tensor:
    """``torch.tanh``, NumPy's where `_plain_float32`: the plain forward's and every fast piece's, so they stay
    equal."""
    return _Tanh.apply(x) if _plain_float32(x) else torch.tanh(x)


class _Towers(torch.autograd.Function):
    """`ActorCritic.forward` as one autograd node (float32, CPU)."""

    @staticmethod
    def forward(
        ctx: Any,
        obs: torch.Tensor,
        w1: torch.Tensor,
        b1: torch.Tensor,
        w2: torch.Tensor,
        b2: torch.Tensor,
        wa: torch.Tensor,
        ba: torch.Tensor,
        wc: torch.Tensor,
        bc: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h1 = tanh(torch.addmm(b1, obs, w1.t()))  # (B, 2H): the forward's own ops
        h2 = tanh(torch.baddbmm(b2, h1.view(obs.shape[0], 2, -1).transpose(0, 1), w2))  # (2, B, H)
        ctx.save_for_backward(obs, h1, h2, w2, wa, wc)
        return torch.addmm(ba, h2[0], wa.t()), torch.addmm(bc, h2[1], wc.t()).squeeze(-1)

    @staticmethod
    def backward(ctx: Any, g_out: torch.Tensor, g_value: torch.Tensor) -> tuple[Any, ...]:
        obs, h1, h2, w2, wa, wc = ctx.saved_tensors
        g_value = g_value.unsqueeze(-1)
        g_z2 = torch.ops.aten.tanh_backward(torch.stack((g_out.mm(wa), g_value.mm(wc))), h2)
        x = h1.view(obs.shape[0], 2, -1).transpose(0, 1)
        g_h1 = torch.bmm(g_z2, w2.transpose(1, 2)).transpose(0, 1).reshape(h1.shape)
        g_z1 = torch.ops.aten.tanh_backward(g_h1, h1)
        return (
            None,
            g_z1.t().mm(obs),
            g_z1.sum(0),
            torch.bmm(x.transpose(1, 2), g_z2),
            g_z2.sum(1, keepdim=True),
            g_out.t().mm(h2[0]),
            g_out.sum(0),
            g_value.t().mm(h2[1]),
            g_value.sum(0),
        )


def _ppo_terms(
    logp: np.ndarray, logp_old: np.ndarray, adv: np.ndarray, v: np.ndarray, ret: np.ndarray, s: Any
) -> tuple[float, float, float, np.ndarray, np.ndarray]:
    """(pg_loss, v_loss, approx_kl, active, vd) from the new log-probabilities. ``active`` is
    d(-pg_loss * n)/d logp: the normalised advantage times the ratio where the unclipped term is the
    minimum (ties included: torch splits a tie's gradient and the clamp passes its share), else 0."""
    n = v.shape[0]
    logratio = logp - logp_old
    ratio = np.exp(logratio)
    if s.norm_adv:
        centred = adv - _add(adv) / n
        adv = centred / (math.sqrt(float(np.dot(centred, centred)) / (n - 1)) + 1e-8)  # torch's unbiased std
    unclipped = adv * ratio
    clipped = adv * np.minimum(np.maximum(ratio, 1 - s.clip_coef), 1 + s.clip_coef)
    pg_loss = -float(_add(np.minimum(unclipped, clipped))) / n
    vd = v - ret
    approx_kl = (float(_add(ratio)) - n - float(_add(logratio))) / n
    unclipped *= unclipped <= clipped
    return pg_loss, float(np.dot(vd, vd)) / n, approx_kl, unclipped, vd


def _outputs(
    ctx: Any, pg_loss: float, v_loss: float, entropy: float, approx_kl: float, s: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    diagnostics = torch.from_numpy(np.array([pg_loss, v_loss, entropy, approx_kl], dtype=np.float32))
    ctx.mark_non_differentiable(diagnostics)
    return torch.tensor(pg_loss + s.vf_coef * v_loss - s.ent_coef * entropy, dtype=torch.float32), diagnostics


def _backward_terms(active: np.ndarray, vd: np.ndarray, gl: float, s: Any) -> tuple[np.ndarray, torch.Tensor]:
    """(d loss / d logp, d loss / d value) for an upstream gradient ``gl``."""
    n = vd.shape[0]
    return active * np.float32(-gl / n), torch.from_numpy(vd * np.float32(gl * 2.0 * s.vf_coef / n))


class _GaussianLoss(torch.autograd.Function):
    """`ppo_loss` for a Gaussian policy from (mean, value, log_std)."""

    @staticmethod
    def forward(
        ctx: Any,
        mean: torch.Tensor,
        value: torch.Tensor,
        log_std: torch.Tensor,
        act: torch.Tensor,
        logp_old: torch.Tensor,
        adv: torch.Tensor,
        ret: torch.Tensor,
        s: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        mu, ls = mean.detach().numpy(), log_std.detach().numpy()
        d = act.numpy() - mu
        inv_var = np.exp(-2.0 * ls)
        dz = d * d
        dz *= inv_var
        logp = _add(dz, axis=1)
        logp *= -0.5
        logp -= _add(ls) + _HALF_LOG_2PI * ls.size
        pg_loss, v_loss, approx_kl, active, vd = _ppo_terms(
            logp, logp_old.numpy(), adv.numpy(), value.detach().numpy(), ret.numpy(), s
        )
        ctx.saved = (d, inv_var, dz, active, vd, s)
        return _outputs(ctx, pg_loss, v_loss, float(_add(ls)) + (0.5 + _HALF_LOG_2PI) * ls.size, approx_kl, s)

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor, _grad_diagnostics: Any) -> tuple[Any, ...]:
        d, inv_var, dz, active, vd, s = ctx.saved
        gl = float(grad_loss)
        g, d_value = _backward_terms(active, vd, gl, s)
        d_mean = g[:, None] * inv_var  # d logp / d mean = (a - mean) / var
        d_mean *= d
        d_log_std = np.dot(g, dz) - (_add(g) + np.float32(gl * s.ent_coef))  # sum_i g_i (dz_ij - 1) - ent_coef
        return (
            torch.from_numpy(d_mean),
            d_value,
            torch.from_numpy(d_log_std.astype(np.float32, copy=False)),
            None,
            None,
            None,
            None,
            None,
        )


class _CategoricalLoss(torch.autograd.Function):
    """`ppo_loss` for a categorical policy from (logits, value): d logp / d z = onehot - p,
    d entropy / d z = -p (log p + H)."""

    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        value: torch.Tensor,
        act: torch.Tensor,
        logp_old: torch.Tensor,
        adv: torch.Tensor,
        ret: torch.Tensor,
        s: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        z = logits.detach().numpy()
        rows, taken = np.arange(z.shape[0]), act.numpy().astype(np.int64)
        shifted = z - np.maximum.reduce(z, axis=1)[:, None]
        e = np.exp(shifted)
        total = _add(e, axis=1)
        logp_all = shifted - np.log(total)[:, None]
        p = e / total[:, None]
        entropy = -_add(p * logp_all, axis=1)
        pg_loss, v_loss, approx_kl, active, vd = _ppo_terms(
            logp_all[rows, taken], logp_old.numpy(), adv.numpy(), value.detach().numpy(), ret.numpy(), s
        )
        ctx.saved = (rows, taken, p, logp_all, entropy, active, vd, s)
        return _outputs(ctx, pg_loss, v_loss, float(_add(entropy)) / z.shape[0], approx_kl, s)

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor, _grad_diagnostics: Any) -> tuple[Any, ...]:
        rows, taken, p, logp_all, entropy, active, vd, s = ctx.saved
        gl = float(grad_loss)
        g, d_value = _backward_terms(active, vd, gl, s)
        d_logits = p * -g[:, None]
        d_logits[rows, taken] += g
        if s.ent_coef:
            d_logits += p * (logp_all + entropy[:, None]) * np.float32(gl * s.ent_coef / vd.shape[0])
        return torch.from_numpy(d_logits), d_value, None, None, None, None, None


class FastPath:
    """The fast pieces for one network (`ActorCritic`); ``pieces`` leaves some out (the bench's ablations)."""

    def __init__(self, net: Any, pieces: tuple[str, ...] = PIECES) -> None:
        unknown = set(pieces) - set(PIECES)
        if unknown:
            raise ValueError(f"fast-path pieces {sorted(unknown)}: expected some of {', '.join(PIECES)}")
        self.net, self.pieces = net, tuple(pieces)

    def _weights(self) -> tuple[torch.Tensor, ...]:
        n = self.net
        return (
            n.w1,
            n.b1,
            n.w2,
            n.b2,
            n.actor_head.weight,
            n.actor_head.bias,
            n.critic_head.weight,
            n.critic_head.bias,
        )

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`ActorCritic.forward`; in float32 outside autocast as `_Towers`."""
        if "towers" not in self.pieces or not _plain_float32(obs, self.net.w1):
            return self.net(obs)
        return _Towers.apply(obs, *self._weights())  # without gradients, no graph: the forward alone

    def loss(
        self, out: torch.Tensor, value: torch.Tensor, mb: dict[str, torch.Tensor], s: Any
    ) -> Optional[tuple[torch.Tensor, dict[str, torch.Tensor]]]:
        """`ppo_loss` as one node, or None where it does not apply (value clipping, or the piece left out)."""
        if "fused_loss" not in self.pieces or s.clip_vloss or out.device.type != "cpu":
            return None
        out, value = out.float(), value.float()
        if self.net.discrete:
            loss, diag = _CategoricalLoss.apply(out, value, mb["act"], mb["logp"], mb["adv"], mb["ret"], s)
        else:
            loss, diag = _GaussianLoss.apply(
                out, value, self.net.log_std, mb["act"], mb["logp"], mb["adv"], mb["ret"], s
            )
        return loss, dict(zip(_DIAGNOSTICS, diag.unbind()))

    def rollout_actor(self, perturbation: torch.Tensor) -> Optional[Callable[[torch.Tensor, int], torch.Tensor]]:
        """``step(obs, t)``: ``pick(forward(obs)[0], perturbation[t])`` from the actor tower alone, or None."""
        if "rollout_actor" not in self.pieces or not _plain_float32(self.net.w1):
            return None
        h = self.net.hidden
        net = self.net  # detached views: the weights as the optimizer leaves them, no graph
        w1, b1, w2, b2 = net.w1.detach()[:h].t(), net.b1.detach()[:h], net.w2.detach()[0], net.b2.detach()[0, 0]
        w3, b3 = net.actor_head.weight.detach().t(), net.actor_head.bias.detach()
        pert, discrete = perturbation.float(), self.net.discrete

        def step(obs: torch.Tensor, t: int) -> torch.Tensor:  # no input needs grad: no graph, no context to enter
            h = torch.addmm(b1, obs, w1)
            np.tanh(x := h.numpy(), out=x)  # `tanh` in place (float32 on the CPU, checked above), no autograd node
            h = torch.addmm(b2, h, w2)
            np.tanh(x := h.numpy(), out=x)
            out = torch.addmm(b3, h, w3).add_(pert[t])
            return torch.argmax(out, dim=-1) if discrete else out

        return step


# -- the lean MuJoCo step ---------------------------------------------------------
# entry point -> leading qpos entries the observation leaves out (exclude_current_positions_from_observation)
LAYOUTS = {"gymnasium.envs.mujoco.half_cheetah_v5:HalfCheetahEnv": 1, "gymnasium.envs.mujoco.swimmer_v5:SwimmerEnv": 2}
_ALLOWED_WRAPPERS = (gym.wrappers.TimeLimit, gym.wrappers.OrderEnforcing)  # the per-step work done here


def lean_mujoco_supported(env_id: str) -> bool:
    """Whether `MujocoVectorEnv` steps ``env_id`` (by its registered entry point)."""
    try:
        entry = gym.spec(env_id).entry_point
    except gym.error.Error:
        return False
    return isinstance(entry, str) and entry in LAYOUTS


@dataclass(frozen=True)
class _Layout:  # the step's constants: leading qpos entries left out, frame skip, dt, the reward's weights
    skip: int
    frame_skip: int
    dt: float
    forward_weight: float
    ctrl_weight: float


def _layout(env: gym.Env) -> tuple[_Layout, int]:
    """The step's constants and the time limit; ValueError for an env this cannot step exactly."""
    sim = env.unwrapped
    entry = f"{type(sim).__module__}:{type(sim).__name__}"
    if entry not in LAYOUTS:
        raise ValueError(
            f"{entry}: the lean MuJoCo step knows {sorted(LAYOUTS)}; set cpu_fast_path false for other envs"
        )
    max_steps: Optional[int] = None
    layer = env
    while isinstance(layer, gym.Wrapper):
        if type(layer) not in _ALLOWED_WRAPPERS:
            raise ValueError(
                f"wrapper {type(layer).__name__} around {entry}: the lean MuJoCo step replaces only "
                f"{', '.join(w.__name__ for w in _ALLOWED_WRAPPERS)}"
            )
        if type(layer) is gym.wrappers.TimeLimit:
            max_steps = int(layer._max_episode_steps)
        layer = layer.env
    if max_steps is None:
        raise ValueError(f"{entry} without a TimeLimit wrapper: the lean MuJoCo step counts the time limit itself")
    if sim.render_mode is not None:
        raise ValueError(f"render_mode={sim.render_mode!r}: the lean MuJoCo step does not render")
    skip = LAYOUTS[entry] if sim._exclude_current_positions_from_observation else 0
    return _Layout(
        skip, int(sim.frame_skip), float(sim.dt), sim._forward_reward_weight, sim._ctrl_cost_weight
    ), max_steps


class MujocoVectorEnv(InProcessVectorEnv):
    """`InProcessVectorEnv` of HalfCheetah-v5 / Swimmer-v5 envs whose step is done here: per env
    the control, ``mj_step`` and ``mj_rnePostConstraint`` as gymnasium calls them and the
    positions copied into a preallocated array; the rewards of all envs in one expression with
    gymnasium's operations and dtypes; the time limit counted here. Resets go through gymnasium."""

    def __init__(self, env_fns: list[EnvFn]) -> None:
        super().__init__(env_fns)
        try:
            found = [_layout(env) for env in self.envs]
        except ValueError:
            self.close()
            raise
        layouts = {layout for layout, _ in found}
        if len(layouts) != 1:
            self.close()
            raise ValueError(
                f"the envs differ in their step's constants ({len(layouts)} kinds): one vector env steps one kind"
            )
        self._c = layouts.pop()
        import mujoco

        self._mj_step, self._mj_rne = mujoco.mj_step, mujoco.mj_rnePostConstraint
        self._sims = [(env.unwrapped.model, env.unwrapped.data) for env in self.envs]
        self._npos = self._obs.shape[1] - self._sims[0][1].qvel.size
        self._nu = self._sims[0][0].nu
        self._x_before, self._x_after = np.zeros(self.num_envs), np.zeros(self.num_envs)
        self._elapsed = np.zeros(self.num_envs, dtype=np.int64)
        self._max_steps = np.array([limit for _, limit in found], dtype=np.int64)
        self._needs_reset = True

    def reset(self, *, seed: Any = None, options: Optional[dict] = None):
        out = super().reset(seed=seed, options=options)
        self._elapsed[:] = 0
        self._needs_reset = False
        return out

    def step(self, actions: Any):
        if self._needs_reset:
            raise gym.error.ResetNeeded("call reset() before step()")
        acts = np.asarray(actions)
        if acts.shape != (self.num_envs, self._nu):
            raise ValueError(f"actions of shape {acts.shape}: expected ({self.num_envs}, {self._nu})")
        c, obs, npos, x0, x1 = self._c, self._obs, self._npos, self._x_before, self._x_after
        for i, (model, data) in enumerate(self._sims):
            x0[i] = data.qpos[0]
            data.ctrl[:] = acts[i]
            self._mj_step(model, data, nstep=c.frame_skip)
            self._mj_rne(model, data)  # gymnasium computes the force quantities after every step
            x1[i] = data.qpos[0]
            obs[i, :npos] = data.qpos[c.skip :]
            obs[i, npos:] = data.qvel
        # gymnasium's expression per env, on all envs at once: weight * (dx / dt) - weight * sum(a^2), same dtypes
        self._rew[:] = c.forward_weight * ((x1 - x0) / c.dt) - c.ctrl_weight * np.sum(np.square(acts), axis=1)
        self._elapsed += 1
        np.greater_equal(self._elapsed, self._max_steps, out=self._trunc)
        infos: dict[str, Any] = {}
        if self._trunc.any():
            final_obs = np.full(self.num_envs, None, dtype=object)
            for i in np.nonzero(self._trunc)[0]:
                final_obs[i] = obs[i].copy()
                obs[i], _ = self.envs[i].reset()
                self._elapsed[i] = 0
            infos = {"final_obs": final_obs, "_final_obs": self._trunc.copy()}
        return obs.copy(), self._rew.copy(), self._term.copy(), self._trunc.copy(), infos

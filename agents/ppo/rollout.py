"""Rollout storage: preallocated buffers, and the running statistics behind observation and reward normalisation."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from genesis_fp16.base.seeds import torch_generator


class RolloutBuffer:
    """``num_steps x num_envs`` tensors for one rollout. On CUDA they are
    pinned (``pin=True``) so the copy to the device once per rollout can be
    ``non_blocking``. ``rows`` holds NumPy views of the same storage: a NumPy
    row write costs well under a microsecond, a torch ``copy_`` several."""

    FIELDS = ("obs", "act", "logp", "val", "rew", "done")

    def __init__(
        self, num_steps: int, num_envs: int, obs_dim: int, act_shape: tuple[int, ...], discrete: bool, pin: bool
    ) -> None:
        def buf(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, pin_memory=pin)

        t, n = num_steps, num_envs
        self.obs = buf(t, n, obs_dim)
        self.act = buf(t, n, *act_shape, dtype=torch.long if discrete else torch.float32)
        self.logp = buf(t, n)
        self.val = buf(t, n)
        self.rew = buf(t, n)
        self.done = buf(t, n)
        self.obs_stage = buf(n, obs_dim)  # staging for per-step host->device copies
        self.rows = {k: getattr(self, k).numpy() for k in self.FIELDS}

    def flat(self, advantages: torch.Tensor, returns: torch.Tensor) -> dict[str, torch.Tensor]:
        """The rollout as one batch of ``num_steps * num_envs`` samples."""
        b = self.logp.numel()
        return {
            "obs": self.obs.reshape(b, -1),
            "act": self.act.reshape(b, *self.act.shape[2:]),
            "logp": self.logp.reshape(b),
            "adv": advantages.reshape(b),
            "ret": returns.reshape(b),
            "val": self.val.reshape(b),
        }


class RunningMeanStd:
    """Running mean/variance (parallel algorithm), as gymnasium's normalisers."""

    def __init__(self, shape: tuple[int, ...] = ()) -> None:
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = 1e-4

    def update(self, x: np.ndarray) -> None:
        n = x.shape[0]  # x.mean(0) and x.var(0) to the bit, without their Python wrappers (called every env step)
        batch_mean = np.add.reduce(x, axis=0) / n
        batch_var = np.add.reduce(np.square(x - batch_mean), axis=0) / n
        delta = batch_mean - self.mean
        total = self.count + n
        self.mean = self.mean + delta * n / total
        self.var = (self.var * self.count + batch_var * n + delta**2 * self.count * n / total) / total
        self.count = total

    def state_dict(self) -> dict:
        return {"mean": np.asarray(self.mean).tolist(), "var": np.asarray(self.var).tolist(), "count": self.count}

    def check_state(self, state: object, field: str) -> None:
        """Raise ``TypeError`` unless ``state`` loads into this normaliser (same shape)."""
        shape = np.shape(self.mean)
        parts = [state.get(part) for part in ("mean", "var")] if isinstance(state, dict) else [None]
        if (
            not isinstance(state, dict)
            or not isinstance(state.get("count"), (int, float))
            or any(not isinstance(part, (list, float, int)) or np.shape(part) != shape for part in parts)
        ):
            raise TypeError(f"field {field}: expected mean and var of shape {shape} and a count")

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var, self.count = np.array(state["mean"]), np.array(state["var"]), state["count"]


def check_extra(extra: dict, normalisers: tuple[Optional[RunningMeanStd], Optional[RunningMeanStd]]) -> None:
    """A PPO checkpoint's own fields (steps, ``obs_rms``, ``ret_rms``) are usable:
    checked before the trainer changes anything (``check_extra`` of its load)."""
    for key in ("global_step", "iteration"):
        value = extra.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TypeError(f"field extra.{key}: {value!r:.60}, expected an integer >= 0")
    for key, rms in zip(("obs_rms", "ret_rms"), normalisers):
        if extra.get(key) and rms is not None:
            rms.check_state(extra[key], f"extra.{key}")


def load_normalisers(extra: dict, normalisers: tuple[Optional[RunningMeanStd], Optional[RunningMeanStd]]) -> None:
    for key, rms in zip(("obs_rms", "ret_rms"), normalisers):
        if extra.get(key) and rms is not None:
            rms.load_state_dict(extra[key])


def sample_minibatch(
    n: int, obs_dim: int, act_dim: int, act_shape: tuple[int, ...], discrete: bool, device: torch.device
) -> dict[str, torch.Tensor]:
    """A minibatch of a run's shapes and dtypes (as `RolloutBuffer.flat` gives)
    for a measured ``auto`` (`genesis_fp16.precision.measure`), before any rollout, from
    a generator of its own (no RNG of the run is drawn)."""
    g = torch_generator(0, "ppo.auto_sample")
    act = torch.randint(act_dim, (n,), generator=g) if discrete else torch.randn(n, *act_shape, generator=g)
    mb = {
        "obs": torch.randn(n, obs_dim, generator=g),
        "act": act,
        "logp": torch.zeros(n),
        "adv": torch.randn(n, generator=g),
        "ret": torch.randn(n, generator=g),
        "val": torch.zeros(n),
    }
    return {k: v.to(device) for k, v in mb.items()}

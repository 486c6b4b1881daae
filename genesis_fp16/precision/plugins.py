"""Precision plugins: one small class per mode on a base with no-op hooks
(Lightning Fabric's ``plugins/precision``). The trainer holds one and calls
its hooks in PyTorch's AMP order ("Automatic Mixed Precision examples"):
``backward`` per micro-step, then once per optimizer step ``unscale_`` (only
before clipping) -> clip -> ``optimizer_step``. The trainer never branches on
the mode; a mode's behaviour lives here.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Iterator, Optional, Union

import torch

from genesis_fp16.base.settings import PrecisionConfig

_REDUCED_WEIGHT_DTYPES = (torch.float16, torch.bfloat16)


class Precision:
    """FP32: no autocast, no scaler; every hook is the plain torch call.

    ``config`` is where the scaler's options come from (`PrecisionConfig`, its
    defaults when None; ``scaler_kwargs`` keeps them as ``torch.amp.GradScaler``
    names them). ``scaler`` is a disabled ``GradScaler`` for modes without one,
    so code that reads ``scaler.is_enabled()`` or ``scaler.get_scale()`` works
    for every mode.
    """

    name = "fp32"
    compute_dtype = torch.float32
    uses_scaler = False
    keeps_fp32_weights = True  # False only where convert_module casts the weights themselves

    def __init__(self, device: Union[str, torch.device], config: Optional[PrecisionConfig] = None) -> None:
        self.device = torch.device(device)
        self.scaler_kwargs: dict[str, Any] = (config if config is not None else PrecisionConfig()).scaler_kwargs()
        self.scaler = self.make_scaler()

    def make_scaler(self) -> torch.amp.GradScaler:
        """The gradient scaler (disabled unless the mode ``uses_scaler``); the
        FSDP variant of FP16 overrides this to return a ``ShardedGradScaler``."""
        return torch.amp.GradScaler(self.device.type, **self.scaler_kwargs, enabled=self.uses_scaler)

    def forward_context(self, cache: bool = True) -> ContextManager[Any]:
        """Where the forward pass (and the loss) runs: autocast, or nothing. ``cache`` False turns autocast's cache
        of cast weights off (a CUDA-graph capture needs it off: PyTorch's CUDA Graphs notes)."""
        return contextlib.nullcontext()

    def math_context(self) -> ContextManager[Any]:
        """The matmul math mode for forward and backward (TF32 switches for
        ``tf32``; nothing otherwise). Hand-written loops that must do the same
        work as `backward` wrap their own backward in it."""
        return contextlib.nullcontext()

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """The module with the weights this mode trains: FP32 master weights.
        A module that an FP16-weight mode (``fp16-true``) cast in place, e.g.
        before a rollback rebuilt its trainer in FP32, has its FP16/BF16
        parameters and buffers cast back to FP32, in place (the optimizer
        keeps the same parameter objects); without that its next FP32 forward
        meets FP32 inputs with FP16 weights and fails."""
        for tensor in (*module.parameters(), *module.buffers()):
            if tensor.dtype in _REDUCED_WEIGHT_DTYPES:
                tensor.data = tensor.data.float()
        return module

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Make the gradients true gradients before clipping (a no-op without a scaler)."""

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Step the optimizer; False when the step was skipped (FP16 overflow)."""
        optimizer.step()
        return True

    @property
    def scale(self) -> float:
        """The loss scale after the last optimizer step (1.0 without a scaler)."""
        return 1.0

    # -- a training window's steps (`FP16Trainer.train_window`): nothing read back to the host --------
    def window_unscale_(self, grads: list[torch.Tensor], found: torch.Tensor) -> None:
        """With a scaler: unscale the gradients in place and set ``found`` (a
        0-dim device tensor) to 1.0 where one is not finite, on the device.
        Without one (FP32's range: BF16, TF32, FP32) nothing: as on the per-step
        path, only a non-finite loss skips a step, and a pass over every
        gradient would cost a small model's window about 4% of its time."""

    def window_update(self, found: torch.Tensor, finite: torch.Tensor) -> None:
        """After a window's optimizer step: update the scale on the device (no scaler: nothing)."""

    def scale_tensor(self) -> torch.Tensor:
        """The scale on the device, 0-dim (only modes with a scaler are asked)."""
        raise NotImplementedError(f"{type(self).__name__} has no scaler")

    def window_done(self, scale: Optional[float]) -> None:
        """The window's last scale, read once at its end (no scaler: nothing)."""

    def window_tensors(self) -> list[torch.Tensor]:
        """The device tensors a window's step updates in place besides the model and optimizer (the scale and the
        growth tracker; none without a scaler): a captured step holds their addresses."""
        return []

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps under its "scaler" key ({} without a scaler)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict` (nothing to restore without a scaler)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device})"


class FP16Mixed(Precision):
    """FP16 autocast with a dynamic loss scaler that it owns. An overflow is
    seen as a drop of the scale in ``update()``: that step was skipped."""

    name = "fp16"
    compute_dtype = torch.float16
    uses_scaler = True

    def __init__(self, device: Union[str, torch.device], config: Optional[PrecisionConfig] = None) -> None:
        super().__init__(device, config)
        # before the first step get_scale() is init_scale without a device sync
        self._scale = float(self.scaler.get_scale())

    def forward_context(self, cache: bool = True) -> ContextManager[Any]:
        return torch.autocast(self.device.type, dtype=torch.float16, cache_enabled=cache)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        self.scaler.unscale_(optimizer)

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        self.scaler.step(optimizer)  # skips optimizer.step() when a gradient is inf/NaN
        self.scaler.update()  # ... and then backs the scale off
        before, self._scale = self._scale, float(self.scaler.get_scale())
        return not self._scale < before

    @property
    def scale(self) -> float:
        return self._scale

    def window_unscale_(self, grads: list[torch.Tensor], found: torch.Tensor) -> None:
        if grads:
            # GradScaler.unscale_'s own inverse (a power of two: multiplying by it is exact)
            inv = self.scaler._scale.double().reciprocal().float()
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)

    def window_update(self, found: torch.Tensor, finite: torch.Tensor) -> None:
        # GradScaler.update's op with this step's found_inf; after a non-finite loss the scale and the growth
        # tracker stay as they were, as the per-step path (which skips before the backward) leaves them
        scaler = self.scaler
        scale, tracker = scaler._scale, scaler._growth_tracker
        before = (scale.clone(), tracker.clone())
        torch._amp_update_scale_(
            scale, tracker, found, scaler.get_growth_factor(), scaler.get_backoff_factor(), scaler.get_growth_interval()
        )
        scale.copy_(torch.where(finite, scale, before[0]))
        tracker.copy_(torch.where(finite, tracker, before[1]))

    def scale_tensor(self) -> torch.Tensor:
        return self.scaler._scale.reshape(())

    def window_done(self, scale: Optional[float]) -> None:
        if scale is not None:
            self._scale = scale

    def window_tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.scaler._scale, self.scaler._growth_tracker) if t is not None]

    def state_dict(self) -> dict[str, Any]:
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.scaler.load_state_dict(state)
        self._scale = float(self.scaler.get_scale())


class BF16Mixed(Precision):
    """BF16 autocast; BF16 has FP32's exponent range, so no scaler."""

    name = "bf16"
    compute_dtype = torch.bfloat16

    def forward_context(self, cache: bool = True) -> ContextManager[Any]:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, cache_enabled=cache)


@contextlib.contextmanager
def tf32_matmuls(enabled: bool = True) -> Iterator[None]:
    """CUDA matmuls and cuDNN (convolutions, RNNs) in TF32 (``enabled``) or
    strict IEEE FP32 inside the block; the previous switches come back after."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    if hasattr(matmul, "fp32_precision"):  # torch >= 2.9; mixing it with allow_tf32 raises
        switch, value = "fp32_precision", ("tf32" if enabled else "ieee")
    else:
        switch, value = "allow_tf32", enabled
    old = (getattr(matmul, switch), getattr(cudnn, switch))
    setattr(matmul, switch, value)
    setattr(cudnn, switch, value)
    try:
        yield
    finally:
        setattr(matmul, switch, old[0])
        setattr(cudnn, switch, old[1])


class TF32(Precision):
    """FP32 weights and activations, matmuls on TF32 tensor cores (CUDA,
    compute capability 8.0+). The switches are on for the forward and the
    backward only, so nothing else in the process changes precision."""

    name = "tf32"

    def forward_context(self, cache: bool = True) -> ContextManager[Any]:
        return tf32_matmuls()

    def math_context(self) -> ContextManager[Any]:
        return tf32_matmuls()

    def backward(self, loss: torch.Tensor) -> None:
        with tf32_matmuls():
            loss.backward()


class HalfTrue(Precision):
    """Weights themselves in FP16: for inference and memory-bound deployment.
    The forward runs under FP16 autocast so FP32 inputs meet FP16 weights.
    There are no FP32 master weights, and ``GradScaler`` refuses to unscale
    FP16 gradients, so no scaler."""

    name = "fp16-true"
    compute_dtype = torch.float16
    keeps_fp32_weights = False

    def forward_context(self, cache: bool = True) -> ContextManager[Any]:
        return torch.autocast(self.device.type, dtype=torch.float16, cache_enabled=cache)

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module.to(dtype=torch.float16)

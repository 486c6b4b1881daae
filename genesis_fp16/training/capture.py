"""A training window's step as one CUDA graph, replayed for every batch of the same shape.

On a GPU a small model's step is launch overhead: a few hundred kernels of
microseconds each, every one queued by Python. `FP16Trainer.train_window`
already reads nothing back inside a window, so its step (forward under
autocast, backward, unscale and finite check, clipping, the fused optimizer
step with ``found_inf``, the scale update, the loss and flag written out) has
no synchronisation in it and can be captured once and replayed
(``torch.cuda.CUDAGraph``; PyTorch's "CUDA Graphs" notes, whole-network
capture; LeanRL's ``CudaGraphModule`` does the same for whole update steps).

How a window runs here (`StepGraphs.step`), per batch:

* the batch's signature (its tree of tensors: shapes, dtypes, devices; its
  other leaves by value) picks a graph; a signature seen fewer than `WARMUP`
  times runs the eager window step on a side stream (optimizer state,
  cuBLAS handles and autocast come to exist before capture, as the notes ask);
* the next one is captured (the step's kernels recorded, none run) and then
  replayed on this batch; later batches are copied into the graph's static
  inputs and replayed;
* each step's loss and flag (and FP16's scale) are cloned into the window's
  records, read once at its end as the eager window reads them.

A graph holds the addresses of the weights, gradients, optimizer state and
scale it was captured with, and the Python numbers baked into it (learning
rate, betas, clipping norm, the scaler's factors). `state_key` names all of
them; when one changes (a checkpoint loaded, a rollback, a new learning rate)
every graph is dropped and captured again; a shape past `MAX_GRAPHS` drops
the least recently used one. Where a step cannot be captured (an optimizer
that is neither capturable nor a fused Adam/AdamW, a batch leaf that cannot
be keyed, a loss that reads a value back) the eager window runs and one
``trainer.window_uncaptured`` event says why.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Protocol

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from genesis_fp16.precision.plugins import Precision
from genesis_fp16.training.config import FP16TrainingConfig

__all__ = ["MAX_GRAPHS", "WARMUP", "Capturable", "CudaGraph", "StepGraphs", "capture_blocker", "state_key"]

WARMUP = 3
"""Eager window steps of a batch shape before its step is captured (the CUDA Graphs notes warm up a few
iterations on a side stream; ``make_graphed_callables`` takes 3)."""
MAX_GRAPHS = 4
"""Graphs one trainer keeps (one per batch shape; each holds its own memory pool). A fifth shape drops the least
recently used one."""

_FUSED_ADAMS = (torch.optim.Adam, torch.optim.AdamW)
"""Optimizers whose fused kernel is the same captured or not (torch's ``_fused_adam`` takes ``capturable`` only "for
consistency"): their groups are marked capturable for the capture alone."""


class Capturable(Protocol):
    """What capture reads of a trainer (`FP16Trainer`): where it runs, what it steps, how."""

    device: torch.device
    config: FP16TrainingConfig
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    precision: Precision


StepFn = Callable[[Any, bool], tuple[torch.Tensor, torch.Tensor]]
"""``step(batch, cache) -> (loss value, found flag)``: one window step as the eager window runs it
(`FP16Trainer._window_step`); ``cache`` False turns autocast's weight cache off, as a capture needs."""


def capture_blocker(trainer: Capturable) -> Optional[str]:
    """Why ``trainer``'s window steps cannot be captured (None: they can). Asked only where the window runs on the
    device (`FP16Trainer.window_blocker` is None)."""
    if not trainer.config.capture:
        return "capture=False in the trainer's config"
    if trainer.device.type != "cuda":
        return f"CUDA graphs need a CUDA device ({trainer.device.type} here)"
    opt = trainer.optimizer
    if not isinstance(opt, _FUSED_ADAMS) and not all(g.get("capturable") for g in opt.param_groups):
        return (
            f"{type(opt).__name__} is neither a fused Adam/AdamW nor built with capturable=True: its step cannot be "
            "captured"
        )
    return None


def state_key(trainer: Capturable) -> tuple[Any, ...]:
    """Everything a captured step holds by address or by value: the weights and buffers, the optimizer's state and
    hyperparameters, the scaler's tensors and factors, the clipping norm, the plugin, the model's mode."""
    opt, precision = trainer.optimizer, trainer.precision
    state = [x for x in tree_flatten(list(opt.state.values()))[0] if isinstance(x, torch.Tensor)]
    tensors = [*trainer.model.parameters(), *trainer.model.buffers(), *state]
    tensors += precision.window_tensors()
    scaler = precision.scaler
    numbers: list[Any] = [id(precision), trainer.config.max_grad_norm, trainer.model.training]
    if precision.uses_scaler:
        numbers += [scaler.get_growth_factor(), scaler.get_backoff_factor(), scaler.get_growth_interval()]
    groups = [
        tuple((k, _hashable(v)) for k, v in sorted(g.items()) if k != "params") + (len(g["params"]),)
        for g in opt.param_groups
    ]
    return (tuple(t.data_ptr() for t in tensors), tuple(numbers), tuple(groups))


def _hashable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", value.data_ptr())
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    return value


def _signature(batch: Any) -> tuple[tuple[Any, ...], list[Any], Any]:
    """(key, leaves, spec): the batch's tree, its tensors by shape, dtype and device, other leaves by value."""
    leaves, spec = tree_flatten(batch)
    key = tuple(
        ("t", tuple(x.shape), x.dtype, str(x.device), x.requires_grad) if isinstance(x, torch.Tensor) else ("v", x)
        for x in leaves
    )
    hash(key)  # an unhashable leaf raises TypeError here, before anything ran
    return (spec, *key), leaves, spec


class CudaGraph:
    """One ``torch.cuda.CUDAGraph``: `record` captures what ``fn`` launches (running none of it) and returns its
    output, `replay` launches it again. (A test on the CPU puts a stand-in here that records ``fn`` and calls it.)"""

    def __init__(self) -> None:
        self.graph = torch.cuda.CUDAGraph()

    def record(self, fn: Callable[[], tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        # thread_local: another thread's CUDA work (a learner training beside this one) does not break the capture
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            return fn()

    def replay(self) -> None:
        self.graph.replay()


@dataclass
class _Graph:
    graph: Any
    """A `CudaGraph` (or the test's stand-in)."""
    inputs: list[Any]
    """The static leaves: tensors the batch is copied into before a replay; other leaves as they were."""
    value: torch.Tensor
    found: torch.Tensor


@contextlib.contextmanager
def _capturable(opt: torch.optim.Optimizer) -> Iterator[None]:
    """Mark a fused Adam's groups capturable for the capture (its fused kernel ignores the flag otherwise)."""
    before = [g.get("capturable", False) for g in opt.param_groups]
    for g in opt.param_groups:
        g["capturable"] = True
    try:
        yield
    finally:
        for g, was in zip(opt.param_groups, before):
            g["capturable"] = was


class StepGraphs:
    """One trainer's captured window steps, by batch signature (see the module docstring)."""

    def __init__(self, trainer: Capturable, say: Callable[[str], None]) -> None:
        self.trainer = trainer
        self.say = say
        """Told once per signature why its step runs eagerly (the trainer logs ``trainer.window_uncaptured``)."""
        self.graphs: OrderedDict[tuple[Any, ...], _Graph] = OrderedDict()
        self.seen: dict[tuple[Any, ...], int] = {}
        self.refused: dict[tuple[Any, ...], str] = {}
        self.key: Optional[tuple[Any, ...]] = None
        self.captures = 0
        """Graphs captured so far (a dropped one captured again counts again)."""
        self.replays = 0
        self.graph_type: Callable[[], Any] = CudaGraph
        self._side: Optional[torch.cuda.Stream] = None

    def drop(self) -> None:
        """Forget every graph (their memory goes back when the last reference does)."""
        self.graphs.clear()
        self.seen.clear()
        self.key = None

    def check_state(self) -> None:
        """Drop the graphs if anything they hold by address or value changed since they were captured."""
        if self.graphs and state_key(self.trainer) != self.key:
            self.drop()

    def step(self, batch: Any, step: StepFn) -> tuple[torch.Tensor, torch.Tensor]:
        """One window step on ``batch``: replayed, captured or eager; returns the step's loss value and found flag
        as tensors of their own (a replay's outputs are cloned)."""
        try:
            sig, leaves, spec = _signature(batch)
        except TypeError:
            sig, leaves, spec = ("unhashable",), [], None
            if sig not in self.refused:
                self._refuse(sig, "a batch leaf that is neither a tensor nor hashable")
        graph = self.graphs.get(sig)
        if graph is not None:
            self.graphs.move_to_end(sig)
            return self._replay(graph, leaves)
        if sig not in self.refused:
            count = self.seen.get(sig, 0)
            if count < WARMUP:
                self.seen[sig] = count + 1
                return self._on_side_stream(lambda: step(batch, True))
            if len(self.graphs) >= MAX_GRAPHS:
                self.graphs.popitem(last=False)
            graph = self._capture(sig, leaves, spec, step)
            if graph is not None:
                return self._replay(graph, leaves)
        return step(batch, True)

    def _on_side_stream(self, fn: Callable[[], tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        if self.trainer.device.type != "cuda":  # a test's stand-in graphs on the CPU
            return fn()
        current = torch.cuda.current_stream(self.trainer.device)
        if self._side is None:
            self._side = torch.cuda.Stream(self.trainer.device)
        self._side.wait_stream(current)
        with torch.cuda.stream(self._side):
            out = fn()
        current.wait_stream(self._side)
        return out

    def _replay(self, graph: _Graph, leaves: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        for static, leaf in zip(graph.inputs, leaves):
            if isinstance(static, torch.Tensor):
                static.copy_(leaf, non_blocking=True)
        graph.graph.replay()
        self.replays += 1
        return graph.value.clone(), graph.found.clone()

    def _capture(self, sig: tuple[Any, ...], leaves: list[Any], spec: Any, step: StepFn) -> Optional[_Graph]:
        trainer = self.trainer
        inputs = [leaf.clone() if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
        static_batch = tree_unflatten(inputs, spec)
        trainer.optimizer.zero_grad(set_to_none=True)  # the captured backward writes the gradients, not adds
        graph = self.graph_type()
        try:
            with _capturable(trainer.optimizer):
                value, found = graph.record(lambda: step(static_batch, False))
        except Exception as exc:  # a step that reads a value back, an op with no capture: the eager window
            trainer.optimizer.zero_grad(set_to_none=True)
            self._refuse(sig, f"capture failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            return None
        entry = _Graph(graph, inputs, value, found)
        self.graphs[sig] = entry
        self.captures += 1
        self.key = state_key(trainer)
        return entry

    def _refuse(self, sig: tuple[Any, ...], why: str) -> None:
        self.refused[sig] = why
        self.say(why)

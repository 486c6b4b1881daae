"""Safe, atomic checkpoints with precision metadata.

* Written atomically: a temp file in the same directory, fsync, ``os.replace``,
  fsync of the directory. A process killed mid-write leaves the previous file.
* Read with ``torch.load(weights_only=True)``: a pickle that would run code is
  refused before anything runs.
* Every file carries a SHA-256 digest of its content (`payload_digest`),
  checked on load: a flipped bit anywhere in a tensor is one `CheckpointError`
  ("corrupt: digest mismatch"), not weights that are silently wrong. Files
  written before digests existed load with a ``checkpoint.no_digest`` note.
* The ``check_*`` functions validate a loaded payload against the live objects
  before a loader changes anything, so a checkpoint that does not fit fails
  whole and leaves the trainer as it was. A digest proves a file is the one
  written, not that it is one this trainer can use: a crafted payload with a
  valid digest (a string where Adam keeps ``exp_avg``, three ``betas``) would
  load and crash the next step. Each ``check_*`` compares one part of a payload
  with the live object it will replace and raises one `CheckpointError` naming
  the file and the field (``optimizer.state[3].exp_avg: expected a tensor of
  shape (64, 32), found str``); `FP16Trainer.apply_payload` runs them all
  before it restores anything.
* Every failure names the file and what is wrong.
"""

from __future__ import annotations

import hashlib
import math
import os
import pickle
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import torch

from genesis_fp16.base import storage
from genesis_fp16.base.errors import CheckpointError, strict_json_value  # noqa: F401  (re-exported, torch-free)
from genesis_fp16.base.telemetry import get_logger

FORMAT_NAME = "genesis-fp16-checkpoint"
# The digest is an added key, not a new layout: a reader of version 1 ignores
# it, so files stay readable by older genesis-fp16 and the version stays 1.
FORMAT_VERSION = 1
DIGEST_KEY = "digest"
DIGEST_ALGORITHM = "sha256"
NO_DIGEST_EVENT = "checkpoint.no_digest"
REQUIRED_KEYS = ("format", "format_version", "model")

PathLike = Union[str, os.PathLike]


def build_payload(
    *,
    model: dict[str, Any],
    optimizer: Optional[dict[str, Any]] = None,
    scaler: Optional[dict[str, Any]] = None,
    scheduler: Optional[dict[str, Any]] = None,
    counters: Optional[dict[str, Any]] = None,
    precision: str = "fp32",
    extra: Optional[dict[str, Any]] = None,
    rng: Optional[dict[str, Any]] = None,
    optimizer_type: Optional[str] = None,
) -> dict[str, Any]:
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "torch_version": str(torch.__version__),
        "precision": precision,
        "model": model,
        "optimizer": optimizer,
        "optimizer_type": optimizer_type,
        "scaler": scaler or {},
        "scheduler": scheduler,
        "counters": counters or {},
        "rng": rng or {},
        "extra": extra or {},
    }


def save_payload(path: PathLike, payload: dict[str, Any]) -> Path:
    if payload.get("format") != FORMAT_NAME:
        raise CheckpointError(f"{path}: refusing to write a payload without the {FORMAT_NAME!r} header")
    try:
        digest = {"algorithm": DIGEST_ALGORITHM, "value": payload_digest(payload)}
        payload = dict(payload, **{DIGEST_KEY: digest})  # the caller's dict is left as it was
        return storage.atomic_write(path, lambda fh: torch.save(payload, fh))
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"{path}: could not write checkpoint: {exc}") from exc


ZIP_MAGIC = b"PK\x03\x04"


def _unpickling_detail(exc: BaseException) -> str:
    """The reason in torch's weights-only error, without its advice to retry
    with ``weights_only=False`` (which would run the file's code)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    useful = [line for line in lines if "weights_only" not in line and not line.startswith("Check the documentation")]
    return useful[0] if useful else type(exc).__name__


def load_payload(path: PathLike, map_location: Union[str, torch.device, None] = "cpu") -> dict[str, Any]:
    """Load and validate a checkpoint written by `save_payload`."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: checkpoint does not exist")
    if not path.is_file():
        raise CheckpointError(f"{path}: not a regular file")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: checkpoint is empty (0 bytes); it was probably never finished")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != ZIP_MAGIC:
        # torch.save writes a zip archive; anything else is not one of ours (and
        # is never handed to an unpickler)
        raise CheckpointError(
            f"{path}: checkpoint is truncated or corrupt, or not a torch checkpoint at all "
            f"(starts with {magic!r}, expected a torch zip archive)"
        )
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{path}: refused to load: the file holds objects outside the safe set "
            f"(weights_only=True); it may be foreign or malicious. Detail: {_unpickling_detail(exc)}"
        ) from None
    except Exception as exc:  # torch raises many types for a torn or garbage file
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"{path}: checkpoint is truncated or corrupt ({first})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT_NAME:
        raise CheckpointError(
            f"{path}: not a genesis-fp16 checkpoint (no {FORMAT_NAME!r} header); it may come from another tool"
        )
    version = payload.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format version {version!r} is newer than this genesis-fp16 reads ({FORMAT_VERSION})"
        )
    if isinstance(version, bool) or version < 1:
        raise CheckpointError(
            f"{path}: field format_version: {version!r}; expected an integer from 1 to {FORMAT_VERSION}"
        )
    verify_digest(payload, path)
    missing = [k for k in REQUIRED_KEYS if k not in payload]
    if missing:
        raise CheckpointError(f"{path}: checkpoint lacks {', '.join(missing)}")
    return payload


# -- digests ------------------------------------------------------------------------------


def _feed(h: Any, value: Any) -> None:
    """Feed ``value`` to the hash ``h`` in a form that is the same before saving
    and after loading: a type tag, then the content (tensors as dtype, shape
    and raw bytes on the CPU, so a map_location does not change the digest)."""
    if value is None:
        h.update(b"N")
    elif isinstance(value, bool):
        h.update(b"T" if value else b"F")
    elif isinstance(value, int):
        text = str(value).encode()
        h.update(b"i" + struct.pack("<I", len(text)) + text)
    elif isinstance(value, float):
        h.update(b"f" + struct.pack("<d", value))
    elif isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
        h.update(b"s" + struct.pack("<Q", len(data)) + data)
    elif isinstance(value, (bytes, bytearray)):
        h.update(b"b" + struct.pack("<Q", len(value)) + bytes(value))
    elif isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        header = f"{tensor.dtype}|{tuple(tensor.shape)}".encode()
        h.update(b"t" + struct.pack("<I", len(header)) + header)
        if tensor.numel():
            h.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(value, Mapping):
        h.update(b"d" + struct.pack("<Q", len(value)))
        for key, item in value.items():  # insertion order survives torch.save/torch.load
            _feed(h, key)
            _feed(h, item)
    elif isinstance(value, (list, tuple)):
        h.update((b"l" if isinstance(value, list) else b"u") + struct.pack("<Q", len(value)))
        for item in value:
            _feed(h, item)
    elif isinstance(value, np.generic):
        _feed(h, value.item())
    elif isinstance(value, np.ndarray):
        _feed(h, torch.from_numpy(np.ascontiguousarray(value)) if value.dtype != object else value.tolist())
    elif isinstance(value, (torch.dtype, torch.device)):
        text = str(value).encode()
        h.update(b"y" + struct.pack("<I", len(text)) + text)
    else:
        raise CheckpointError(
            f"cannot digest a {type(value).__name__} in a checkpoint; checkpoints hold tensors, numbers, "
            "strings, None and dicts/lists/tuples of them"
        )


def payload_digest(payload: Mapping[str, Any]) -> str:
    """SHA-256 of everything in ``payload`` but its own digest, as hex."""
    h = hashlib.sha256()
    _feed(h, {k: v for k, v in payload.items() if k != DIGEST_KEY})
    return h.hexdigest()


def file_digest(path: PathLike) -> str:
    """SHA-256 of a file's bytes, as hex (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def note_missing_digest(path: PathLike) -> None:
    get_logger("genesis_fp16.training.checkpoint").info(
        NO_DIGEST_EVENT, path=str(path), reason="written before checkpoints carried a digest; loaded unverified"
    )


def verify_digest(payload: Mapping[str, Any], path: PathLike) -> None:
    """Raise `CheckpointError` unless ``payload`` matches its recorded digest; a
    payload without one (an older file) only logs a note."""
    if DIGEST_KEY not in payload:
        note_missing_digest(path)
        return
    recorded = payload[DIGEST_KEY]
    if not isinstance(recorded, Mapping) or recorded.get("algorithm") != DIGEST_ALGORITHM:
        raise CheckpointError(
            f"{path}: corrupt: the digest field is damaged ({recorded!r:.80}); resume from another checkpoint"
        )
    try:
        actual = payload_digest(payload)
    except CheckpointError as exc:
        raise CheckpointError(f"{path}: corrupt: {exc}") from None
    if actual != recorded.get("value"):
        raise CheckpointError(
            f"{path}: corrupt: digest mismatch (recorded {str(recorded.get('value'))[:16]}..., content "
            f"{actual[:16]}...); "
            "the file changed after it was written: resume from another checkpoint"
        )


# -- whether a loaded payload fits the live trainer, checked before anything changes -------------
def _bad(source: str, field: str, what: str) -> CheckpointError:
    return CheckpointError(f"{source}: field {field}: {what}")


def _kind(dtype: torch.dtype) -> str:
    if dtype.is_floating_point:
        return "float"
    if dtype.is_complex:
        return "complex"
    return str(dtype)


def check_model_state(saved: Any, live: Mapping[str, torch.Tensor], source: str) -> None:
    """``saved`` has exactly ``live``'s keys, each a tensor of the same shape and
    kind of dtype (any floating dtype loads into any other: FP32 into FP16 weights)."""
    if not isinstance(saved, Mapping):
        raise _bad(source, "model", f"a {type(saved).__name__}, expected a state dict")
    missing = [k for k in live if k not in saved]
    unexpected = [k for k in saved if k not in live]
    if missing or unexpected:
        raise _bad(
            source,
            "model",
            f"checkpoint does not fit this model: missing {missing[:5]}, unexpected {unexpected[:5]}; "
            "it was saved from another model",
        )
    for key, want in live.items():
        got = saved[key]
        if not isinstance(got, torch.Tensor):
            raise _bad(source, f"model.{key}", f"a {type(got).__name__}, expected a tensor")
        if tuple(got.shape) != tuple(want.shape):
            raise _bad(
                source,
                f"model.{key}",
                f"checkpoint does not fit this model: shape {tuple(got.shape)}, this model's is {tuple(want.shape)}",
            )
        if _kind(got.dtype) != _kind(want.dtype):
            raise _bad(
                source,
                f"model.{key}",
                f"checkpoint does not fit this model: dtype {got.dtype}, this model's is {want.dtype}",
            )


def optimizer_type_name(optimizer: torch.optim.Optimizer) -> str:
    cls = type(optimizer)
    return f"{cls.__module__}.{cls.__qualname__}"


def _found(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_like(saved: Any, live: Any, field: str, source: str, *, tensor_numbers: bool = False) -> None:
    """``saved`` has ``live``'s type and shape: a tensor of the same shape and
    kind of dtype (any float for a float: FP32 state loads beside FP16
    weights), a bool for a bool, a number for a number (or a one-element
    tensor where ``tensor_numbers``: torch keeps ``lr`` as either), a str for a
    str, a tuple or list of the same length whose items are alike (``betas``);
    None where live is None stands for an unset option (``foreach``), which
    may be a bool or a number."""
    if isinstance(live, torch.Tensor):
        shape = tuple(live.shape)
        if not isinstance(saved, torch.Tensor) or tuple(saved.shape) != shape:
            raise _bad(source, field, f"expected a tensor of shape {shape}, found {_found(saved)}")
        if _kind(saved.dtype) != _kind(live.dtype):
            raise _bad(source, field, f"expected a {_kind(live.dtype)} tensor, found {_found(saved)}")
    elif isinstance(live, bool):
        if not isinstance(saved, bool):
            raise _bad(source, field, f"expected true or false, found {_found(saved)}")
    elif _is_number(live):
        tensor = tensor_numbers and isinstance(saved, torch.Tensor) and saved.numel() == 1
        if not (_is_number(saved) or tensor):
            raise _bad(source, field, f"expected a number, found {_found(saved)}")
    elif isinstance(live, (tuple, list)):
        if not isinstance(saved, (tuple, list)) or len(saved) != len(live):
            length = f" of {len(saved)}" if isinstance(saved, (tuple, list)) else ""
            raise _bad(source, field, f"expected a {type(live).__name__} of {len(live)}, found {_found(saved)}{length}")
        for i, (got, want) in enumerate(zip(saved, live)):
            check_like(got, want, f"{field}[{i}]", source, tensor_numbers=tensor_numbers)
    elif isinstance(live, str):
        if not isinstance(saved, str):
            raise _bad(source, field, f"expected a str, found {_found(saved)}")
    elif live is None:
        if saved is not None and not isinstance(saved, (bool, int, float)):
            raise _bad(source, field, f"expected None, a bool or a number, found {_found(saved)}")


KERNEL_OPTIONS = ("fused", "foreach", "capturable", "differentiable")
"""Optimizer options that choose a kernel, not a hyperparameter: a checkpoint of a plain Adam fits a fused one."""


def check_param_groups(
    saved: Any,
    live: list[dict[str, Any]],
    source: str,
    field: str = "optimizer.param_groups",
    *,
    known_keys_only: bool = True,
) -> None:
    """Same number of groups and of parameters per group (integer ids or names), and
    every hyperparameter both have alike (`check_like`). ``known_keys_only``
    (where the checkpoint does not record its optimizer type): refuse groups
    that have hyperparameters this optimizer does not know *and* lack some it
    has (SGD's ``momentum`` against Adam's ``betas``): the sign of another
    optimizer type."""
    if not isinstance(saved, list) or not all(isinstance(g, Mapping) for g in saved):
        raise _bad(source, field, f"a {type(saved).__name__}, expected a list of parameter groups")
    if len(saved) != len(live):
        raise _bad(
            source,
            field,
            f"checkpoint does not fit this optimizer: {len(saved)} parameter groups, this optimizer has {len(live)}",
        )
    for i, (got, want) in enumerate(zip(saved, live)):
        params = got.get("params")
        if not isinstance(params, list) or len(params) != len(want["params"]):
            count = len(params) if isinstance(params, list) else params
            raise _bad(
                source,
                f"{field}[{i}].params",
                f"checkpoint does not fit this optimizer: {count!r} parameters, expected {len(want['params'])}",
            )
        # integer ids (a plain optimizer state dict) or parameter names (a
        # sharded one: torch.distributed.checkpoint keys parameters by name)
        ids = all(isinstance(pid, int) and not isinstance(pid, bool) for pid in params)
        if not (ids or all(isinstance(pid, str) for pid in params)):
            raise _bad(source, f"{field}[{i}].params", "expected a list of integer parameter ids or of parameter names")
        # an LR scheduler adds initial_lr; a newer torch adds keys one way only
        # (and load_state_dict fills in its defaults): another optimizer type
        # has keys of its own on both sides
        foreign = sorted(k for k in got if k not in want and k != "initial_lr")
        lacking = [k for k in want if k not in got and k != "initial_lr"]
        if foreign and lacking and known_keys_only:
            raise _bad(
                source,
                f"{field}[{i}]",
                f"checkpoint does not fit this optimizer: hyperparameters {foreign} belong to another optimizer type",
            )
        for key, value in got.items():
            if (
                key in KERNEL_OPTIONS
            ):  # how the optimizer computes is the live one's (a load keeps it: FP16Trainer.apply_payload)
                if value is not None and not isinstance(value, bool):
                    raise _bad(source, f"{field}[{i}].{key}", f"expected true, false or null, found {_found(value)}")
            elif key != "params" and key in want:
                check_like(value, want[key], f"{field}[{i}].{key}", source, tensor_numbers=True)


def stepped_states(optimizer: torch.optim.Optimizer) -> Optional[list[Mapping[str, Any]]]:
    """The state ``optimizer`` keeps per parameter once it has stepped (in
    parameter order), from one step of a throwaway optimizer of its type and
    hyperparameters on zero parameters with zero gradients; None where that
    cannot be built (an optimizer that needs a closure or other arguments).
    Used only where the live optimizer has not stepped, so a fresh trainer
    resuming from a checkpoint still knows ``exp_avg``'s shape."""
    try:
        groups = []
        for group in optimizer.param_groups:
            copies = [torch.zeros_like(p, requires_grad=True) for p in group["params"]]
            for copy in copies:
                copy.grad = torch.zeros_like(copy)
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": copies})
        probe = type(optimizer)(groups, **optimizer.defaults)
        probe.step()
    except Exception:  # a custom optimizer: the generic rule in _check_param_state applies
        return None
    return [probe.state.get(copy, {}) for group in probe.param_groups for copy in group["params"]]


def _check_param_state(
    saved: Mapping[str, Any], live: Mapping[str, Any], param: torch.Tensor, field: str, source: str
) -> None:
    """One parameter's saved state against the state this optimizer keeps for
    it: the same keys, each value alike (`check_like`). With nothing to
    compare (`stepped_states` failed), each value is a tensor of the
    parameter's shape or fewer elements (factored second moments), a number,
    or a list of those (LBFGS's history)."""
    if live:
        for key in live:
            if key not in saved:
                raise _bad(
                    source, f"{field}.{key}", "missing; this optimizer keeps it for every parameter it has stepped"
                )
        for key, value in saved.items():
            if key not in live:
                raise _bad(
                    source,
                    f"{field}.{key}",
                    "not in this optimizer's state (another optimizer type, or other hyperparameters)",
                )
            check_like(value, live[key], f"{field}.{key}", source)
        return
    shape = tuple(param.shape)
    for key, value in saved.items():
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, torch.Tensor):
                same_size = item.numel() == param.numel()
                if item.dim() and (item.numel() > param.numel() or (same_size and tuple(item.shape) != shape)):
                    raise _bad(
                        source,
                        f"{field}.{key}",
                        f"expected a tensor of shape {shape} or fewer elements, found {_found(item)}",
                    )
            elif item is not None and not isinstance(item, (bool, int, float)):
                raise _bad(source, f"{field}.{key}", f"expected a tensor or a number, found {_found(item)}")


def check_optimizer_state(saved: Any, optimizer: torch.optim.Optimizer, saved_type: Any, source: str) -> None:
    """``saved`` (an ``optimizer.state_dict()``) loads into ``optimizer`` whole
    and steps on: same type (where the checkpoint records it), same groups
    with alike hyperparameters, and per-parameter state only for parameters
    that exist, each value alike the live one (`check_like`: keys, types,
    shapes)."""
    if saved is None:
        return
    mine = optimizer_type_name(optimizer)
    if saved_type is not None and saved_type != mine:
        raise _bad(
            source,
            "optimizer_type",
            f"checkpoint does not fit this optimizer: saved from {saved_type}, this trainer's is {mine}",
        )
    if not isinstance(saved, Mapping) or not isinstance(saved.get("state"), Mapping):
        raise _bad(source, "optimizer", "expected an optimizer state dict with 'state' and 'param_groups'")
    live_groups = optimizer.state_dict()["param_groups"]
    check_param_groups(saved.get("param_groups"), live_groups, source, known_keys_only=saved_type is None)
    ids = [pid for group in saved["param_groups"] for pid in group["params"]]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    index = {pid: i for i, pid in enumerate(ids)}
    stepped: Optional[list[Mapping[str, Any]]] = None
    probed = False
    for pid, per_param in saved["state"].items():
        if isinstance(pid, bool) or pid not in index:
            raise _bad(source, f"optimizer.state[{pid!r}]", "state for a parameter that no parameter group lists")
        if not isinstance(per_param, Mapping):
            raise _bad(source, f"optimizer.state[{pid!r}]", f"a {type(per_param).__name__}, expected a dict")
        param = params[index[pid]]
        live = optimizer.state.get(param, {})
        if not live and per_param:  # this optimizer has not stepped yet: learn its state from a probe
            if not probed:
                stepped, probed = stepped_states(optimizer), True
            live = stepped[index[pid]] if stepped else {}
        _check_param_state(per_param, live, param, f"optimizer.state[{pid}]", source)


_SCALER_FIELDS = {
    "scale": (lambda v: math.isfinite(v) and v > 0, "a finite number > 0"),
    "growth_factor": (lambda v: math.isfinite(v) and v > 1, "a finite number > 1"),
    "backoff_factor": (lambda v: 0 < v < 1, "a number between 0 and 1"),
    "growth_interval": (lambda v: isinstance(v, int) and v > 0, "an integer > 0"),
    "_growth_tracker": (lambda v: isinstance(v, int) and v >= 0, "an integer >= 0"),
}


def check_scaler_state(state: Any, source: str) -> None:
    """``state`` is ``{}`` (saved without a scaler) or a whole ``GradScaler.state_dict()``."""
    if state is None:
        return
    if not isinstance(state, Mapping):
        raise _bad(source, "scaler", f"a {type(state).__name__}, expected the GradScaler's state dict")
    if not state:
        return
    for key, (valid, expected) in _SCALER_FIELDS.items():
        if key not in state:
            raise _bad(source, f"scaler.{key}", "missing; the scaler state is incomplete")
        value = state[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not valid(value):
            raise _bad(source, f"scaler.{key}", f"{value!r:.60}, expected {expected}")


COUNTER_NAMES = ("training_steps", "overflow_steps", "nonfinite_losses", "micro_steps", "samples_seen")


def check_counters(counters: Any, source: str) -> dict[str, int]:
    """The trainer's counters, each a non-negative integer (absent ones are 0)."""
    if counters is None:
        counters = {}
    if not isinstance(counters, Mapping):
        raise _bad(source, "counters", f"a {type(counters).__name__}, expected a dict of counts")
    out = {}
    for name in COUNTER_NAMES:
        value = counters.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise _bad(source, f"counters.{name}", f"{value!r:.60}, expected an integer >= 0")
        out[name] = value
    return out


def _rng_size() -> int:
    return int(torch.get_rng_state().numel())


def generator_state_problem(value: Any) -> Optional[str]:
    """What is wrong with ``value`` as a CPU ``torch.Generator`` state, or None."""
    size = _rng_size()
    if isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and tuple(value.shape) == (size,):
        return None
    return f"{_describe(value)}, expected a uint8 tensor of shape ({size},)"


def check_rng_state(rng: Any, source: str) -> None:
    """``torch_cpu`` (one generator state) and ``torch_cpu_ranks`` (one per rank)
    are byte tensors of the CPU generator's state size."""
    if rng is None:
        return
    if not isinstance(rng, Mapping):
        raise _bad(source, "rng", f"a {type(rng).__name__}, expected a dict of generator states")
    size = _rng_size()
    one = rng.get("torch_cpu")
    problem = None if one is None else generator_state_problem(one)
    if problem:
        raise _bad(source, "rng.torch_cpu", problem)
    ranks = rng.get("torch_cpu_ranks")
    if ranks is not None and not (
        isinstance(ranks, torch.Tensor) and ranks.dtype == torch.uint8 and ranks.dim() == 2 and ranks.shape[1] == size
    ):
        raise _bad(
            source, "rng.torch_cpu_ranks", f"{_describe(ranks)}, expected a uint8 tensor of shape (world_size, {size})"
        )


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def check_scheduler_state(saved: Any, live: Mapping[str, Any], source: str) -> None:
    """``saved`` is a state dict of the same scheduler type as ``live``'s: no key
    it does not know, numbers where it has numbers, lists as long as its lists."""
    if saved is None:
        return
    if not isinstance(saved, Mapping):
        raise _bad(source, "scheduler", f"a {type(saved).__name__}, expected a scheduler state dict")
    for key, value in saved.items():
        if key not in live:
            raise _bad(
                source,
                f"scheduler.{key}",
                "unknown to this scheduler; the checkpoint was saved with another scheduler type",
            )
        want = live[key]
        if isinstance(want, (int, float)) and not isinstance(want, bool):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise _bad(source, f"scheduler.{key}", f"{value!r:.60}, expected a number")
        elif isinstance(want, list) and (not isinstance(value, list) or len(value) != len(want)):
            raise _bad(source, f"scheduler.{key}", f"{value!r:.60}, expected a list of {len(want)}")

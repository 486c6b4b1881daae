"""Safe, atomic checkpoints with precision metadata.

* Written atomically: a temp file in the same directory, fsync, ``os.replace``,
  fsync of the directory. A process killed mid-write leaves the previous file.
* Read with ``torch.load(weights_only=True)``: a pickle that would run code is
  refused before anything runs.
* Every file carries a SHA-256 digest of its content (`payload_digest`),
  checked on load: a flipped bit anywhere in a tensor is one `CheckpointError`
  ("corrupt: digest mismatch"), not weights that are silently wrong. Files
  written before digests existed load with a ``checkpoint.no_digest`` note.
* The ``check_*`` functions (`genesis_fp16.checkpoint_checks`, re-exported
  here) validate a loaded payload against the live objects before a loader
  changes anything, so a checkpoint that does not fit fails whole and leaves
  the trainer as it was.
* Every failure names the file and what is wrong.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Optional, Union

import numpy as np
import torch

from .checkpoint_checks import (  # noqa: F401 - re-exported: trainer, fsdp and dynamics use them from here
    KERNEL_OPTIONS,
    check_counters,
    check_model_state,
    check_optimizer_state,
    check_param_groups,
    check_rng_state,
    check_scaler_state,
    check_scheduler_state,
    generator_state_problem,
    optimizer_type_name,
)
from .errors import CheckpointError, strict_json_value  # noqa: F401  (re-exported: defined torch-free for the CLI)
from .telemetry import get_logger

FORMAT_NAME = "genesis-fp16-checkpoint"
# The digest is an added key, not a new layout: a reader of version 1 ignores
# it, so files stay readable by older genesis-fp16 and the version stays 1.
FORMAT_VERSION = 1
DIGEST_KEY = "digest"
DIGEST_ALGORITHM = "sha256"
NO_DIGEST_EVENT = "checkpoint.no_digest"
REQUIRED_KEYS = ("format", "format_version", "model")

PathLike = Union[str, os.PathLike]


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# mkstemp creates files 0600; a finished file gets the mode open() would give.
_FILE_MODE = 0o666 & ~_read_umask()


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: PathLike, write: Callable[[io.BufferedWriter], None]) -> Path:
    """Write a file atomically: ``write`` fills a temp file that replaces
    ``path`` only once it is complete and on disk."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            if hasattr(os, "fchmod"):
                os.fchmod(fh.fileno(), _FILE_MODE)
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


def atomic_write_bytes(path: PathLike, data: bytes) -> Path:
    return atomic_write(path, lambda fh: fh.write(data))


def atomic_write_text(path: PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


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
        return atomic_write(path, lambda fh: torch.save(payload, fh))
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
            f"{path}: not a genesis-fp16 checkpoint (no {FORMAT_NAME!r} header); "
            "it may come from another tool"
        )
    version = payload.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format version {version!r} is newer than this genesis-fp16 reads ({FORMAT_VERSION})"
        )
    if isinstance(version, bool) or version < 1:
        raise CheckpointError(f"{path}: field format_version: {version!r}; expected an integer from 1 to {FORMAT_VERSION}")
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
    get_logger("genesis_fp16.checkpoint").info(
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
        raise CheckpointError(f"{path}: corrupt: the digest field is damaged ({recorded!r:.80}); resume from another checkpoint")
    try:
        actual = payload_digest(payload)
    except CheckpointError as exc:
        raise CheckpointError(f"{path}: corrupt: {exc}") from None
    if actual != recorded.get("value"):
        raise CheckpointError(
            f"{path}: corrupt: digest mismatch (recorded {str(recorded.get('value'))[:16]}..., content {actual[:16]}...); "
            "the file changed after it was written: resume from another checkpoint"
        )

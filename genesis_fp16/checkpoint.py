"""Safe, atomic checkpoints with precision metadata.

* Written atomically: a temp file in the same directory, fsync, ``os.replace``,
  fsync of the directory. A process killed mid-write leaves the previous file.
* Read with ``torch.load(weights_only=True)``: a pickle that would run code is
  refused before anything runs.
* Every failure names the file and what is wrong.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional, Union

import torch

FORMAT_NAME = "genesis-fp16-checkpoint"
FORMAT_VERSION = 1
REQUIRED_KEYS = ("format", "format_version", "model")

PathLike = Union[str, os.PathLike]


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# mkstemp creates files 0600; a finished file gets the mode open() would give.
_FILE_MODE = 0o666 & ~_read_umask()


class CheckpointError(RuntimeError):
    """A checkpoint could not be read or written; the message names the file."""


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


def strict_json_value(data: Any) -> Any:
    """``data`` with NaN and infinities as the strings "nan", "inf", "-inf":
    ``json.dumps`` would write bare NaN/Infinity tokens, which strict JSON
    parsers (jq, JavaScript) refuse."""
    if isinstance(data, float) and not math.isfinite(data):
        return "nan" if math.isnan(data) else ("inf" if data > 0 else "-inf")
    if isinstance(data, dict):
        return {k: strict_json_value(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [strict_json_value(v) for v in data]
    return data


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
) -> dict[str, Any]:
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "torch_version": str(torch.__version__),
        "precision": precision,
        "model": model,
        "optimizer": optimizer,
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
    missing = [k for k in REQUIRED_KEYS if k not in payload]
    if missing:
        raise CheckpointError(f"{path}: checkpoint lacks {', '.join(missing)}")
    return payload

"""FSDP2 checkpoint I/O with ``torch.distributed.checkpoint`` (DCP), read safely.

A checkpoint is a directory: ``shards/`` (DCP: model and optimizer tensors,
each rank its shard) and ``trainer.pt`` (the single-process format: scaler,
scheduler, counters, optimizer hyperparameters, per-rank RNG). DCP's own
``.metadata`` file is a pickle; it is read with an allow-list unpickler, and
the load planner refuses pickled items, so loading a checkpoint never runs
code from it. ``shards/digests.json`` records the SHA-256 of every shard file
and of ``.metadata``; they are checked before DCP reads a byte of them, and
DCP loads into copies of the live tensors, so a damaged checkpoint changes
nothing.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any, Union

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from genesis_fp16.base.storage import atomic_write_text
from genesis_fp16.training import checkpoint as ckpt

FSDP_LAYOUT = "fsdp-dcp"
FSDP_TRAINER_FILE = "trainer.pt"
FSDP_SHARDS_DIR = "shards"
DIGEST_MANIFEST = "digests.json"


# -- writing ----------------------------------------------------------------------------


def save_sharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer, shards: Path) -> dict[str, Any]:
    """Collective: every rank writes its model and optimizer tensors to ``shards``.
    Returns the optimizer's non-tensor part, which goes to the trainer file."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    tensors, scalars = _split_optim_state(optim_sd["state"])
    dcp.save({"model": model_sd, "optim": tensors}, checkpoint_id=str(shards))
    # dcp.save returns once the coordinator wrote .metadata, after every rank's files
    if not dist.is_initialized() or dist.get_rank() == 0:
        write_shard_digests(shards)
    return {"param_groups": optim_sd["param_groups"], "scalar_state": scalars}


def write_shard_digests(shards: Path) -> Path:
    """Record the SHA-256 of every file in ``shards`` in its digest manifest (atomically)."""
    files = {
        f.name: ckpt.file_digest(f) for f in sorted(Path(shards).iterdir()) if f.is_file() and f.name != DIGEST_MANIFEST
    }
    manifest = {"algorithm": ckpt.DIGEST_ALGORITHM, "files": files}
    return atomic_write_text(Path(shards) / DIGEST_MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))


def verify_shard_digests(shards: Path) -> None:
    """Raise `CheckpointError` unless every file the manifest lists is there with
    its recorded digest; shards written without a manifest only log a note."""
    manifest_path = Path(shards) / DIGEST_MANIFEST
    if not manifest_path.is_file():
        ckpt.note_missing_digest(shards)
        return
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        files = manifest["files"]
        ok = manifest["algorithm"] == ckpt.DIGEST_ALGORITHM and isinstance(files, dict) and ".metadata" in files
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ckpt.CheckpointError(f"{manifest_path}: corrupt: the digest manifest cannot be read ({exc})") from None
    if not ok:
        raise ckpt.CheckpointError(
            f"{manifest_path}: corrupt: the digest manifest is damaged; resume from another checkpoint"
        )
    for name, recorded in sorted(files.items()):
        if not isinstance(name, str) or os.path.basename(name) != name or name in ("", ".", ".."):
            raise ckpt.CheckpointError(
                f"{manifest_path}: the digest manifest names {name!r}, outside the shards directory"
            )
        shard = Path(shards) / name
        if not shard.is_file():
            raise ckpt.CheckpointError(
                f"{shard}: missing: the digest manifest lists it; resume from another checkpoint"
            )
        if ckpt.file_digest(shard) != recorded:
            raise ckpt.CheckpointError(
                f"{shard}: corrupt: digest mismatch; the shard changed after it was written: resume from another "
                "checkpoint"
            )


def partial_dir(path: Path) -> Path:
    """Where a checkpoint directory is written before it is renamed to ``path``."""
    return path.parent / f".{path.name}.partial"


def replace_dir(partial: Path, path: Path) -> None:
    """Move the complete ``partial`` to ``path``; an old ``path`` goes only after."""
    old = path.parent / f".{path.name}.old"
    if path.exists():
        shutil.rmtree(old, ignore_errors=True)
        path.rename(old)
    partial.rename(path)
    shutil.rmtree(old, ignore_errors=True)


# -- reading ----------------------------------------------------------------------------


def read_trainer_file(path: Path) -> dict[str, Any]:
    """The ``trainer.pt`` payload of the checkpoint directory ``path``, after
    checking that it is one and that its metadata pickle is safe to read."""
    trainer_file = path / FSDP_TRAINER_FILE
    if not path.is_dir() or not trainer_file.is_file():
        raise ckpt.CheckpointError(
            f"{path}: not an FSDP checkpoint directory (expected {FSDP_SHARDS_DIR}/ and {FSDP_TRAINER_FILE}); "
            "DDP and single-process checkpoints are single files"
        )
    payload = ckpt.load_payload(trainer_file, map_location="cpu")
    if payload.get("layout") != FSDP_LAYOUT:
        raise ckpt.CheckpointError(f"{trainer_file}: layout {payload.get('layout')!r}, expected {FSDP_LAYOUT!r}")
    # the metadata pickle is checked before anything else touches it (no collective needed)
    _safe_reader(path / FSDP_SHARDS_DIR).read_metadata()
    return payload


def load_sharded(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, shards: Path, saved_optimizer: dict[str, Any]
) -> None:
    """Collective: load ``shards`` into ``model`` and ``optimizer`` (DCP reshards
    to this world size); ``saved_optimizer`` is the trainer file's optimizer part."""
    model_sd, optim_sd = get_state_dict(model, optimizer)  # targets with the right sharding
    tensors, _ = _split_optim_state(optim_sd["state"])
    # get_state_dict hands out the live tensors and dcp.load fills its targets in
    # place: load into copies, so a load that fails half-way changes nothing
    target = {"model": _copies(model_sd), "optim": _copies(tensors)}
    _load_shards(target, shards)
    merged = {
        "state": _merge_optim_state(target["optim"], saved_optimizer.get("scalar_state") or {}),
        "param_groups": saved_optimizer.get("param_groups") or optim_sd["param_groups"],
    }
    set_state_dict(model, optimizer, model_state_dict=target["model"], optim_state_dict=merged)


def _copies(state: dict[str, Any]) -> dict[str, Any]:
    return {
        k: _copies(v) if isinstance(v, dict) else (v.detach().clone() if isinstance(v, torch.Tensor) else v)
        for k, v in state.items()
    }


def _split_optim_state(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Tensors go to DCP; anything else (rare: ints, None) to the trainer file,
    so DCP never needs to pickle (and we never unpickle) a non-tensor."""
    tensors: dict[str, Any] = {}
    scalars: dict[str, Any] = {}
    for fqn, per_param in state.items():
        for key, value in per_param.items():
            (tensors if isinstance(value, torch.Tensor) else scalars).setdefault(fqn, {})[key] = value
    return tensors, scalars


def _merge_optim_state(tensors: dict[str, Any], scalars: dict[str, Any]) -> dict[str, Any]:
    merged = {fqn: dict(values) for fqn, values in tensors.items()}
    for fqn, values in scalars.items():
        merged.setdefault(fqn, {}).update(values)
    return merged


# -- safe DCP reading -------------------------------------------------------------------

# Exact (module, name) pairs, resolved without walking dotted names: the globals
# in the .metadata pickle of an FSDP2 checkpoint saved by torch 2.13's DCP
# (recorded with a find_class that logs), plus BytesStorageMetadata, which DCP
# writes for a non-tensor entry (the planner then refuses that entry by name).
# A prefix such as "torch.distributed.checkpoint." would admit
# "torch.distributed.checkpoint.filesystem" + "os.system" under pickle protocol 4.
_SAFE_GLOBALS = frozenset(
    {
        ("torch.distributed.checkpoint.metadata", "Metadata"),
        ("torch.distributed.checkpoint.metadata", "MetadataIndex"),
        ("torch.distributed.checkpoint.metadata", "StorageMeta"),
        ("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"),
        ("torch.distributed.checkpoint.metadata", "TensorProperties"),
        ("torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"),
        ("torch.distributed.checkpoint.metadata", "BytesStorageMetadata"),
        ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),  # looks a layout up by name in a fixed table
        ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id
        ("pathlib", "WindowsPath"),
    }
)


class _RefusedGlobal(pickle.UnpicklingError):
    """The metadata pickle names a global outside the allow-list."""


class _MetadataUnpickler(pickle.Unpickler):
    """DCP's ``.metadata`` file is a pickle (a torch design); unpickle only the
    DCP metadata classes and torch dtypes, nothing that runs code."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _SAFE_GLOBALS:
            return getattr(importlib.import_module(module), name)
        if module == "torch" and "." not in name and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)  # a dtype pickles as the global torch.<name>
        raise _RefusedGlobal(f"DCP metadata refers to {module}.{name}, which is not a DCP metadata class")


def _read_dcp_metadata(path: Path) -> Metadata:
    """Unpickle ``path`` with the allow-list; every failure is one ``CheckpointError``
    naming the file, what is wrong with it and what to do."""
    redo = "save the checkpoint again or resume from another one"
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ckpt.CheckpointError(f"{path}: cannot read the DCP metadata ({exc.strerror or exc}); {redo}") from None
    if not data:
        raise ckpt.CheckpointError(
            f"{path}: the DCP metadata is empty (0 bytes), so the checkpoint was not written completely; {redo}"
        )
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except _RefusedGlobal as exc:
        raise ckpt.CheckpointError(
            f"{path}: refused to load: {exc}. torch writes no such global, so the file was crafted or "
            "tampered with; do not load this checkpoint"
        ) from None
    except Exception as exc:
        raise ckpt.CheckpointError(
            f"{path}: the DCP metadata is corrupt or truncated ({type(exc).__name__}: {exc}); {redo}"
        ) from None
    if not isinstance(metadata, Metadata):
        raise ckpt.CheckpointError(
            f"{path}: the DCP metadata holds a {type(metadata).__name__}, not DCP metadata; {redo}"
        )
    if not isinstance(metadata.storage_data, dict):
        raise ckpt.CheckpointError(
            f"{path}: the DCP metadata has no file table (storage_data is a {type(metadata.storage_data).__name__}); "
            f"{redo}"
        )
    for info in metadata.storage_data.values():
        name = info.relative_path if isinstance(info, _StorageInfo) else None
        if not isinstance(name, str) or name in ("", ".", "..") or os.path.basename(name) != name or "\\" in name:
            raise ckpt.CheckpointError(
                f"{path}: the DCP metadata points at {name!r}, outside the checkpoint directory; do not load this "
                "checkpoint"
            )
    return metadata


class SafeFileSystemReader(FileSystemReader):
    """A DCP ``FileSystemReader`` whose metadata unpickling is restricted."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        metadata = _read_dcp_metadata(Path(self._get_metadata_path(kwargs.get("rank"))))
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class TensorOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, but a pickled item is refused instead of
    read: ``DefaultLoadPlanner.load_bytes`` would ``torch.load(weights_only=False)`` it."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        raise ckpt.CheckpointError(
            f"DCP item {read_item.dest_index.fqn!r} is a pickled object; genesis-fp16 shards hold tensors only"
        )


def _safe_reader(path: Union[str, Path]) -> SafeFileSystemReader:
    return SafeFileSystemReader(str(path))


def _load_shards(target: dict[str, Any], shards: Path) -> None:
    """``dcp.load`` into ``target`` through the safe reader and planner; a failure
    is one ``CheckpointError`` (DCP's own ``CheckpointException`` is a
    ``BaseException`` that ``except Exception`` would let through)."""
    verify_shard_digests(shards)
    reader = _safe_reader(shards)
    # read first: DCP would log the failure with a traceback, then retry a per-rank file
    reader.read_metadata()
    try:
        dcp.load(target, storage_reader=reader, planner=TensorOnlyLoadPlanner())
    except CheckpointException as exc:
        reasons = dict.fromkeys(f"rank {rank}: {err}" for rank, (err, _) in sorted(exc.failures.items()))
        raise ckpt.CheckpointError(
            f"{shards}: could not read the DCP shards ({'; '.join(reasons)}); the shard files are missing or damaged, "
            "save the checkpoint again or resume from another one"
        ) from None
    except Exception as exc:
        raise ckpt.CheckpointError(f"{shards}: could not read the DCP shards: {exc}") from None

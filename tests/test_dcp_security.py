"""Reading a DCP checkpoint's ``.metadata`` pickle: crafted files are refused
before anything runs, damaged files give one clear error.

The crafted pickles call ``os.system("touch MARKER")``; every test checks the
marker file is never created. Only the end-to-end test starts processes
(``torchrun`` with one worker).
"""

from __future__ import annotations

import io
import os
import pickle
import shlex
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from genesis_fp16.training import checkpoint as ckpt
from genesis_fp16 import distributed as gd
from genesis_fp16.training.checkpoint import CheckpointError

# DCP in one process (no process group) says so on every save and load
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

REPO = Path(__file__).resolve().parents[1]
FS = "torch.distributed.checkpoint.filesystem"


# -- crafted pickles -----------------------------------------------------------------


def _text(s: str) -> bytes:
    data = s.encode()
    return b"X" + struct.pack("<I", len(data)) + data  # BINUNICODE


def _stack_global(module: str, name: str) -> bytes:
    return _text(module) + _text(name) + b"\x93"  # STACK_GLOBAL (protocol 4)


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"  # GLOBAL (protocols 0-3)


def _call(protocol: int, global_op: bytes, marker: Path) -> bytes:
    """PROTO, push the global, call it with ("touch MARKER",), STOP."""
    return bytes([0x80, protocol]) + global_op + _text(f"touch {shlex.quote(str(marker))}") + b"\x85R."


# (id, protocol, opcode builder, module, name)
CRAFTED = [
    ("proto4-stack-global-dotted", 4, _stack_global, FS, "os.system"),
    ("proto4-global-opcode-dotted", 4, _global, FS, "os.system"),
    ("proto2-global-dotted", 2, _global, FS, "os.system"),
    ("proto2-module-through-import", 2, _global, FS, "os"),
    ("package-then-dotted-name", 4, _stack_global, "torch.distributed.checkpoint", "filesystem.os.system"),
    ("allowed-class-then-attribute", 4, _stack_global, "torch.distributed.checkpoint.metadata", "Metadata.__init__"),
    ("plain-os-system", 2, _global, "os", "system"),
]
LIVE = {"proto4-stack-global-dotted", "proto4-global-opcode-dotted"}  # run code through plain pickle


def crafted(case: str, marker: Path) -> bytes:
    for name, protocol, op, module, global_name in CRAFTED:
        if name == case:
            return _call(protocol, op(module, global_name), marker)
    raise KeyError(case)


@pytest.mark.parametrize("case", sorted(LIVE))
def test_the_crafted_pickle_really_runs_code_through_plain_pickle(tmp_path: Path, case: str) -> None:
    # proves the payload used below is a working exploit, so "no marker" means "refused"
    marker = tmp_path / "pwned"
    pickle.loads(crafted(case, marker))
    assert marker.exists()


@pytest.mark.parametrize("case", [c[0] for c in CRAFTED])
def test_unpickler_refuses_crafted_globals(tmp_path: Path, case: str) -> None:
    marker = tmp_path / "pwned"
    _, _, _, module, name = next(c for c in CRAFTED if c[0] == case)
    with pytest.raises(pickle.UnpicklingError, match=f"refers to {module}.{name}, which is not a DCP metadata class"):
        gd.dcp_io._MetadataUnpickler(io.BytesIO(crafted(case, marker))).load()
    assert not marker.exists()


@pytest.mark.parametrize("case", [c[0] for c in CRAFTED])
def test_reader_names_the_file_and_the_refused_global(tmp_path: Path, case: str) -> None:
    marker = tmp_path / "pwned"
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / ".metadata").write_bytes(crafted(case, marker))
    _, _, _, module, name = next(c for c in CRAFTED if c[0] == case)
    with pytest.raises(CheckpointError) as err:
        gd.dcp_io._safe_reader(shards).read_metadata()
    message = str(err.value)
    assert str(shards / ".metadata") in message
    assert f"{module}.{name}" in message and "do not load" in message
    assert not marker.exists()


# -- genuine and damaged checkpoints, in one process (DCP without a process group) --------


def _state() -> dict[str, dict[str, torch.Tensor]]:
    return {
        "model": {
            "w16": torch.arange(6, dtype=torch.float16).reshape(2, 3),
            "wbf": torch.ones(4, dtype=torch.bfloat16),
        },
        "optim": {"w16": {"exp_avg": torch.full((2, 3), 0.5), "step": torch.tensor(3.0)}},
    }


@pytest.fixture(scope="module")
def genuine_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    shards = tmp_path_factory.mktemp("dcp") / "shards"
    dcp.save(_state(), checkpoint_id=str(shards))
    return shards


def test_genuine_metadata_needs_only_allowed_globals(genuine_shards: Path) -> None:
    seen: set[tuple[str, str]] = set()

    class Recording(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> object:
            seen.add((module, name))
            return super().find_class(module, name)

    Recording(io.BytesIO((genuine_shards / ".metadata").read_bytes())).load()
    dtypes = {("torch", "float16"), ("torch", "bfloat16"), ("torch", "float32")}
    assert dtypes <= seen
    assert seen - dtypes <= gd.dcp_io._SAFE_GLOBALS


def test_genuine_checkpoint_loads_through_the_safe_reader(genuine_shards: Path) -> None:
    target = {
        "model": {k: torch.zeros_like(v) for k, v in _state()["model"].items()},
        "optim": {"w16": {"exp_avg": torch.zeros(2, 3), "step": torch.tensor(0.0)}},
    }
    gd.dcp_io._load_shards(target, genuine_shards)
    expected = _state()
    assert torch.equal(target["model"]["w16"], expected["model"]["w16"])
    assert torch.equal(target["model"]["wbf"], expected["model"]["wbf"])
    assert torch.equal(target["optim"]["w16"]["exp_avg"], expected["optim"]["w16"]["exp_avg"])


def _copy_with_metadata(src: Path, dst: Path, metadata: bytes) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    (dst / ".metadata").write_bytes(metadata)
    return dst


@pytest.mark.parametrize(
    "damage, expected",
    [
        (lambda data: b"", "is empty (0 bytes)"),
        (lambda data: data[: len(data) // 2], "is corrupt or truncated"),
        (lambda data: b"\x00garbage" * 8, "is corrupt or truncated"),
        (lambda data: pickle.dumps([1, 2]), "holds a list, not DCP metadata"),
    ],
    ids=["zero-byte", "truncated", "garbage", "wrong-type"],
)
def test_damaged_metadata_is_one_clear_error(genuine_shards: Path, tmp_path: Path, damage, expected: str) -> None:
    data = (genuine_shards / ".metadata").read_bytes()
    shards = _copy_with_metadata(genuine_shards, tmp_path / "shards", damage(data))
    target = {"model": {k: torch.zeros_like(v) for k, v in _state()["model"].items()}}
    with pytest.raises(CheckpointError) as err:
        gd.dcp_io._load_shards(target, shards)
    message = str(err.value)
    assert str(shards / ".metadata") in message and expected in message
    assert "save" in message  # what to do
    assert "Traceback" not in message


def test_missing_metadata_and_missing_shard_file(genuine_shards: Path, tmp_path: Path) -> None:
    target = {"model": {k: torch.zeros_like(v) for k, v in _state()["model"].items()}}
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="cannot read the DCP metadata"):
        gd.dcp_io._load_shards(target, empty)
    # metadata fine, data file gone: DCP raises CheckpointException (a BaseException), converted here
    shards = _copy_with_metadata(genuine_shards, tmp_path / "shards", (genuine_shards / ".metadata").read_bytes())
    for f in shards.glob("*.distcp"):
        f.unlink()
    with pytest.raises(CheckpointError, match="could not read the DCP shards") as err:
        gd.dcp_io._load_shards(target, shards)
    assert "CheckpointException" not in str(err.value)


def test_metadata_pointing_outside_the_checkpoint_is_refused(genuine_shards: Path, tmp_path: Path) -> None:
    meta = gd.dcp_io._MetadataUnpickler(io.BytesIO((genuine_shards / ".metadata").read_bytes())).load()
    for info in meta.storage_data.values():
        info.relative_path = "../../outside.distcp"
    shards = _copy_with_metadata(genuine_shards, tmp_path / "shards", pickle.dumps(meta))
    with pytest.raises(CheckpointError, match="outside the checkpoint directory"):
        gd.dcp_io._safe_reader(shards).read_metadata()
    meta.storage_data = ["__0_0.distcp"]
    (shards / ".metadata").write_bytes(pickle.dumps(meta))
    with pytest.raises(CheckpointError, match="no file table"):
        gd.dcp_io._safe_reader(shards).read_metadata()


# -- FSDPTrainer.load_checkpoint and the script --------------------------------------------


def _crafted_checkpoint(root: Path, metadata: bytes) -> Path:
    """trainer.pt in the FSDP layout plus the given shards/.metadata."""
    root.mkdir()
    payload = ckpt.build_payload(model={}, extra={"wrap": "fsdp", "world_size": 1})
    payload["layout"] = gd.FSDP_LAYOUT
    ckpt.save_payload(root / gd.FSDP_TRAINER_FILE, payload)
    (root / gd.FSDP_SHARDS_DIR).mkdir()
    (root / gd.FSDP_SHARDS_DIR / ".metadata").write_bytes(metadata)
    return root


def test_fsdp_load_checkpoint_refuses_before_any_collective(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    root = _crafted_checkpoint(tmp_path / "ckpt", crafted("proto4-stack-global-dotted", marker))
    trainer = gd.FSDPTrainer.__new__(gd.FSDPTrainer)  # no model, no process group: the metadata is read first
    with pytest.raises(CheckpointError, match=f"{FS}.os.system"):
        trainer.load_checkpoint(root)
    assert not marker.exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.distributed
@pytest.mark.parametrize("kind", ["exploit", "zero-byte"])
def test_train_distributed_resume_from_a_bad_checkpoint(tmp_path: Path, kind: str) -> None:
    marker = tmp_path / "pwned"
    metadata = crafted("proto4-stack-global-dotted", marker) if kind == "exploit" else b""
    root = _crafted_checkpoint(tmp_path / "ckpt", metadata)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1", "--master_port", str(_free_port()),
        str(REPO / "scripts" / "train_distributed.py"),
        "--precision", "fp32", "--wrap", "fsdp", "--steps", "1", "--hidden", "8", "--resume", str(root),
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert not marker.exists()
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr[-3000:]
    expected = f"{FS}.os.system" if kind == "exploit" else "is empty (0 bytes)"
    assert str(root / gd.FSDP_SHARDS_DIR / ".metadata") in errors[0] and expected in errors[0]
    # the worker exits 2 without a traceback; what follows is torchrun's own report of a failed worker
    worker, launcher = proc.stderr.split("failed (exitcode: ", 1)
    assert launcher.startswith("2)") and "Traceback" not in worker

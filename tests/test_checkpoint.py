"""Safe, atomic checkpoints."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from structlog.testing import capture_logs

from genesis_fp16 import FP16Trainer, FP16TrainingConfig
from genesis_fp16.training.checkpoint import CheckpointError, build_payload, load_payload, save_payload
from genesis_fp16.base.storage import atomic_write_bytes


def small_trainer(precision="fp32"):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return FP16Trainer(model, opt, FP16TrainingConfig(precision=precision))


def train_a_bit(trainer, steps=3):
    for i in range(steps):
        x = torch.full((8, 4), float(i + 1))
        loss = trainer.training_step(x, lambda m, b: m(b).float().pow(2).mean())
        trainer.backward_and_step(loss)


def test_round_trip_holds_all_parts(tmp_path):
    trainer = small_trainer("fp16")
    train_a_bit(trainer)
    path = trainer.save_checkpoint(tmp_path / "a.pt")
    payload = load_payload(path)
    assert payload["format_version"] == 1
    assert payload["precision"] == "fp16"
    assert payload["torch_version"] == str(torch.__version__)
    assert payload["scaler"]["scale"] == trainer.get_stats()["current_scale"]
    assert payload["counters"]["training_steps"] == 3
    assert set(payload) >= {"model", "optimizer", "scaler", "scheduler", "counters", "rng", "extra"}


def test_malicious_pickle_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    # a real pickle payload that would create a file when unpickled
    code = textwrap.dedent(
        f"""
        import torch, os
        class Evil:
            def __reduce__(self):
                return (os.system, ("touch {marker}",))
        torch.save({{"format": "genesis-fp16-checkpoint", "format_version": 1, "model": Evil()}}, {str(evil)!r})
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert evil.exists() and not marker.exists()
    trainer = small_trainer()
    with pytest.raises(CheckpointError, match="refused to load") as info:
        trainer.load_checkpoint(evil)
    assert str(evil) in str(info.value)
    assert "posix.system" in str(info.value) or "os.system" in str(info.value)  # says what it refused
    assert "weights_only` set to `False`" not in str(info.value)  # and never advises running it
    assert not marker.exists()


def test_truncated_checkpoint_names_the_file(tmp_path):
    trainer = small_trainer()
    path = trainer.save_checkpoint(tmp_path / "good.pt")
    data = path.read_bytes()
    bad = tmp_path / "truncated.pt"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt") as info:
        small_trainer().load_checkpoint(bad)
    assert str(bad) in str(info.value)


@pytest.mark.parametrize(
    "content,fragment",
    [
        (b"", "empty"),
        (b"this is not a checkpoint at all" * 10, "truncated or corrupt"),
        (b"garbage\n", "not a torch checkpoint"),
        (b"\x80\x02}q\x00.", "not a torch checkpoint"),  # a bare pickle never reaches an unpickler
    ],
)
def test_garbage_files(tmp_path, content, fragment):
    path = tmp_path / "x.pt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=fragment):
        load_payload(path)


def test_foreign_checkpoint_is_named_foreign(tmp_path):
    path = tmp_path / "foreign.pt"
    torch.save({"state_dict": torch.nn.Linear(2, 2).state_dict()}, path)
    with pytest.raises(CheckpointError, match="not a genesis-fp16 checkpoint"):
        load_payload(path)


def test_newer_format_version_is_refused(tmp_path):
    payload = build_payload(model={})
    payload["format_version"] = 99
    path = tmp_path / "future.pt"
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="newer"):
        load_payload(path)


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_payload(tmp_path / "nope.pt")


def test_checkpoint_for_another_model_is_a_clear_error(tmp_path):
    path = small_trainer().save_checkpoint(tmp_path / "a.pt")
    other = FP16Trainer(torch.nn.Linear(5, 5), torch.optim.SGD(torch.nn.Linear(5, 5).parameters(), lr=0.1))
    with pytest.raises(CheckpointError, match="does not fit"):
        other.load_checkpoint(path)


def test_fp32_checkpoint_loads_into_fp16_trainer_with_one_warning(tmp_path):
    fp32 = small_trainer("fp32")
    train_a_bit(fp32)
    path = fp32.save_checkpoint(tmp_path / "fp32.pt")
    fp16 = small_trainer("fp16")
    with capture_logs() as logs:
        fp16.load_checkpoint(path)
    warnings = [log for log in logs if log["event"] == "checkpoint.fresh_scaler"]
    assert len(warnings) == 1 and warnings[0]["log_level"] == "warning"
    assert fp16.get_stats()["current_scale"] == 65536.0
    assert fp16.get_stats()["training_steps"] == 3
    for a, b in zip(fp16.model.parameters(), fp32.model.parameters()):
        assert torch.equal(a, b)
    train_a_bit(fp16)  # and it trains on


def test_atomic_write_leaves_no_temp_file_on_error(tmp_path):
    target = tmp_path / "f.bin"
    atomic_write_bytes(target, b"old")

    def boom(fh):
        fh.write(b"partial")
        raise RuntimeError("disk on fire")

    from genesis_fp16.base.storage import atomic_write

    with pytest.raises(RuntimeError):
        atomic_write(target, boom)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]


def test_process_killed_while_saving_leaves_previous_checkpoint(tmp_path):
    path = tmp_path / "ckpt.pt"
    ready = tmp_path / "ready"
    script = textwrap.dedent(
        f"""
        import torch, pathlib
        from genesis_fp16.training.checkpoint import build_payload, save_payload
        path = pathlib.Path({str(path)!r})
        save_payload(path, build_payload(model={{"w": torch.zeros(10)}}, extra={{"gen": 0}}))
        pathlib.Path({str(ready)!r}).touch()
        big = {{"w": torch.randn(4_000_000)}}
        gen = 1
        while True:  # keep overwriting until killed
            save_payload(path, build_payload(model=big, extra={{"gen": gen}}))
            gen += 1
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "GENESIS_FP16_STATE_DIR": str(tmp_path)})
    try:
        deadline = time.time() + 60
        while not ready.exists():
            assert proc.poll() is None, "writer died early"
            assert time.time() < deadline
            time.sleep(0.05)
        time.sleep(0.7)  # let it be in the middle of some write
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    payload = load_payload(path)  # whatever generation it holds, it is whole
    assert payload["extra"]["gen"] >= 0
    # temp files may be left by the kill, but never under the checkpoint's name
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert all(name.startswith(".ckpt.pt.") for name in leftovers)


def test_save_refuses_payload_without_header(tmp_path):
    with pytest.raises(CheckpointError, match="header"):
        save_payload(tmp_path / "x.pt", {"model": {}})


@pytest.mark.skipif(not hasattr(os, "fchmod"), reason="POSIX file modes only")
def test_atomic_write_gives_the_mode_open_would_give(tmp_path):
    import stat

    target = atomic_write_bytes(tmp_path / "m.bin", b"x")
    plain = tmp_path / "plain.bin"
    plain.write_bytes(b"x")
    # mkstemp alone would leave 0600; other users of the state dir need to read it
    assert stat.S_IMODE(target.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode)

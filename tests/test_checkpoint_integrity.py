"""Checkpoint loads are all or nothing, and damage is detected by a digest.

A load that fails must leave model, optimizer, scaler, scheduler, counters and
RNG exactly as they were, and say which file and which field is wrong.
"""

from __future__ import annotations

import random
import time
import zipfile
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from structlog.testing import capture_logs

from genesis_fp16 import FP16Trainer, FP16TrainingConfig
from genesis_fp16.training.checkpoint import NO_DIGEST_EVENT, CheckpointError, load_payload, save_payload

# DCP in one process (no process group) says so on every save and load
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def make_trainer(precision: str = "fp16", out: int = 3, optimizer: str = "adam", seed: int = 0) -> FP16Trainer:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, out))
    if optimizer == "adam":
        opt: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return FP16Trainer(model, opt, FP16TrainingConfig(precision=precision), scheduler=sched)


def train(trainer: FP16Trainer, steps: int = 3, offset: float = 0.0) -> None:
    for i in range(steps):
        x = torch.linspace(-1, 1, 32).reshape(8, 4) * (i + 1 + offset)
        loss = trainer.training_step(x, lambda m, b: m(b).float().pow(2).mean())
        trainer.backward_and_step(loss)


def state_of(trainer: FP16Trainer) -> dict[str, Any]:
    """Everything a load may change, copied."""

    def copy(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.detach().clone()
        if isinstance(value, dict):
            return {k: copy(v) for k, v in value.items()}
        if isinstance(value, list):
            return [copy(v) for v in value]
        return value

    return copy(
        {
            "model": trainer.model.state_dict(),
            "optimizer": trainer.optimizer.state_dict(),
            "scaler": trainer.precision.state_dict(),
            "scale": trainer.current_scale,
            "scheduler": trainer.scheduler.state_dict() if trainer.scheduler is not None else None,
            "counters": trainer.counters(),
            "rng": torch.get_rng_state(),
        }
    )


def assert_same(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), where
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    """A checkpoint after 3 FP16 steps, of a trainer that is not the one loading it."""
    trainer = make_trainer(seed=1)
    train(trainer)
    return trainer.save_checkpoint(tmp_path / "saved.pt")


def loader() -> FP16Trainer:
    trainer = make_trainer(seed=2)
    train(trainer, steps=2, offset=5.0)  # state of its own, different from the checkpoint's
    return trainer


def rewrite(src: Path, dst: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    """``src`` with ``change`` applied, saved with a valid digest: only validation can catch it."""
    payload = load_payload(src)
    change(payload)
    return save_payload(dst, payload)


def expect_refused(trainer: FP16Trainer, path: Path, field: str, **kwargs: Any) -> CheckpointError:
    before = state_of(trainer)
    with pytest.raises(CheckpointError) as info:
        trainer.load_checkpoint(path, **kwargs)
    message = str(info.value)
    assert str(path) in message and field in message, message
    assert_same(before, state_of(trainer))
    return info.value


# -- a checkpoint that does not fit, or holds bad fields: refused whole --------------------------


def test_another_shape_changes_nothing(saved: Path) -> None:
    # the first layer fits, the last does not: load_state_dict alone would copy the first
    other = make_trainer(out=2, seed=2)
    train(other, steps=1)
    expect_refused(other, saved, "model.2.weight")


def test_wrong_optimizer_type_changes_nothing(saved: Path, tmp_path: Path) -> None:
    sgd = make_trainer(optimizer="sgd", seed=2)
    train(sgd, steps=2)
    error = expect_refused(sgd, saved, "optimizer_type")
    assert "torch.optim.adam.Adam" in str(error)
    # a checkpoint that does not record its optimizer type: the hyperparameters tell
    untyped = rewrite(saved, tmp_path / "untyped.pt", lambda p: p.pop("optimizer_type"))
    expect_refused(sgd, untyped, "optimizer.param_groups[0]")


@pytest.mark.parametrize(
    "field, change",
    [
        ("counters.training_steps", lambda p: p["counters"].update(training_steps=-1)),
        ("counters.overflow_steps", lambda p: p["counters"].update(overflow_steps="3")),
        ("counters.samples_seen", lambda p: p["counters"].update(samples_seen=float("nan"))),
        ("counters", lambda p: p.update(counters=[1, 2])),
        ("rng.torch_cpu", lambda p: p["rng"].update(torch_cpu=torch.zeros(7, dtype=torch.uint8))),
        ("rng.torch_cpu", lambda p: p["rng"].update(torch_cpu=[1, 2, 3])),
        ("scaler.scale", lambda p: p["scaler"].update(scale=-4.0)),
        ("scaler.growth_interval", lambda p: p["scaler"].pop("growth_interval")),
        ("scaler.backoff_factor", lambda p: p["scaler"].update(backoff_factor="half")),
        ("scheduler.last_epoch", lambda p: p["scheduler"].update(last_epoch="x")),
        ("scheduler.lr_lambdas", lambda p: p["scheduler"].update(lr_lambdas=[None])),
        (
            "optimizer.param_groups",
            lambda p: p["optimizer"]["param_groups"].append(dict(p["optimizer"]["param_groups"][0])),
        ),
        ("optimizer.state[0].exp_avg", lambda p: p["optimizer"]["state"][0].update(exp_avg=torch.zeros(99, 99))),
        ("model.0.bias", lambda p: p["model"].update({"0.bias": [0.0] * 6})),
        ("model.0.bias", lambda p: p["model"].update({"0.bias": torch.zeros(6, dtype=torch.int64)})),
        ("extra", lambda p: p.update(extra=[1])),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_bad_field_is_one_error_naming_it(saved: Path, tmp_path: Path, field: str, change: Callable) -> None:
    bad = rewrite(saved, tmp_path / "bad.pt", change)
    expect_refused(loader(), bad, field)


def _adam_state(p: dict[str, Any], key: str, value: Any) -> None:
    p["optimizer"]["state"][0][key] = value


@pytest.mark.parametrize(
    "field, expected, change",
    [
        (
            "optimizer.state[0].exp_avg",
            "expected a tensor of shape (6, 4), found str",
            lambda p: _adam_state(p, "exp_avg", "boom"),
        ),
        (
            "optimizer.state[0].exp_avg",
            "expected a tensor of shape (6, 4), found a torch.float32 tensor of shape (4, 6)",
            lambda p: _adam_state(p, "exp_avg", torch.zeros(4, 6)),
        ),
        (
            "optimizer.state[0].exp_avg_sq",
            "expected a float tensor",
            lambda p: _adam_state(p, "exp_avg_sq", torch.zeros(6, 4, dtype=torch.int64)),
        ),
        ("optimizer.state[0].step", "expected a tensor of shape (), found str", lambda p: _adam_state(p, "step", "3")),
        ("optimizer.state[0].step", "missing", lambda p: p["optimizer"]["state"][0].pop("step")),
        (
            "optimizer.state[0].momentum_buffer",
            "not in this optimizer's state",
            lambda p: _adam_state(p, "momentum_buffer", torch.zeros(6, 4)),
        ),
        (
            "optimizer.param_groups[0].betas",
            "expected a tuple of 2, found str",
            lambda p: p["optimizer"]["param_groups"][0].update(betas="0.9"),
        ),
        (
            "optimizer.param_groups[0].betas",
            "expected a tuple of 2, found tuple of 3",
            lambda p: p["optimizer"]["param_groups"][0].update(betas=(0.9, 0.99, 0.5)),
        ),
        (
            "optimizer.param_groups[0].betas[1]",
            "expected a number, found str",
            lambda p: p["optimizer"]["param_groups"][0].update(betas=(0.9, "0.999")),
        ),
        (
            "optimizer.param_groups[0].amsgrad",
            "expected true or false, found int",
            lambda p: p["optimizer"]["param_groups"][0].update(amsgrad=1),
        ),
        (
            "optimizer.param_groups[0].params",
            "integer parameter ids",
            lambda p: p["optimizer"]["param_groups"][0]["params"].__setitem__(0, "0"),
        ),
    ],
    ids=lambda v: v if isinstance(v, str) and v.startswith("optimizer") else "",
)
@pytest.mark.parametrize("live", ["stepped", "fresh"])
def test_crafted_optimizer_field_with_a_valid_digest_is_refused_naming_it(
    saved: Path, tmp_path: Path, field: str, expected: str, change: Callable, live: str
) -> None:
    """A payload an attacker rewrote and re-digested (`rewrite`) used to load
    and crash the next step; now it is refused before anything changes, by a
    trainer that has stepped and by a fresh one resuming (whose optimizer has
    no state to compare: a probe step tells what it would keep)."""
    bad = rewrite(saved, tmp_path / "bad.pt", change)
    trainer = loader() if live == "stepped" else make_trainer(seed=2)
    error = expect_refused(trainer, bad, f"field {field}: ")
    assert expected in str(error) and "\n" not in str(error), str(error)
    train(trainer, steps=1)  # and it trains on as before


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_a_genuine_checkpoint_loads_into_a_fresh_trainer_of_any_precision(saved: Path, precision: str) -> None:
    trainer = make_trainer(precision, seed=2)
    trainer.load_checkpoint(saved)
    payload = load_payload(saved)
    assert_same(payload["optimizer"]["state"], trainer.optimizer.state_dict()["state"])
    train(trainer, steps=1)


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_bad_scaler_is_refused_by_every_precision(saved: Path, tmp_path: Path, precision: str) -> None:
    bad = rewrite(saved, tmp_path / "bad.pt", lambda p: p["scaler"].pop("_growth_tracker"))
    trainer = make_trainer(precision, seed=2)
    train(trainer, steps=1)
    expect_refused(trainer, bad, "scaler._growth_tracker")


def test_a_failure_while_applying_puts_everything_back(saved: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = loader()

    def boom(state: dict[str, Any]) -> None:
        raise RuntimeError("disk vanished")

    monkeypatch.setattr(trainer, "_load_model_state", boom)
    expect_refused(trainer, saved, "disk vanished")


def test_check_extra_refuses_before_anything_changes(saved: Path) -> None:
    def check(extra: dict[str, Any]) -> None:
        raise ValueError("field extra.agent: missing")

    expect_refused(loader(), saved, "extra.agent", check_extra=check)


def test_good_checkpoint_still_loads_whole(saved: Path) -> None:
    trainer = loader()
    trainer.load_checkpoint(saved)
    payload = load_payload(saved)
    assert_same(payload["model"], trainer.model.state_dict())
    assert trainer.training_steps == 3 and trainer.scheduler.last_epoch == payload["scheduler"]["last_epoch"]


# -- digests ---------------------------------------------------------------------------------


def tensor_offset(path: Path, index: int = 0) -> int:
    """Where the bytes of the checkpoint's ``index``-th tensor storage start."""
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(f"/data/{index}"))
    with open(path, "rb") as fh:
        fh.seek(info.header_offset + 26)
        name_len, extra_len = int.from_bytes(fh.read(2), "little"), int.from_bytes(fh.read(2), "little")
    return info.header_offset + 30 + name_len + extra_len


def test_flipped_bit_in_a_tensor_is_a_digest_mismatch(saved: Path, tmp_path: Path) -> None:
    data = bytearray(saved.read_bytes())
    data[tensor_offset(saved) + 5] ^= 0x10
    bad = tmp_path / "flipped.pt"
    bad.write_bytes(bytes(data))
    error = expect_refused(loader(), bad, "corrupt: digest mismatch")
    assert "another checkpoint" in str(error)


def test_checkpoint_without_digest_loads_with_a_note(saved: Path, tmp_path: Path) -> None:
    payload = load_payload(saved)
    del payload["digest"]
    old = tmp_path / "old.pt"
    torch.save(payload, old)  # as written before checkpoints carried a digest
    trainer = loader()
    with capture_logs() as logs:
        trainer.load_checkpoint(old)
    notes = [log for log in logs if log["event"] == NO_DIGEST_EVENT]
    assert len(notes) == 1 and notes[0]["path"] == str(old)
    assert_same(payload["model"], trainer.model.state_dict())


def test_saved_checkpoint_carries_a_digest_and_no_note(saved: Path) -> None:
    with capture_logs() as logs:
        payload = load_payload(saved)
    assert payload["digest"]["algorithm"] == "sha256" and len(payload["digest"]["value"]) == 64
    assert not [log for log in logs if log["event"] == NO_DIGEST_EVENT]


def test_fuzzed_checkpoint_loads_whole_or_not_at_all(tmp_path: Path) -> None:
    """100 mutations (byte flips and truncations at random offsets) of a saved
    checkpoint: each load either gives the saved tensors or raises one
    CheckpointError and leaves the trainer as it was."""
    started = time.perf_counter()
    torch.manual_seed(1)
    model = torch.nn.Linear(3, 2)
    source = FP16Trainer(model, torch.optim.Adam(model.parameters(), lr=1e-2), FP16TrainingConfig(precision="fp16"))
    train_tiny = lambda m, b: m(b).float().pow(2).mean()  # noqa: E731
    source.backward_and_step(source.training_step(torch.ones(4, 3), train_tiny))
    good = source.save_checkpoint(tmp_path / "good.pt")
    data = good.read_bytes()
    saved = load_payload(good)

    torch.manual_seed(2)
    model = torch.nn.Linear(3, 2)
    target = FP16Trainer(model, torch.optim.Adam(model.parameters(), lr=1e-2), FP16TrainingConfig(precision="fp16"))
    target.backward_and_step(target.training_step(torch.full((4, 3), 2.0), train_tiny))
    rnd = random.Random(25)
    bad = tmp_path / "mutated.pt"
    outcomes = {"loaded": 0, "refused": 0}
    for i in range(100):
        mutated = bytearray(data)
        offset = rnd.randrange(len(mutated))
        if i % 4 == 3:
            mutated = mutated[:offset]
        else:
            mutated[offset] ^= rnd.randrange(1, 256)
        bad.write_bytes(bytes(mutated))
        before = state_of(target)
        try:
            target.load_checkpoint(bad, restore_rng=False)
        except CheckpointError as exc:
            assert str(bad) in str(exc)
            assert_same(before, state_of(target), f"mutation {i} at {offset}")
            outcomes["refused"] += 1
        else:
            assert_same(saved["model"], target.model.state_dict(), f"mutation {i} at {offset}")
            assert_same(saved["optimizer"]["state"], target.optimizer.state_dict()["state"], f"mutation {i}")
            outcomes["loaded"] += 1
            target.load_checkpoint(bad)  # and loads again the same
    assert outcomes["refused"] > 50, outcomes
    assert time.perf_counter() - started < 20


# -- the world model ---------------------------------------------------------------------------


def _world_model(tmp_path: Path, obs_dim: int = 3, seed: int = 0) -> Any:
    from genesis_fp16.training.guarded import UNGUARDED
    from genesis_fp16.base.settings import Settings
    from infrastructure.world_model import WorldModel

    settings = Settings(state_dir=tmp_path / "state")
    return WorldModel(
        obs_dim, 1, guard=UNGUARDED, settings=settings, hidden=8, seed=seed, checkpoint_dir=tmp_path / "wm"
    )


def _world_model_state(wm: Any) -> dict[str, Any]:
    return {"trainer": state_of(wm.trainer), "trained": wm.trained, "sampler": wm._generator.get_state()}


@pytest.mark.parametrize("damage", ["foreign", "flipped", "bad_sampler"])
def test_world_model_load_of_a_bad_checkpoint_changes_nothing(tmp_path: Path, damage: str) -> None:
    donor = _world_model(tmp_path / "donor", obs_dim=5 if damage == "foreign" else 3, seed=1)
    path = donor.save(tmp_path / "donor.pt")
    if damage == "flipped":
        data = bytearray(path.read_bytes())
        data[tensor_offset(path, 2) + 3] ^= 0x01
        path.write_bytes(bytes(data))
    elif damage == "bad_sampler":
        rewrite(path, path, lambda p: p["extra"].update(sampler_state=torch.zeros(3, dtype=torch.uint8)))
    wm = _world_model(tmp_path / "wm", seed=2)
    wm.save()  # builds its trainer
    before = _world_model_state(wm)
    with pytest.raises(CheckpointError) as info:
        wm.load(path)
    assert str(path) in str(info.value)
    expected = {"foreign": "does not fit", "flipped": "digest mismatch", "bad_sampler": "extra.sampler_state"}[damage]
    assert expected in str(info.value)
    assert_same(before, _world_model_state(wm))


def test_world_model_round_trip(tmp_path: Path) -> None:
    donor = _world_model(tmp_path / "donor", seed=1)
    donor.trained = True
    path = donor.save(tmp_path / "donor.pt")
    wm = _world_model(tmp_path / "wm", seed=2)
    wm.load(path)
    assert wm.trained is True
    assert_same(donor.model.state_dict(), wm.model.state_dict())
    assert torch.equal(donor._generator.get_state(), wm._generator.get_state())


# -- DCP shards ----------------------------------------------------------------------------------


def _sharded(tmp_path: Path) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    from genesis_fp16.distributed import dcp_io as gd

    torch.manual_seed(3)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    shards = tmp_path / "shards"
    rest = gd.save_sharded(model, opt, shards)
    return shards, rest, _dcp_state(model, opt)


def _fresh() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(4)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    return model, opt


def _dcp_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    state = opt.state_dict()["state"]
    return {
        "model": {k: v.clone() for k, v in model.state_dict().items()},
        "optim": {k: {n: t.clone() for n, t in s.items()} for k, s in state.items()},
    }


@pytest.mark.parametrize("target", [".distcp", ".metadata"])
def test_dcp_shard_with_a_flipped_byte_changes_nothing(tmp_path: Path, target: str) -> None:
    from genesis_fp16.distributed import dcp_io as gd

    shards, rest, _ = _sharded(tmp_path)
    assert (shards / gd.DIGEST_MANIFEST).is_file()
    victim = next(f for f in sorted(shards.iterdir()) if f.name.endswith(target))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x04
    victim.write_bytes(bytes(data))
    model, opt = _fresh()
    before = _dcp_state(model, opt)
    with pytest.raises(CheckpointError, match="corrupt: digest mismatch") as info:
        gd.load_sharded(model, opt, shards, rest)
    assert str(victim) in str(info.value)
    assert_same(before, _dcp_state(model, opt))


def test_dcp_round_trip_and_shards_without_a_manifest(tmp_path: Path) -> None:
    from genesis_fp16.distributed import dcp_io as gd

    shards, rest, source = _sharded(tmp_path)
    model, opt = _fresh()
    gd.load_sharded(model, opt, shards, rest)
    assert_same(source, _dcp_state(model, opt))
    (shards / gd.DIGEST_MANIFEST).unlink()
    again, opt2 = _fresh()
    with capture_logs() as logs:
        gd.load_sharded(again, opt2, shards, rest)
    assert [log for log in logs if log["event"] == NO_DIGEST_EVENT]
    assert_same(_dcp_state(model, opt), _dcp_state(again, opt2))

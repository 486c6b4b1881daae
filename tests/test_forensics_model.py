"""The tiny transformer, cast copies, the pretrained assets and their cache."""

from __future__ import annotations

import os

import pytest
import torch

from genesis_fp16.training.checkpoint import CheckpointError
from genesis_fp16_tools.forensics import data
from genesis_fp16_tools.forensics.model import ScalarModel, TinyConfig, TinyLM, cast_copy
from genesis_fp16_tools.forensics.pretrain import (
    PretrainSpec,
    assets_path,
    build_assets,
    ensure_assets,
    load_assets,
    reward_target,
)

TINY = PretrainSpec(steps=20, finetune_steps=4, reward_samples=64)


pytestmark = pytest.mark.usefixtures("one_thread")


def test_cast_copy_runs_in_the_dtype_and_leaves_the_original():
    torch.manual_seed(0)
    lm = TinyLM()
    twin = cast_copy(lm, torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in twin.parameters())
    assert all(p.dtype == torch.float32 for p in lm.parameters())
    tokens = torch.randint(0, 128, (2, 12))
    assert twin(tokens).dtype == torch.bfloat16
    assert cast_copy(lm, torch.float16)(tokens).dtype == torch.float16
    # bf16 arithmetic really differs from fp32
    assert not torch.equal(twin(tokens).float(), lm(tokens).to(torch.bfloat16).float())


def test_scalar_model_shapes_and_scale():
    trunk = TinyLM(TinyConfig())
    value = ScalarModel(trunk, per_token=True, scale=10.0)
    reward = ScalarModel(trunk, per_token=False)
    tokens = torch.randint(0, 128, (3, 9))
    assert value(tokens).shape == (3, 9)
    assert reward(tokens).shape == (3,)
    value1 = ScalarModel(trunk, per_token=True, scale=1.0)
    value1.load_state_dict(value.state_dict())
    assert torch.allclose(value(tokens), 10 * value1(tokens))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_return_scale_is_not_rounded_to_the_value_dtype(dtype):
    # BF16 holds 1e4 as 9984 (-0.16%): the product must be one rounding of
    # output * 1e4, not output * 9984
    torch.manual_seed(0)
    trunk = TinyLM(TinyConfig())
    value = cast_copy(ScalarModel(trunk, per_token=True, scale=1e4), dtype)
    unit = cast_copy(ScalarModel(trunk, per_token=True, scale=1.0), dtype)
    unit.load_state_dict(value.state_dict())
    tokens = torch.randint(0, 128, (4, 16))
    out = value(tokens)
    assert out.dtype == dtype
    assert torch.equal(out, (unit(tokens).double() * 1e4).to(dtype))


def test_too_long_sequence_is_a_clear_error():
    with pytest.raises(ValueError, match="max_len"):
        TinyLM()(torch.zeros(1, 513, dtype=torch.long))


def test_data_is_ascii_and_deterministic():
    toks = data.corpus_tokens()
    assert int(toks.max()) < data.VOCAB_SIZE and len(toks) > 100_000
    a = data.sample_windows("train", 4, 16, torch.Generator().manual_seed(1))
    b = data.sample_windows("train", 4, 16, torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and a.shape == (4, 16)
    with pytest.raises(ValueError):
        data.split("test")


def test_reward_target():
    assert torch.allclose(reward_target(data.encode("abC ").unsqueeze(0)), torch.tensor([0.5], dtype=torch.float64))


def test_assets_learn_differ_and_round_trip(tmp_path):
    assets = build_assets(TINY)
    assert assets.meta["heldout_loss"] < 4.0  # uniform over 128 bytes would be ln 128 = 4.85
    assert assets.meta["reward_r2"] > 0.5
    with torch.no_grad():
        diff = sum(
            float((p - q).abs().sum()) for p, q in zip(assets.policy.parameters(), assets.reference.parameters())
        )
    assert diff > 0, "policy must differ from the reference"
    path = assets_path(tmp_path, TINY)
    from genesis_fp16_tools.forensics.pretrain import save_assets

    save_assets(assets, path)
    loaded = load_assets(path)
    tokens = torch.randint(0, 128, (2, 10))
    assert torch.equal(loaded.policy(tokens), assets.policy(tokens))
    assert torch.equal(loaded.reward(tokens), assets.reward(tokens))
    assert torch.allclose(loaded.value_model(100.0)(tokens), 100 * assets.value(tokens))


def test_ensure_assets_builds_once_then_loads(tmp_path):
    first = ensure_assets(tmp_path, TINY)
    mtime = os.stat(first.path).st_mtime_ns
    second = ensure_assets(tmp_path, TINY)
    assert os.stat(second.path).st_mtime_ns == mtime
    tokens = torch.randint(0, 128, (1, 8))
    assert torch.equal(first.reference(tokens), second.reference(tokens))


def test_corrupt_asset_file_names_the_file(tmp_path):
    path = assets_path(tmp_path, TINY)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=str(path.name)):
        load_assets(path)


def test_positions_up_to_512_are_fixed_sinusoids_not_weights():
    cfg = TinyConfig()
    assert cfg.max_len == 512
    lm = TinyLM(cfg)
    # nothing position-shaped in the checkpoint: positions past the training length are defined, not untrained
    assert not any("pos" in k for k in lm.state_dict())
    torch.manual_seed(0)
    assert torch.isfinite(lm(torch.randint(0, 128, (1, 512)))).all()
    with pytest.raises(ValueError, match="512"):
        lm(torch.randint(0, 128, (1, 513)))


def test_cached_asset_with_another_model_config_is_rebuilt(state_dir):
    from genesis_fp16_tools.forensics import pretrain

    small = TinyConfig(max_len=64)
    stale = build_assets(PretrainSpec(steps=2, finetune_steps=1, reward_samples=32), cfg=small)
    pretrain.save_assets(stale, assets_path(state_dir, TINY))  # as if cached before the model config changed
    assets = ensure_assets(state_dir, TINY)
    assert assets.reference.cfg == TinyConfig() and assets.meta["spec"]["steps"] == TINY.steps
    assert load_assets(assets_path(state_dir, TINY)).meta["model"] == TinyConfig().to_dict()

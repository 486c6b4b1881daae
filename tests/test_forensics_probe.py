"""The static probe and the replay on a tiny pretrained model."""

from __future__ import annotations

import copy

import pytest
import torch

from genesis_fp16.training.checkpoint import load_payload, save_payload
from genesis_fp16_tools.forensics.configs import CONFIGS, parse_configs
from genesis_fp16_tools.forensics.pretrain import PretrainSpec, build_assets
from genesis_fp16_tools.forensics.probe import Truth, generated_mask, ground_truth, probe
from genesis_fp16_tools.forensics.replay import freeze, load_trajectories, replay

TINY = PretrainSpec(steps=20, finetune_steps=4, reward_samples=64)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def assets():
    return build_assets(TINY)


def test_probe_rows_and_precision_ordering(assets):
    cfgs = parse_configs("fp32_baseline,bf16_pure,bf16_fp32_kl,fp16_pure")
    rows = probe(assets, cfgs, num_prompts=6, seq_lengths=(20, 28))
    assert [(r["config"], r["seq_len"]) for r in rows] == [(c.name, L) for L in (20, 28) for c in cfgs]
    by = {(r["config"], r["seq_len"]): r for r in rows}
    for L in (20, 28):
        fp32, bf16, fp16 = by["fp32_baseline", L], by["bf16_pure", L], by["fp16_pure", L]
        assert fp32["kl_fp64"] > 0  # policy and reference differ
        assert fp32["kl_fp64"] == bf16["kl_fp64"]  # the same tokens, the same truth
        assert fp32["kl_abs_err"] < 1e-5
        assert fp32["accum_err_final"] < bf16["accum_err_final"]
        assert fp16["accum_err_final"] < bf16["accum_err_final"]  # 10 vs 7 mantissa bits
        assert bf16["value_quant_step_median"] > fp16["value_quant_step_median"] > fp32["value_quant_step_median"]
        assert fp32["value_stagnation_rate"] == 0.0
        assert fp32["reward_tie_rate"] == 0.0 and fp32["reward_kendall_tau"] == pytest.approx(1.0)
        assert by["bf16_fp32_kl", L]["log_ratio_exact_zero_frac"] <= bf16["log_ratio_exact_zero_frac"]
        for r in (fp32, bf16, fp16):
            assert r["failure"] is None


def test_probe_rejects_bad_length(assets):
    with pytest.raises(ValueError, match="sequence length"):
        probe(assets, [CONFIGS["fp32_baseline"]], num_prompts=2, seq_lengths=(600,))


def test_ground_truth_refuses_policy_equal_reference(assets):
    same = copy.copy(assets)
    same.policy = assets.reference
    tokens = torch.randint(0, 128, (2, 16))
    with pytest.raises(RuntimeError, match="identical"):
        ground_truth(same, tokens, generated_mask(tokens, 8))


def test_value_overflow_danger_in_fp16_at_large_returns(assets):
    rows = probe(
        assets, [CONFIGS["fp16_pure"], CONFIGS["fp16_mixed"]], num_prompts=4, seq_lengths=(16,), return_scale=3e4
    )
    assert rows[0]["failure"] == "value_overflow_danger"
    assert rows[1]["failure"] is None  # the FP32 value model has the headroom


def test_freeze_and_replay(assets, tmp_path):
    path = freeze(assets, tmp_path / "traj.pt", num_prompts=4, seq_len=24)
    truth = load_trajectories(path)
    rows = replay(assets, truth, parse_configs("fp32_baseline,bf16_pure"))
    assert len(rows) == 2
    curve = rows[1]["curve"]
    assert curve["lengths"][-1] == 24 - 8
    assert len(curve["seq_logp_mismatch"]) == 16
    assert curve["seq_logp_mismatch"][-1] > rows[0]["curve"]["seq_logp_mismatch"][-1]
    assert curve["seq_log_ratio_fp64"][-1] != 0  # reference != policy


def test_replay_refuses_reference_equal_policy(assets, tmp_path):
    path = freeze(assets, tmp_path / "traj.pt", num_prompts=3, seq_len=16)
    payload = load_payload(path)
    payload["extra"]["logp_ref_fp64"] = payload["extra"]["logp_policy_fp64"].clone()
    save_payload(path, payload)
    with pytest.raises(ValueError, match="reference different from the policy"):
        load_trajectories(path)


@pytest.mark.parametrize("return_scale", [1000.0, 30000.0])
def test_fp16_pure_value_step_moves_weights_by_the_learning_rate(assets, return_scale):
    from genesis_fp16_tools.forensics.probe import VALUE_LR, value_update

    g = torch.Generator().manual_seed(3)
    seq_len = min(128, assets.reference.cfg.max_len)
    tokens = torch.randint(0, assets.reference.cfg.vocab_size, (32, seq_len), generator=g)
    mask = generated_mask(tokens, 8)
    targets = torch.full(mask.shape, 0.9 * return_scale)
    vm = assets.value_model(return_scale).to(torch.float16).train()
    w0 = [p.detach().double().clone() for p in vm.parameters()]
    value_update(vm, tokens, mask, targets, return_scale)
    deltas = [(p.detach().double() - w).abs() for p, w in zip(vm.parameters(), w0)]
    assert all(p.dtype == torch.float16 for p in vm.parameters())  # weights stay FP16
    # the step is of the order of lr (Adam: |update| <= ~lr), not lr*g/eps
    assert max(float(d.max()) for d in deltas) <= 10 * VALUE_LR
    # the gradient did not underflow: the FP16 weights (the head's among them) moved
    names = [n for n, _ in vm.named_parameters()]
    assert float(deltas[names.index("score.weight")].max()) > 0
    assert sum(int((d > 0).sum()) for d in deltas) > 0.1 * sum(d.numel() for d in deltas)


def test_reward_truth_is_fp64(assets):
    tokens = torch.randint(0, 128, (4, 20), generator=torch.Generator().manual_seed(1))
    truth = ground_truth(assets, tokens, generated_mask(tokens, 8))
    assert truth.rewards64.dtype == torch.float64


def test_replay_refuses_trajectories_from_another_checkpoint(assets, tmp_path):
    path = freeze(assets, tmp_path / "traj.pt", num_prompts=3, seq_len=16)
    truth = load_trajectories(path)
    assert truth.assets_sha256
    other = copy.copy(assets)
    other.policy = copy.deepcopy(assets.policy)
    with torch.no_grad():
        next(other.policy.parameters()).add_(1e-3)
    with pytest.raises(ValueError, match="different checkpoint"):
        replay(other, truth, parse_configs("fp32_baseline"))
    assert replay(assets, truth, parse_configs("fp32_baseline"))  # the same checkpoint works
    legacy = Truth(truth.tokens, truth.mask, truth.lp64, truth.lr64, truth.rewards64)  # no hash: warned
    with pytest.warns(UserWarning, match="cannot check"):
        replay(other, legacy, parse_configs("fp32_baseline"))


def test_bf16_fp32_ref_keeps_the_reference_log_probs_in_fp32(assets):
    rows = probe(assets, parse_configs("fp32_baseline,bf16_pure,bf16_fp32_ref"), num_prompts=4, seq_lengths=(24,))
    by = {r["config"]: r for r in rows}
    # an FP32 reference scored in FP32 drifts exactly as the FP32 baseline's
    assert by["bf16_fp32_ref"]["accum_err_final"] == by["fp32_baseline"]["accum_err_final"]
    assert by["bf16_fp32_ref"]["accum_err_final"] < 0.01 * by["bf16_pure"]["accum_err_final"]
    # the BF16 policy still drifts as in bf16_pure
    assert by["bf16_fp32_ref"]["policy_accum_err_final"] == by["bf16_pure"]["policy_accum_err_final"]


def test_drift_is_reported_beside_its_rounding_floor(assets):
    rows = probe(assets, parse_configs("fp32_baseline,bf16_pure,fp16_pure"), num_prompts=6, seq_lengths=(40,))
    by = {r["config"]: r for r in rows}
    for r in rows:
        for prefix in ("accum_err", "policy_accum_err"):
            assert r[f"{prefix}_rounding_floor"] >= 0
    assert by["fp32_baseline"]["accum_err_rounding_floor"] < 1e-5
    bf16, fp16 = by["bf16_pure"], by["fp16_pure"]
    assert (
        bf16["accum_err_rounding_floor"]
        > fp16["accum_err_rounding_floor"]
        > by["fp32_baseline"]["accum_err_rounding_floor"]
    )
    # rounding exact logits is a floor: a whole BF16/FP16 model drifts at least about as much
    for r in (bf16, fp16):
        assert 0 < r["accum_err_rounding_floor"] < 1.5 * r["accum_err_final"]

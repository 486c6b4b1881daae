"""Metrics against hand-computed or FP64 values on constructed inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from genesis_fp16_tools.forensics import metrics as M


def test_k3_on_two_point_distribution_matches_true_kl():
    # p = (0.7, 0.3), q = (0.5, 0.5): KL(p||q) = 0.7 ln 1.4 + 0.3 ln 0.6 = 0.0823
    p = torch.tensor([0.7, 0.3], dtype=torch.float64)
    q = torch.tensor([0.5, 0.5], dtype=torch.float64)
    true_kl = float((p * (p / q).log()).sum())
    x = p.log() - q.log()  # logp_policy - logp_ref at each outcome (samples from p)
    k3 = float((p * M.kl_k3(x)).sum())
    wrong = float((p * (x.exp() - 1 - x)).sum())  # the public implementation's form
    assert true_kl == pytest.approx(0.0823, abs=5e-5)
    assert k3 == pytest.approx(true_kl, rel=1e-12)
    assert wrong == pytest.approx(0.0777, abs=5e-5)
    assert float((p * M.kl_k1(x)).sum()) == pytest.approx(true_kl, rel=1e-12)


def test_k3_is_evaluated_in_fp32_or_wider_and_accurate_for_tiny_x():
    x = torch.tensor([1e-4, -1e-4], dtype=torch.bfloat16)
    assert M.kl_k3(x).dtype == torch.float32
    x64 = x.double()
    # expm1 keeps k3 ~ x^2/2 accurate; exp(-x) - 1 + x in FP32 would lose it
    assert torch.allclose(M.kl_k3(x64), x64**2 / 2, rtol=1e-3)
    assert torch.allclose(M.kl_k3(x.float()).double(), x64**2 / 2, rtol=1e-3)


def test_token_logprobs_gathers_taken_tokens_with_aligned_shapes():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7, dtype=torch.float64)
    tokens = torch.randint(0, 7, (2, 5))
    lp = M.token_logprobs(logits, tokens)
    assert lp.shape == (2, 4)
    ref = torch.log_softmax(logits, -1)
    for b in range(2):
        for t in range(4):
            assert lp[b, t] == ref[b, t, tokens[b, t + 1]]
    assert M.token_logprobs(logits.float(), tokens, dtype=torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(ValueError):
        M.token_logprobs(logits, tokens[:, :4])


def test_kl_report_counts_exact_and_near_zero_on_masked_tokens():
    x64 = torch.tensor([[0.0, 5e-4, 0.1, 0.3]], dtype=torch.float64)
    x = x64.to(torch.bfloat16)
    mask = torch.tensor([[False, True, True, True]])
    rep = M.kl_report(x, x64, mask)
    assert rep["log_ratio_near_zero_frac_fp64"] == pytest.approx(1 / 3)
    assert rep["log_ratio_exact_zero_frac"] == 0.0
    expected = float((torch.expm1(-x64) + x64)[mask].mean())
    assert rep["kl_fp64"] == pytest.approx(expected, rel=1e-12)
    assert rep["kl_abs_err"] == pytest.approx(abs(rep["kl_penalty_mean"] - expected))
    assert rep["kl_abs_err"] > 0  # bf16 rounding of 0.1 and 0.3 is visible


@pytest.mark.parametrize(
    "value,dtype,expected",
    [
        (1e4, torch.bfloat16, 64.0),  # not ~78
        (1.0, torch.bfloat16, 2**-7),
        (0.7, torch.bfloat16, 2**-8),
        (1000.0, torch.float16, 0.5),
        (1e4, torch.float16, 8.0),
        (1.0, torch.float16, 2**-10),
        (1.0, torch.float32, 2**-23),
        (-1e4, torch.bfloat16, 64.0),
    ],
)
def test_ulp_at_chosen_magnitudes(value, dtype, expected):
    assert float(M.ulp(torch.tensor([value]), dtype)[0]) == expected


def test_ulp_of_fp16_max_is_infinite_and_of_zero_is_smallest_subnormal():
    u = M.ulp(torch.tensor([65504.0, 0.0]), torch.float16)
    assert math.isinf(float(u[0]))
    assert float(u[1]) == 2.0**-24


def test_kendall_tau_against_hand_values():
    assert M.kendall_tau(np.array([1, 2, 3]), np.array([1, 2, 3])) == pytest.approx(1.0)
    assert M.kendall_tau(np.array([1, 2, 3]), np.array([3, 2, 1])) == pytest.approx(-1.0)
    # one tie in a, none in b: pairs (1,2) tie, (1,3),(2,3) concordant -> 2 / sqrt(2*3)
    assert M.kendall_tau(np.array([1, 1, 2]), np.array([1, 2, 3])) == pytest.approx(2 / math.sqrt(6))


def test_reward_report_resolution_is_ulp_not_spread():
    fp32 = torch.tensor([10.0, 10.01, 10.02, 20.0])
    bf16 = fp32.to(torch.bfloat16)  # 10, 10, 10, 20 at spacing 1/16 (10) and 1/8 (20)
    rep = M.reward_report(bf16, fp32)
    assert rep["reward_resolution_median"] == pytest.approx((1 / 16 + 1 / 16) / 2 * 1)  # median of [1/16]*3 + [1/8]
    assert rep["reward_tie_rate"] == pytest.approx(3 / 6)  # three pairs among the first three now tie
    assert rep["reward_kendall_tau"] < 1.0
    same = M.reward_report(fp32, fp32)
    assert same["reward_tie_rate"] == 0 and same["reward_kendall_tau"] == pytest.approx(1.0)


def test_stagnation_on_the_same_batch():
    before = torch.tensor([1e4, 1e4, 1.0, 2.0], dtype=torch.float32)
    update = torch.tensor([10.0, 100.0, 1e-3, 1e-3])
    after_bf16 = (before + update).to(torch.bfloat16)
    # 1e4 + 10 rounds back to 1e4 in bf16 (spacing 64); +100 moves; 1.0 + 1e-3 does not (spacing 1/128)
    assert M.stagnation_rate(before.to(torch.bfloat16), after_bf16) == pytest.approx(3 / 4)
    assert M.stagnation_rate(before, before + update) == 0.0
    mask = torch.tensor([True, True, False, False])
    assert M.stagnation_rate(before.to(torch.bfloat16), after_bf16, mask) == pytest.approx(1 / 2)
    with pytest.raises(ValueError):
        M.stagnation_rate(before, before[:3])  # different batches are refused


def test_value_report_fields():
    before = torch.full((2, 3), 1e4).to(torch.bfloat16)
    rep = M.value_report(before, before.clone())
    assert rep["value_quant_step_median"] == 64.0
    assert rep["value_stagnation_rate"] == 1.0
    assert rep["value_headroom"] == pytest.approx(torch.finfo(torch.bfloat16).max / 1e4, rel=0.01)


def test_accumulation_slope_is_half_for_independent_errors():
    g = torch.Generator().manual_seed(0)
    n, t = 4000, 256
    logp64 = torch.zeros(n, t, dtype=torch.float64)
    noisy = logp64 + 1e-3 * torch.randn(n, t, generator=g, dtype=torch.float64)
    rep = M.accum_report(noisy, logp64, torch.ones(n, t, dtype=torch.bool))
    assert rep["accum_err_slope"] == pytest.approx(0.5, abs=0.05)
    # E|sum| of 256 N(0, 1e-6) = 1e-3 * sqrt(256) * sqrt(2/pi)
    assert rep["accum_err_final"] == pytest.approx(1e-3 * 16 * math.sqrt(2 / math.pi), rel=0.05)
    biased = M.accum_report(logp64 + 1e-3, logp64, torch.ones(n, t, dtype=torch.bool))
    assert biased["accum_err_slope"] == pytest.approx(1.0, abs=1e-6)


def test_accumulation_skips_prompt_positions():
    logp64 = torch.zeros(3, 10, dtype=torch.float64)
    mask = torch.zeros(3, 10, dtype=torch.bool)
    mask[:, 4:] = True
    rep = M.accum_report(logp64 + 1e-3, logp64, mask)
    assert rep["accum_err_final"] == pytest.approx(6e-3)
    assert rep["accum_err_slope"] == pytest.approx(1.0, abs=1e-6)


def test_loglog_slope_known_power():
    L = np.array([1, 2, 4, 8, 16])
    assert M.loglog_slope(L, 3 * L**0.75) == pytest.approx(0.75)
    assert math.isnan(M.loglog_slope(np.array([4]), np.array([1.0])))


def test_failure_taxonomy():
    assert M.classify_failure(tensors={"a": torch.tensor([1.0, float("nan")])})["kind"] == "nan"
    assert M.classify_failure(tensors={}, kl=1e-5, kl_fp64=1e-2)["kind"] == "kl_collapse"
    assert M.classify_failure(tensors={}, kl=0.0, kl_fp64=0.0, exact_zero_frac=0.95)["kind"] == "kl_collapse"
    danger = M.classify_failure(tensors={}, values=torch.tensor([20000.0], dtype=torch.float16))
    assert danger["kind"] == "value_overflow_danger"
    assert M.classify_failure(tensors={}, values=torch.tensor([20000.0], dtype=torch.bfloat16)) is None
    assert M.classify_failure(tensors={"a": torch.ones(3)}, kl=0.01, kl_fp64=0.0101, exact_zero_frac=0.0) is None


def test_nan_after_value_step_is_a_diverged_failure():
    from genesis_fp16_tools.forensics.metrics import classify_failure, stagnation_rate

    before = torch.tensor([1.0, 2.0, 3.0])
    after = torch.tensor([1.0, float("nan"), float("inf")])
    # a non-finite value did not "move": stagnation counts finite pairs only
    assert stagnation_rate(before, after) == 1.0
    failure = classify_failure(tensors={"values": before}, values=before, values_after=after)
    assert failure is not None and failure["kind"] == "diverged"
    assert "2 of 3" in failure["detail"]
    assert classify_failure(tensors={"values": before}, values=before, values_after=before + 1) is None
    assert math.isnan(stagnation_rate(before, torch.full((3,), float("nan"))))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("value", [500.0, 1000.0, 1e4, 3e4])
def test_ulp_matches_exponent_arithmetic(dtype, value):
    # spacing = 2^(floor(log2 |v|) - mantissa bits) for normal numbers
    mant = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}[dtype]
    v = float(torch.tensor(value).to(dtype))
    expected = 2.0 ** (math.floor(math.log2(v)) - mant)
    assert float(M.ulp(torch.tensor([value]), dtype)[0]) == expected
    assert float(M.ulp(torch.tensor([500.0]), torch.bfloat16)[0]) == 2.0  # not 4
    assert math.ulp(500.0) == 2.0 ** (8 - 52)  # the same rule for FP64

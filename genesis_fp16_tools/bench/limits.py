"""How far a cell runs from the device's arithmetic limit.

Per (size, precision) cell the bench reports the FLOPs of one training step
(`flops_per_step`), the device's peak FLOP/s in that precision (`PeakTable`:
the vendor's datasheet for a known GPU, else a timed matmul in that dtype),
the time the step would take at that peak (``limit_ms_per_step``) and how
many times slower the measured step is (``x_off_limit`` = step time / limit
time). A size far from its limit is bound by something other than
arithmetic (kernel launches, Python, memory traffic), which reduced precision
cannot speed up; a size near it is where the precision's faster matmuls pay.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from genesis_fp16.precision.modes import MODES
from genesis_fp16.precision.capability import cpu_name
from genesis_fp16.precision.request import parse_mode
from genesis_fp16.base.seeds import stream_seed
from genesis_fp16_tools.bench.measure import sync_device
from genesis_fp16_tools.bench.models import ACT_DIM, OBS_DIM, SizeSpec

# -- FLOPs per training step ----------------------------------------------------------

# (rows, inner, cols, input_needs_grad): one matrix product of the forward pass,
# (rows x inner) @ (inner x cols); input_needs_grad is False where the input is
# the data itself, whose gradient autograd never computes
Matmul = tuple[int, int, int, bool]


def matmuls(spec: SizeSpec) -> list[Matmul]:
    """The forward pass's matrix products for ``spec``'s model (`models.WorldModelMLP`
    with its default depth 3, or `models.OutcomeLSTM`)."""
    b = spec.batch
    if spec.kind == "lstm":
        i, h, t = spec.features, spec.hidden, spec.seq_len
        # per time step the four gates are x_t W_ih^T + h_{t-1} W_hh^T; then the head reads the last h
        return [(b * t, i, 4 * h, False), (b * t, h, 4 * h, True), (b, h, 1, True)]
    widths = [OBS_DIM + ACT_DIM, spec.hidden, spec.hidden, spec.hidden, OBS_DIM + 1]
    return [(b, fan_in, fan_out, k > 0) for k, (fan_in, fan_out) in enumerate(zip(widths, widths[1:]))]


def forward_flops(spec: SizeSpec) -> int:
    """FLOPs of one forward pass: 2 x rows x inner x cols per matrix product
    (a multiply and an add per term)."""
    return sum(2 * m * k * n for m, k, n, _ in matmuls(spec))


def flops_per_step(spec: SizeSpec) -> int:
    """FLOPs of one training step (forward + backward) of ``spec``, matrix products only.

    Forward: 2 x batch x sum(in x out) over the linear layers (the MLP: 32 -> h
    -> h -> h -> 25; the LSTM per time step: batch x 4h x (features + h) for
    the gates, plus the head on the last step). Backward: every product's
    weight gradient costs the same again, and its input gradient the same
    again except where the input is the data (the MLP's first layer, the
    LSTM's x_t W_ih^T), which needs no gradient. So::

        step = 3 x forward - 2 x batch x (data width x first layer's width)

    which is the usual "3 x forward" less the one gradient autograd skips
    (``torch.utils.flop_counter.FlopCounterMode`` counts the MLP's step to the
    same number; tests/test_bench.py checks it). Biases, activations (GELU,
    the LSTM's sigmoids and tanhs), the loss, gradient clipping and the Adam
    update are O(parameters) or O(activations), not counted: they are
    memory-bound work, and where they dominate (size S) the cell is far from
    the arithmetic limit, which is what the ratio is there to show. For the
    LSTM this is the standard estimate (cuDNN and oneDNN may do a little more:
    the zero initial state's gradient, fused gate arithmetic).
    """
    return sum(2 * m * k * n * (3 if needs_grad else 2) for m, k, n, needs_grad in matmuls(spec))


FLOPS_FORMULA = (
    "matrix products only: forward 2 x rows x inner x cols per product (MLP: 2 x batch x sum(in x out) per linear; "
    "LSTM: 2 x batch x T x 4h x (features + h) plus the head); a step is 3 x forward less the data input's gradient "
    "(not computed); biases, activations, loss and optimizer not counted"
)


# -- the device's peak FLOP/s per precision -------------------------------------------

# Dense peaks (no 2:4 sparsity) in TFLOP/s, from NVIDIA's datasheets. The
# datasheets give the tensor-core figures "with sparsity" (marked *); the
# dense figure is half of it, as their footnotes say. fp32 is the CUDA-core
# FP32 peak (the bench's fp32 rows run strict IEEE FP32 matmuls), tf32 the
# TF32 tensor-core peak, bf16/fp16 the tensor-core peaks with FP32 accumulate.
#   H100 SXM5 / H200 SXM (H100 datasheet; H200 datasheet, same figures):
#       FP32 67, TF32 989*, BF16 1,979*, FP16 1,979*
#   H100 PCIe (H100 datasheet): FP32 51, TF32 756*, BF16 1,513*, FP16 1,513*
#   H100 NVL / H200 NVL (datasheets): FP32 60, TF32 835*, BF16 1,671*, FP16 1,671*
#   A100 40/80 GB, SXM4 and PCIe (A100 datasheet, identical peaks): FP32 19.5,
#       TF32 156 (312*), BF16 312 (624*), FP16 312 (624*)
#   L40S (L40S datasheet): FP32 91.6, TF32 183 (366*), BF16 362.05 (733*), FP16 362.05 (733*)
#   L4 (L4 datasheet): FP32 30.3, TF32 120*, BF16 242*, FP16 242*
#   A10 (A10 datasheet): FP32 31.2, TF32 62.5 (125*), BF16 125 (250*), FP16 125 (250*)
# Patterns are matched in order against torch.cuda.get_device_name() (e.g.
# "NVIDIA H100 80GB HBM3" is the SXM5 part), case-insensitively; a MIG slice
# (its name says MIG) has a fraction of the chip and is measured instead.
DATASHEET_TFLOPS: tuple[tuple[str, str, dict[str, float]], ...] = (
    (r"\bH100\b.*\bPCIE\b", "NVIDIA H100 PCIe", {"fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5}),
    (r"\bH100\b.*\bNVL\b", "NVIDIA H100 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5}),
    (r"\bH100\b", "NVIDIA H100 SXM5", {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5}),
    (r"\bH200\b.*\bNVL\b", "NVIDIA H200 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5}),
    (r"\bH200\b", "NVIDIA H200 SXM", {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5}),
    (r"\bA100\b", "NVIDIA A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}),
    (r"\bL40S\b", "NVIDIA L40S", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05}),
    (r"\bL4\b", "NVIDIA L4", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0}),
    (r"\bA10\b", "NVIDIA A10", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0}),
)


@dataclass(frozen=True)
class Peak:
    """A precision's arithmetic limit on a device: FLOP/s and where the figure comes from."""

    flops_per_s: float
    source: str


def device_name(device: torch.device) -> str:
    """The device's name as torch reports it (tests patch this function)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()


def datasheet_peak(name: str, precision: str) -> Optional[Peak]:
    """The datasheet's dense peak for ``precision`` on the GPU called ``name``,
    or None (an unknown device, a MIG slice, a precision the entry lacks)."""
    if re.search(r"\bMIG\b", name, re.IGNORECASE):
        return None
    for pattern, label, tflops in DATASHEET_TFLOPS:
        if re.search(pattern, name, re.IGNORECASE):
            if precision not in tflops:
                return None
            return Peak(
                tflops[precision] * 1e12, f"datasheet: {label}, dense {precision} {tflops[precision]:g} TFLOP/s"
            )
    return None


MATMUL_SIZES_CPU = (256, 512, 1024, 2048)
MATMUL_SIZES_CUDA = (1024, 2048, 4096, 8192)


def measure_peak(
    precision: str,
    device: torch.device,
    budget_s: float = 0.3,
    sizes: Optional[tuple[int, ...]] = None,
    timer: Callable[[], float] = time.perf_counter,
) -> Peak:
    """The best FLOP/s a square matmul reaches in ``precision``'s compute dtype
    (bf16/fp16 tensors; fp32 tensors for fp32, under the TF32 switches for tf32),
    for a device with no datasheet entry, in the layout a linear layer uses.

    Tries growing sizes (``sizes``); each is warmed once, then products are
    timed one by one (device synchronised) for about a tenth of ``budget_s``,
    and the fastest counts: a peak, not an average, so a product slowed by
    another process does not lower it. Growing stops when half the budget is
    spent or one product takes a sixteenth of it (the next size costs 8x), so
    the whole stays within about 1.5 x ``budget_s``, on a slow dtype too. It
    is an achieved rate, a lower bound on the hardware's peak, so
    ``x_off_limit`` against it errs on the small side.
    """
    plugin = MODES[parse_mode(precision)](device)
    dtype = plugin.compute_dtype
    sizes = sizes or (MATMUL_SIZES_CUDA if device.type == "cuda" else MATMUL_SIZES_CPU)
    # its own generator, on the device: torch's global RNG is left as it was
    gen = torch.Generator(device=device).manual_seed(stream_seed(0, "bench.limits.matmul"))
    best, best_n = 0.0, 0
    start = timer()
    with plugin.math_context():
        for n in sizes:
            a = torch.rand(n, n, generator=gen, device=device, dtype=dtype)
            b = torch.rand(n, n, generator=gen, device=device, dtype=dtype)
            # b.t(): the layout nn.Linear multiplies by (its weight is stored out x in); on a
            # CPU without AVX512-FP16, fp16 a @ b with b contiguous ran 10x slower than this
            b = b.t()
            torch.matmul(a, b)  # warm: kernel selection, allocation
            sync_device(device)
            fastest, reps, t0 = math.inf, 0, timer()
            while True:
                before = timer()
                torch.matmul(a, b)
                sync_device(device)
                now = timer()
                fastest, reps = min(fastest, now - before), reps + 1
                if now - t0 >= budget_s / 10 or reps >= 100:
                    break
            rate = 2.0 * n**3 / max(fastest, 1e-12)
            if rate > best:
                best, best_n = rate, n
            if now - start >= budget_s / 2 or fastest >= budget_s / 16:
                break
    what = f"{best_n}x{best_n} {str(dtype).replace('torch.', '')} matmul" + (" (TF32)" if precision == "tf32" else "")
    return Peak(best, f"measured: {what}, fastest of repeats, {best / 1e12:.3g} TFLOP/s")


class PeakTable:
    """Each precision's `Peak` on one device, looked up (datasheet) or measured
    once and kept for the run."""

    def __init__(self, device: torch.device, budget_s: float = 0.3) -> None:
        self.device = device
        self.budget_s = budget_s
        self._peaks: dict[str, Peak] = {}

    def peak(self, precision: str) -> Peak:
        if precision not in self._peaks:
            known = datasheet_peak(device_name(self.device), precision) if self.device.type == "cuda" else None
            self._peaks[precision] = known or measure_peak(precision, self.device, self.budget_s)
        return self._peaks[precision]

    def known(self, precision: str) -> Optional[Peak]:
        """The peak found for ``precision`` so far (None: not looked up, or it failed)."""
        return self._peaks.get(precision)

    def as_dict(self) -> dict[str, dict[str, Any]]:
        return {p: {"peak_tflops": v.flops_per_s / 1e12, "source": v.source} for p, v in self._peaks.items()}


def limit_columns(spec: SizeSpec, ms_per_step: float, peak: Optional[Peak]) -> dict[str, Any]:
    """A row's FLOPs and limit columns: ``flops_per_step``, ``achieved_tflops``,
    ``peak_tflops``, ``peak_source``, ``limit_ms_per_step`` (FLOPs / peak) and
    ``x_off_limit`` (step time / limit time: 1.0 is the limit, 10 is ten times
    slower than the arithmetic alone would take)."""
    flops = flops_per_step(spec)
    cols: dict[str, Any] = {
        "flops_per_step": flops,
        "achieved_tflops": flops / (ms_per_step / 1000.0) / 1e12 if ms_per_step > 0 else None,
        "peak_tflops": None,
        "peak_source": None,
        "limit_ms_per_step": None,
        "x_off_limit": None,
    }
    if peak is not None and peak.flops_per_s > 0 and math.isfinite(peak.flops_per_s):
        limit_ms = 1000.0 * flops / peak.flops_per_s
        cols.update(
            peak_tflops=peak.flops_per_s / 1e12,
            peak_source=peak.source,
            limit_ms_per_step=limit_ms,
            x_off_limit=ms_per_step / limit_ms if limit_ms > 0 else None,
        )
    return cols

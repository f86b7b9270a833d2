"""The blockwise int8 quantizer holds its written bound: per element |x - q(x)| <= max|block| / 254.

Random data with outliers, zeros and an all-zero block, in bf16, fp16 and fp32; the bound
is computed per block from the input (:func:`error_bound`), with 2^-20 of the block's max
allowed for the fp32 arithmetic (the module's docstring derives both).
"""

from __future__ import annotations

import pytest
import torch

from zerorun.engine.comm.quantize import (
    BLOCK,
    dequantize,
    error_bound,
    pack,
    packed_bytes,
    quantize,
    unpack,
)
from zerorun.estimate.topology import QWZ_BLOCK, quantized_bytes

FP32_SLACK = 2.0**-20


def _data(numel: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Normal values, a few large outliers, exact zeros, one block all zeros, a short last block."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(numel, generator=g)
    spots = torch.randint(0, numel, (12,), generator=g)
    x[spots] = torch.randn(12, generator=g) * 1e3  # outliers: their block's scale grows, the bound with it
    x[torch.rand(numel, generator=g) < 0.1] = 0.0
    x[BLOCK:2 * BLOCK] = 0.0  # a whole block of zeros
    x[2 * BLOCK:3 * BLOCK] = torch.randn(BLOCK, generator=g) * 1e-6  # tiny values (no outlier): their own scale
    return x.to(dtype)


def _within(x: torch.Tensor, y: torch.Tensor) -> None:
    xf = x.reshape(-1).float()
    bound = error_bound(xf) + FP32_SLACK * error_bound(xf) * 254
    err = (xf - y.reshape(-1).float()).abs()
    worst = int(torch.argmax(err - bound))
    assert bool((err <= bound).all()), f"element {worst}: error {err[worst]:.3g} > bound {bound[worst]:.3g}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("numel", [1, 7, BLOCK, 5 * BLOCK + 123])
def test_round_trip_is_within_the_bound(dtype: torch.dtype, numel: int) -> None:
    x = _data(max(numel, 3 * BLOCK), dtype).narrow(0, 0, numel) if numel >= 3 * BLOCK else (
        torch.randn(numel, generator=torch.Generator().manual_seed(numel)).to(dtype))
    q, scale = quantize(x)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32
    assert q.numel() == numel and scale.numel() == -(-numel // BLOCK)
    _within(x, dequantize(q, scale))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_outliers_zeros_and_an_all_zero_block(dtype: torch.dtype) -> None:
    x = _data(5 * BLOCK + 123, dtype)
    q, scale = quantize(x)
    y = dequantize(q, scale)
    _within(x, y)
    assert scale[1] == 0 and bool((y[BLOCK:2 * BLOCK] == 0).all()), "an all-zero block must come back exact"
    assert bool((y[x == 0] == 0).all()), "zero maps to zero"
    # the bound is per block: the tiny block's error is tiny, not the outliers' block's
    assert float((x[2 * BLOCK:3 * BLOCK].float() - y[2 * BLOCK:3 * BLOCK]).abs().max()) < 1e-7
    # and it is reached, not vacuous: some element is off by more than a quarter of it
    assert bool(((x.float() - y).abs() > 0.25 * error_bound(x)).any())


def test_into_a_16_bit_output_adds_only_that_dtypes_rounding() -> None:
    x = _data(3 * BLOCK, torch.bfloat16)
    q, scale = quantize(x)
    out = torch.empty(x.shape, dtype=torch.bfloat16)
    dequantize(q, scale, out=out)
    exact = dequantize(q, scale)
    assert bool(((out.float() - exact).abs() <= exact.abs() * 2.0**-8).all())  # bf16 unit roundoff


def test_non_finite_blocks_stay_non_finite() -> None:
    """fp16's overflow check after a quantized reduction must still see an inf or a nan."""
    x = torch.randn(3 * BLOCK)
    x[5] = float("inf")
    x[2 * BLOCK + 1] = float("nan")
    y = dequantize(*quantize(x))
    assert not bool(torch.isfinite(y[:BLOCK]).any()) and not bool(torch.isfinite(y[2 * BLOCK:]).any())
    assert bool(torch.isfinite(y[BLOCK:2 * BLOCK]).all())  # the finite block is untouched by its neighbours


@pytest.mark.parametrize("numel", [1, 6, BLOCK + 3, 4 * BLOCK])
def test_pack_unpack_and_the_estimates_byte_count(numel: int) -> None:
    x = torch.randn(numel, dtype=torch.bfloat16)
    out = torch.empty(packed_bytes(numel), dtype=torch.int8)
    pack(x, out)
    q, scale = unpack(out, numel)
    ref_q, ref_scale = quantize(x)
    assert torch.equal(q, ref_q) and torch.equal(scale, ref_scale)
    assert BLOCK == QWZ_BLOCK  # one block size for the engine and for estimate/simulate
    assert packed_bytes(numel) - quantized_bytes(numel) == -numel % 4  # the scales start 4-byte aligned

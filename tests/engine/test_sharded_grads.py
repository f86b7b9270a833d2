"""The fp32 gradient-shard accumulator (zerorun.engine.mechanism.sharded_grads.ShardAccumulator).

At world 3 the reduced chunk is averaged by ``alpha = 1/3`` (``predivide / world``). With
bf16 gradients the first micro-step's ``torch.mul(part, alpha, out=acc)`` computed in bf16
and then widened (relative error ~2^-9), while every later micro-step added in fp32: the
first write now casts, then scales in fp32, bit for bit what the later adds compute.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from zerorun.engine.mechanism.sharded_grads import ShardAccumulator


def _accumulator(n: int) -> ShardAccumulator:
    bucket = SimpleNamespace(shard_numel=n, data=torch.empty(0))
    return ShardAccumulator([bucket], eager=True)  # type: ignore[list-item]


def test_the_first_micro_step_averages_bf16_in_fp32_at_world_3() -> None:
    torch.manual_seed(0)
    part = torch.randn(4096).to(torch.bfloat16)
    alpha = 1.0 / 3  # the post-reduction average at world 3 (no predivide)
    acc = _accumulator(part.numel())
    acc.add(0, part, alpha)
    want = part.float() * alpha
    assert torch.equal(acc.get(0), want)
    # and exactly what the add of a later micro-step computes from zero
    later = torch.zeros(part.numel()).add_(part, alpha=alpha)
    assert torch.equal(acc.get(0), later)


def test_accumulation_is_first_write_then_fp32_adds() -> None:
    parts = [torch.randn(64).to(torch.bfloat16) for _ in range(3)]
    acc = _accumulator(64)
    for p in parts:
        acc.add(0, p, 0.5)
    want = torch.zeros(64)
    for p in parts:
        want.add_(p, alpha=0.5)
    assert torch.equal(acc.get(0), want)
    acc.zero()
    assert not acc.holds(0) and torch.equal(acc.get(0), torch.zeros(64))

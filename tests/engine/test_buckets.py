"""The bucket planner's alignment and its NCCL sizes (zerorun.engine.mechanism.buckets), pure."""

from __future__ import annotations

import pytest
import torch

from zerorun.engine.mechanism.buckets import (
    ALIGN_BYTES,
    ALIGN_ELEMENTS,
    MAX_BUCKET_NUMEL,
    FlatBucket,
    layout_numel,
    plan_buckets,
    zero_padding,
)

SHAPES = [torch.Size(s) for s in ((7, 3), (5,), (1,), (13, 2), (9,))]


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_slots_and_shards_are_16_byte_aligned_in_16_bit_dtypes(world: int) -> None:
    for plan in plan_buckets(SHAPES, 40, world, align=ALIGN_ELEMENTS):
        assert all(s.offset % ALIGN_ELEMENTS == 0 for s in plan.slots), plan
        assert plan.shard_numel(world) % ALIGN_ELEMENTS == 0, plan
        assert plan.padded_numel - plan.numel < ALIGN_ELEMENTS * (len(plan.slots) + world)
    assert ALIGN_ELEMENTS * 2 == ALIGN_BYTES  # bf16/fp16 elements


def test_the_views_of_a_bucket_are_aligned_in_memory() -> None:
    params = [torch.nn.Parameter(torch.randn(s)) for s in SHAPES]
    (plan,) = plan_buckets(SHAPES, 10**6, 4, align=ALIGN_ELEMENTS)
    bucket = FlatBucket(plan, [params[i] for i in plan.param_indices], 4, 3)
    bucket.cast_(torch.bfloat16)
    assert all(p.data.data_ptr() % ALIGN_BYTES == 0 for p in bucket.params)
    assert bucket.shard(bucket.data).data_ptr() % ALIGN_BYTES == 0
    for p, i in zip(bucket.params, plan.param_indices, strict=True):  # the values moved with the layout
        assert p.shape == SHAPES[i]


def test_padding_runs_are_exactly_what_no_slot_covers_and_are_zeroed() -> None:
    (plan,) = plan_buckets(SHAPES, 10**6, 3, align=ALIGN_ELEMENTS)
    covered = torch.zeros(plan.padded_numel, dtype=torch.bool)
    for s in plan.slots:
        covered[s.offset:s.offset + s.numel] = True
    runs = torch.zeros_like(covered)
    for offset, length in plan.padding():
        runs[offset:offset + length] = True
    assert torch.equal(runs, ~covered)
    flat = torch.full((plan.padded_numel,), 5.0)
    zero_padding(flat, plan)
    assert torch.equal(flat == 0, ~covered)


def test_the_unaligned_default_is_the_old_packed_layout() -> None:
    (plan,) = plan_buckets(SHAPES, 10**6, 4)
    assert [s.offset for s in plan.slots] == [0, 9, 35, 36, 41] and plan.padded_numel == 64


def test_gloo_caps_buckets_nccl_takes_the_configured_size() -> None:
    assert layout_numel(500_000_000) == MAX_BUCKET_NUMEL
    assert layout_numel(500_000_000, native_collectives=True) == 500_000_000
    assert layout_numel(1000) == layout_numel(1000, native_collectives=True) == 1000

"""Pruning candidates with the memory estimate before they run."""

from __future__ import annotations

from zerorun.autotune.prune import MemoryContext, check, predicted_bytes, split
from zerorun.autotune.space import MICRO_BATCH
from zerorun.estimate import GiB, ModelShape, Placement, Training


def _ctx(gpu_gib: float, stage: int = 2, shape: ModelShape | None = None) -> MemoryContext:
    return MemoryContext(
        training=Training(1_000_000_000, 8), placement=Placement(stage), gpu_memory=int(gpu_gib * GiB), shape=shape,
    )


def test_bigger_buckets_predict_more_memory_by_exactly_their_bytes() -> None:
    ctx = _ctx(80)
    small = predicted_bytes(ctx, {"reduce_bucket_size": 10**7, "overlap_comm": False})
    large = predicted_bytes(ctx, {"reduce_bucket_size": 10**8, "overlap_comm": False})
    # the bf16 staging bucket (one in flight), and the step's fp32 temporaries for one bucket's
    # shard of 8 (foreach AdamW's sqrt(v): 4 bytes an element)
    assert large - small == (10**8 - 10**7) * 2 + (10**8 - 10**7) // 8 * 4
    overlapped = predicted_bytes(ctx, {"reduce_bucket_size": 10**8, "overlap_comm": True})
    assert overlapped - large == 10**8 * 2


def test_candidates_that_cannot_fit_are_pruned_with_the_reason() -> None:
    ctx = _ctx(6)  # stage 2, 1B params on 8 GPUs: 3.5 GiB of states + 1 GiB overhead + buckets
    small, large = ({"reduce_bucket_size": n, "allgather_bucket_size": 10**7} for n in (10**7, 2 * 10**9))
    kept, pruned = split(ctx, [small, large])
    assert [v.knobs["reduce_bucket_size"] for v in kept] == [10**7]
    assert [v.knobs["reduce_bucket_size"] for v in pruned] == [2 * 10**9]
    assert "GiB per GPU >" in pruned[0].reason and "headroom" in pruned[0].reason


def test_headroom_is_kept_free() -> None:
    ctx = _ctx(80)
    need = predicted_bytes(ctx, {})
    just = MemoryContext(**{**ctx.__dict__, "gpu_memory": need, "headroom": 0.0})
    assert check(just, {}).fits
    tight = MemoryContext(**{**ctx.__dict__, "gpu_memory": need, "headroom": 0.05})
    assert not check(tight, {}).fits


def test_micro_batch_changes_the_activation_estimate() -> None:
    shape = ModelShape(hidden=2048, layers=16, heads=16, seq_len=1024, micro_batch=1)
    ctx = _ctx(80, shape=shape)
    one = predicted_bytes(ctx, {MICRO_BATCH: 1})
    four = predicted_bytes(ctx, {MICRO_BATCH: 4})
    assert four > one and (four - one) % 3 == 0  # activations scale linearly with the micro batch

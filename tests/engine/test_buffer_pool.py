"""Stage 3's host buffer pool (zerorun.engine.mechanism.buffer_pool).

* The pool itself: a kept buffer leaves its storage empty (views included, as a resize to 0
  does), the next fill of that size gets the very same bytes back, other sizes allocate, a
  drain hands everything back; it is off on a device, without torch's storage swap, and
  with ``ZERORUN_POOL_GATHERED=0``.
* In the engine (two gloo ranks, the tight window): after the first pass almost every gather
  reuses a released buffer (fresh allocations bounded by what the window holds at once),
  nothing idles after a pass, and the parameters after three steps are bit for bit those of
  the same run with the pool off.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from tests.dist_harness import run_distributed
from zerorun import torch_compat
from zerorun.engine import physical_memory
from zerorun.engine.mechanism.buffer_pool import BufferPool

needs_swap = pytest.mark.skipif(not torch_compat.can_swap_storage_bytes(),
                                reason="this torch has no UntypedStorage._swap_data_ptr_ (the pool is off there)")


@needs_swap
def test_a_kept_buffer_comes_back_to_the_next_fill_of_its_size() -> None:
    pool = BufferPool()
    full = torch.arange(1024, dtype=torch.float32)
    view = full[10:20]
    storage = full.untyped_storage()
    ptr = storage.data_ptr()
    pool.keep(storage)
    assert storage.nbytes() == 0 and view.untyped_storage().nbytes() == 0  # as a resize to 0 leaves them
    assert pool.idle_bytes == 4096
    other = torch.empty(0, dtype=torch.float32).untyped_storage()
    pool.fill(other, 2048)  # another size: new bytes, the kept buffer stays
    assert (other.nbytes(), pool.allocated, pool.reused, pool.idle_bytes) == (2048, 1, 0, 4096)
    pool.fill(storage, 4096)
    assert storage.data_ptr() == ptr and storage.nbytes() == 4096 and pool.idle_bytes == 0 and pool.reused == 1
    full.fill_(7.0)
    assert view.sum().item() == 70.0  # the view reads the bytes its storage got back
    pool.keep(storage)
    pool.drain()
    assert pool.idle_bytes == 0
    pool.fill(storage, 4096)
    assert pool.allocated == 2


def test_the_pool_is_for_host_buffers_only_and_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert BufferPool.for_devices({torch.device("meta")}) is None
    assert BufferPool.for_devices({torch.device("cpu"), torch.device("meta")}) is None
    assert BufferPool.for_devices(set()) is None
    monkeypatch.setattr(torch_compat, "FORCE_FALLBACK", {"swap_storage_bytes"})
    assert BufferPool.for_devices({torch.device("cpu")}) is None  # a torch without the swap
    monkeypatch.setattr(torch_compat, "FORCE_FALLBACK", set())
    monkeypatch.setenv("ZERORUN_POOL_GATHERED", "0")
    assert BufferPool.for_devices({torch.device("cpu")}) is None
    monkeypatch.delenv("ZERORUN_POOL_GATHERED")
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")  # freed buffers go straight back: nothing to avoid
    assert BufferPool.for_devices({torch.device("cpu")}) is None
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    monkeypatch.setattr(physical_memory, "_RETURNING", True)  # return_freed_memory() ran here (a CPU simulation)
    assert BufferPool.for_devices({torch.device("cpu")}) is None
    monkeypatch.setattr(physical_memory, "_RETURNING", False)
    assert (BufferPool.for_devices({torch.device("cpu")}) is not None) == torch_compat.can_swap_storage_bytes()


BLOCKS, HIDDEN = 6, 32


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(HIDDEN, 4 * HIDDEN), nn.Tanh(), nn.Linear(4 * HIDDEN, HIDDEN))
                           for _ in range(BLOCKS)])


def _train(rank: int, world_size: int, pool: bool) -> dict:
    import zerorun

    os.environ["ZERORUN_POOL_GATHERED"] = "1" if pool else "0"
    model = _model()
    config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10**9,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                    "stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 4 * HIDDEN ** 2}}
    engine, *_ = zerorun.initialize(model=model, model_parameters=model.parameters(), config=config)
    p = engine.parts.coordinator.pool
    seen: dict = {}
    for step in range(3):
        x = torch.randn(2, HIDDEN, generator=torch.Generator().manual_seed(10 * step + rank))
        if p is not None and step == 2:
            p.reused = p.allocated = 0
        engine.backward(engine(x).square().mean())
        if p is not None and step == 2:
            seen = {"reused": p.reused, "allocated": p.allocated, "idle_after_pass": p.idle_bytes}
        engine.step()
    with zerorun.zero.GatheredParameters(list(model.parameters())):
        params = [q.detach().clone() for q in model.parameters()]
    return {"params": params, "pooled": p is not None, **seen}


def _both(rank: int, world_size: int) -> dict:
    return {"on": _train(rank, world_size, True), "off": _train(rank, world_size, False)}


@needs_swap
def test_the_engine_reuses_released_buffers_and_trains_bit_for_bit_as_without() -> None:
    for r in run_distributed(_both, 2):
        on, off = r["on"], r["off"]
        assert on["pooled"] and not off["pooled"]
        gathers = on["reused"] + on["allocated"]
        assert gathers >= 4 * BLOCKS  # each Linear gathered in forward and again in backward
        assert on["allocated"] <= 4, on  # what the window holds at once; the rest reuse released buffers
        assert on["idle_after_pass"] == 0  # drained at the pass's end: nothing idles into the step
        for a, b in zip(on["params"], off["params"], strict=True):
            assert torch.equal(a, b)


@needs_swap
def test_a_buffer_no_gather_of_its_size_wants_goes_back_after_the_horizon() -> None:
    pool = BufferPool(horizon=2)
    once = torch.empty(256, dtype=torch.uint8).untyped_storage()  # an embedding: gathered once a pass
    pool.keep(once)
    block = torch.empty(0, dtype=torch.uint8).untyped_storage()
    pool.fill(block, 64)
    pool.keep(block)
    pool.fill(block, 64)
    assert pool.idle_bytes == 256  # two gathers since it was kept: still waiting
    pool.keep(block)
    pool.fill(block, 64)
    assert pool.idle_bytes == 0 and pool.reused == 2 and pool.allocated == 1

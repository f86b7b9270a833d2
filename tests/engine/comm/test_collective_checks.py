"""The checking modes of Collectives (zerorun.engine.comm.checks), on one and two gloo ranks.

Deferred work: an asynchronous collective's buffer holds poison until wait(), its input is
the buffer as issued, and writing or freeing it before wait() fails. Device discipline: a
tensor off the group's device is refused (no second device exists here, so the unit case
names a device the group does not have).
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from tests.dist_harness import run_distributed
from zerorun.engine.comm.checks import (
    CHECK_ENV,
    CollectiveBufferError,
    CollectiveDeviceError,
    check_device,
    check_modes,
    defer,
)
from zerorun.engine.errors import EngineError


class _Later:
    """A work that finishes at wait(): what a GPU collective looks like to the host."""

    def __init__(self, fn) -> None:  # noqa: ANN001
        self.fn = fn

    def wait(self) -> None:
        self.fn()


def test_modes_parse_and_unknown_ones_are_named() -> None:
    assert check_modes({}) == frozenset()
    assert check_modes({CHECK_ENV: "deferred, Device"}) == {"deferred", "device"}
    with pytest.raises(EngineError, match="unknown mode.*defered"):
        check_modes({CHECK_ENV: "defered"})


def test_the_buffer_is_poisoned_until_wait_and_the_input_is_what_was_issued() -> None:
    buf = torch.arange(4.0)
    seen = []
    work = defer("all_reduce", buf, lambda t: _Later(lambda: (seen.append(t.clone()), t.mul_(2))))
    assert torch.isnan(buf).all()  # a read before wait() gets NaN
    work.wait()
    assert seen[0].tolist() == [0, 1, 2, 3] and buf.tolist() == [0, 2, 4, 6]
    ints = torch.arange(3, dtype=torch.int64)
    work = defer("all_gather", ints, lambda t: _Later(lambda: None))
    assert not torch.equal(ints, torch.arange(3))
    work.wait()
    assert ints.tolist() == [0, 1, 2]


def test_writing_before_wait_fails() -> None:
    buf = torch.ones(4)
    work = defer("reduce_scatter", buf, lambda t: _Later(lambda: None))
    buf[1] = 3.0
    with pytest.raises(CollectiveBufferError, match="reduce_scatter.*written before its wait"):
        work.wait()


def test_freeing_before_wait_fails() -> None:
    buf = torch.ones(4)
    work = defer("all_gather", buf, lambda t: _Later(lambda: None))
    buf.untyped_storage().resize_(0)  # how a gathered buffer is released
    with pytest.raises(CollectiveBufferError, match="freed or reallocated"):
        work.wait()


def test_a_tensor_off_the_groups_device_is_refused() -> None:
    check_device("all_reduce", torch.device("cpu"), [torch.ones(1)])
    with pytest.raises(CollectiveDeviceError, match="all_reduce got a tensor on cpu, but the group's device is meta"):
        check_device("all_reduce", torch.device("meta"), [torch.ones(1)])


def _deferred_ranks(rank: int, world: int) -> dict[str, object]:
    os.environ[CHECK_ENV] = "deferred,device,native"
    from zerorun.engine.comm.collectives import Collectives

    coll = Collectives(dist.group.WORLD, world, rank)
    out: dict[str, object] = {"native": coll.native_reduce_scatter, "lane": coll.open_shared_lane(64)}
    flat = torch.arange(8.0) + rank
    pending = coll.reduce_scatter(flat, async_op=True)
    out["poisoned"] = bool(torch.isnan(flat).all())
    pending.wait()
    out["shard"] = coll.shard_of(flat).tolist()
    gathered = torch.zeros(8)
    coll.shard_of(gathered).fill_(rank + 1)
    coll.all_gather(gathered, async_op=True).wait()
    out["gathered"] = gathered.tolist()
    late = torch.ones(2)
    work = coll.all_reduce(late, async_op=True)
    late.add_(1)  # the bug the mode is for: the buffer reused before the wait
    try:
        work.wait()
        out["caught"] = False
    except CollectiveBufferError:
        out["caught"] = True
    return out


@pytest.mark.timeout(240)
def test_two_ranks_in_the_deferred_nccl_policy() -> None:
    out = run_distributed(_deferred_ranks, 2, timeout=200)
    for rank, r in enumerate(out):
        assert r["native"] is True and r["lane"] is False and r["poisoned"] is True
        assert r["shard"] == [float(2 * i + 1) for i in range(rank * 4, rank * 4 + 4)]  # sum of i and i+1
        assert r["gathered"] == [1.0] * 4 + [2.0] * 4 and r["caught"] is True


def _layouts(rank: int, world: int) -> dict[str, object]:
    import zerorun
    from tests.engine.test_engine_cases import MICRO_BATCH, global_batch, loss_fn, make_model, rank_rows
    from zerorun.engine.mechanism import buckets

    buckets.MAX_BUCKET_NUMEL = 64  # the gloo cap, shrunk to below this model (its 2^21 exceeds any test model)
    out: dict[str, object] = {}
    for checks in ("", "native"):
        os.environ[CHECK_ENV] = checks
        model = make_model()
        engine, _, _, _ = zerorun.initialize(model=model, config={
            "train_micro_batch_size_per_gpu": MICRO_BATCH, "steps_per_print": 10**6,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
            "zero_optimization": {"stage": 2, "reduce_bucket_size": 10**6}})
        losses = []
        for step in range(3):
            x, y = global_batch(step, MICRO_BATCH * world)
            loss = loss_fn(engine(x[rank_rows(0, rank, world)]), y[rank_rows(0, rank, world)])
            engine.backward(loss)
            engine.step()
            losses.append(float(loss))
        out[checks or "gloo"] = {"buckets": len(engine.parts.buckets), "losses": losses}
    return out


@pytest.mark.timeout(240)
def test_the_nccl_policy_lays_buckets_out_at_the_configured_size_on_gloo() -> None:
    for r in run_distributed(_layouts, 2, timeout=200):
        assert r["native"]["buckets"] == 1 and r["gloo"]["buckets"] > 1, r  # 10**6 holds; the cap splits
        assert r["native"]["losses"] == pytest.approx(r["gloo"]["losses"], rel=1e-5)

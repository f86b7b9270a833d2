"""The shared-memory lane of same-host gloo ranks, against gloo itself and against plain sums.

Each case runs the same sequence of collectives through an engine ``Collectives`` with the
lane open and through one without (gloo's all-reduce, the point-to-point exchanges), on
worlds 2, 3 and 4: more collectives in flight than the lane has slots, blocking ones in
between, ranks that wait at different times, tensors larger than a slot (they go in pieces,
more pieces than slots), fp32 and bf16. Results must equal the exact sums computed from
every rank's inputs.
"""

from __future__ import annotations

import os
import time
import uuid

import pytest
import torch
import torch.distributed as dist

from tests.dist_harness import RankFailure, run_distributed
from zerorun.engine.comm import shm as shared_memory
from zerorun.engine.comm.collectives import Collectives
from zerorun.engine.comm.shm import SLOTS

SLOT_NUMEL = 96  # fp32 elements per slot: the 120- and 600-element cases below exceed it


# 600 fp32 elements are 7+ pieces of any kind at worlds 2-4: more pieces than slots in one collective
CASES = [(96, torch.float32), (48, torch.bfloat16), (120, torch.float32), (24, torch.float32),
         (600, torch.float32), (600, torch.bfloat16)] * 2


def _inputs(rank: int, n: int, dtype: torch.dtype, k: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * k + rank)
    return torch.randn(n, generator=g).to(dtype)


def _expected_sum(world: int, n: int, dtype: torch.dtype, k: int) -> torch.Tensor:
    total = torch.zeros(n, dtype=torch.float64)
    for r in range(world):
        total += _inputs(r, n, dtype, k).double()
    return total


def _sequence(rank: int, world: int, lane: bool) -> dict[str, object]:
    coll = Collectives(dist.group.WORLD, world, rank)
    opened = coll.open_shared_lane(SLOT_NUMEL) if lane else False
    results: list[torch.Tensor] = []
    pending = []
    for k, (n, dtype) in enumerate(CASES):
        n = n // world * world
        x = _inputs(rank, n, dtype, k)
        kind = ("reduce_scatter", "all_gather", "all_reduce")[k % 3]
        if kind == "all_gather":  # every chunk from its owner: fill the others with junk first
            size = n // world
            own = x.narrow(0, rank * size, size).clone()
            x.fill_(-7)
            x.narrow(0, rank * size, size).copy_(own)
        pending.append(getattr(coll, kind)(x, async_op=True))
        results.append(x)
        if k % 5 == 4:  # a blocking one in between, while others are in flight
            y = torch.full((8,), float(rank + 1))
            coll.all_reduce(y)
            results.append(y)
        if rank == 0 and k % 2 == 0:  # ranks complete at different times
            pending[-1].wait()
    if rank == world - 1:
        time.sleep(0.2)  # the last rank waits late: the others must not need it to finish
    for p in reversed(pending):  # out of order: waiting completes every earlier one first
        p.wait()
    return {"opened": opened, "via": coll.counter.snapshot()["reduce_scatter"].get("via", ""),
            "results": [r.float() for r in results]}


def _both(rank: int, world: int) -> dict[str, dict[str, object]]:
    return {"lane": _sequence(rank, world, True), "gloo": _sequence(rank, world, False)}


def _check(world: int, out: dict[str, object], rank: int, partial_roundings: bool) -> None:
    """``partial_roundings``: gloo's all-reduce rounds every partial sum to a 16-bit dtype; the lane
    and the point-to-point exchanges sum in fp32 and round once."""
    results = list(out["results"])  # type: ignore[call-overload]
    for k, (n, dtype) in enumerate(CASES):
        n = n // world * world
        got = results.pop(0)
        kind = ("reduce_scatter", "all_gather", "all_reduce")[k % 3]
        size = n // world
        if kind == "reduce_scatter":  # only the rank's own chunk is defined
            want = _expected_sum(world, n, dtype, k).narrow(0, rank * size, size)
            got = got.narrow(0, rank * size, size)
        elif kind == "all_gather":
            want = torch.cat([_inputs(r, n, dtype, k).narrow(0, r * size, size).double() for r in range(world)])
        else:
            want = _expected_sum(world, n, dtype, k)
        if dtype != torch.bfloat16:
            rtol = atol = 1e-5
        elif partial_roundings and kind == "all_reduce":
            rtol, atol = 2**-7, world * 2**-6  # a rounding per partial sum (inputs of magnitude < 4)
        else:
            rtol, atol = 2**-7, 1e-6  # one rounding of the exact sum: within one bf16 ulp of the rounded sum
        torch.testing.assert_close(got.double(), want.to(dtype).double(), rtol=rtol, atol=atol)
        if k % 5 == 4:
            assert results.pop(0).tolist() == [world * (world + 1) / 2] * 8


@pytest.mark.timeout(200)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_the_lane_gives_the_sums_gloo_gives(world: int) -> None:
    both = run_distributed(_both, world, timeout=150)
    lane, gloo = [b["lane"] for b in both], [b["gloo"] for b in both]
    for rank in range(world):
        assert lane[rank]["opened"] and "shared memory" in lane[rank]["via"]
        assert not gloo[rank]["opened"] and "point-to-point" in gloo[rank]["via"]
        _check(world, lane[rank], rank, partial_roundings=False)
        _check(world, gloo[rank], rank, partial_roundings=True)
    # an all-reduce through the lane leaves the same bits on every rank (replicas stay equal)
    for k, got in enumerate(lane[0]["results"]):
        for rank in range(1, world):
            if k % 3 == 2:
                assert torch.equal(got, lane[rank]["results"][k])


def _open_with(rank: int, world: int, off_on: int | None, token: str) -> tuple[bool, list[str]]:
    # this run's segment names, told apart from the lanes of tests running beside it
    shared_memory.new_token = lambda: token
    if rank == off_on:
        os.environ[shared_memory.ENV_SWITCH] = "0"
    coll = Collectives(dist.group.WORLD, world, rank)
    opened = coll.open_shared_lane(SLOT_NUMEL)
    coll.all_true(True)  # every rank is past opening
    return opened, _lane_files(token)


def _lane_files(token: str) -> list[str]:
    listed = os.listdir(shared_memory.SHM_DIR) if shared_memory.SHM_DIR.is_dir() else []
    return sorted(f for f in listed if f.startswith(f"zerorun-lane-{token}"))


@pytest.mark.timeout(120)
def test_the_lane_leaves_no_files_and_one_rank_can_turn_it_off_for_all() -> None:
    token = f"test{uuid.uuid4().hex}"
    assert run_distributed(_open_with, 2, None, token, timeout=100) == [(True, [])] * 2
    assert run_distributed(_open_with, 2, 1, token, timeout=100) == [(False, [])] * 2
    assert _lane_files(token) == []


def _die_while_awaited(rank: int, world: int, report: str) -> None:
    coll = Collectives(dist.group.WORLD, world, rank)
    assert coll.open_shared_lane(SLOT_NUMEL)
    coll.all_reduce(torch.ones(4))
    if rank == 1:
        raise RuntimeError("rank 1 leaves")  # and exits, without posting the next collective
    start = time.monotonic()
    try:
        coll.all_reduce(torch.ones(4))
        outcome = "no error"
    except shared_memory.PeerLost as e:
        outcome = f"{e} after {time.monotonic() - start:.1f} s"
    with open(report, "w") as f:
        f.write(outcome)


@pytest.mark.timeout(120)
def test_a_rank_waiting_on_a_dead_peer_raises_and_names_it(tmp_path) -> None:
    """The peer exits and is not reaped yet (a zombie, as under any parent that has not polled)."""
    report = tmp_path / "rank0.txt"
    with pytest.raises(RankFailure, match="rank 1 leaves"):
        run_distributed(_die_while_awaited, 2, str(report), timeout=60, grace=60)
    text = report.read_text()
    assert "rank 1 (pid" in text and "exited while this rank waited for it to post collective 2" in text, text
    # found through the dead pid, not the group's 120 s timeout (a loaded machine can take seconds to notice)
    assert float(text.rsplit(" after ", 1)[1].split()[0]) < 60


def test_the_lane_maps_its_budget_at_most_and_carries_any_size() -> None:
    for world in (2, 3, 4, 8):
        slot = shared_memory.slot_bytes_for(10**12, world)  # a model of huge buckets
        assert world * shared_memory.segment_bytes(slot) <= shared_memory.LANE_BYTES + world * 64 * 2**10, world
        assert slot % 64 == 0 and slot >= shared_memory.MIN_SLOT_BYTES
    assert shared_memory.slot_bytes_for(16 * 2**20, 2) == 2**20  # issue 19's bucket at world 2: 1 MiB slots
    assert shared_memory.slot_bytes_for(1000, 2) == 1024  # a small model: its largest bucket, 64-byte aligned
    lane = shared_memory.SharedLane([torch.zeros(shared_memory.segment_bytes(400), dtype=torch.uint8)] * 2, 0, 400)
    assert lane.fits(torch.zeros(10**4)) and lane.fits(torch.zeros(3, dtype=torch.bfloat16))
    assert not lane.fits(torch.zeros(20, 4).t())  # not contiguous
    assert not lane.fits(torch.zeros(4, dtype=torch.complex64))  # a dtype the descriptors do not name
    assert len(lane.slots[0]) == SLOTS


def _mismatched(rank: int, world: int) -> list[str]:
    """Rank 0 issues an all-reduce where rank 1 issues a reduce-scatter of the same size and dtype
    (then rank 0's reduce-scatter comes later): without descriptors both would read each other's
    slots as their own collective and return a sum."""
    coll = Collectives(dist.group.WORLD, world, rank)
    assert coll.open_shared_lane(SLOT_NUMEL)
    coll.all_reduce(torch.ones(8), async_op=True).wait()  # a matched one first: it must pass
    errors = []
    x = torch.full((8,), float(rank + 1))
    try:
        (coll.all_reduce if rank == 0 else coll.reduce_scatter)(x, async_op=True).wait()
    except shared_memory.CollectiveMismatch as e:
        errors.append(str(e))
    return errors + [str(coll.lane.timeout_s)]  # type: ignore[union-attr]


@pytest.mark.timeout(240)
def test_mismatched_collectives_fail_naming_both_ranks_collectives() -> None:
    out = run_distributed(_mismatched, 2, timeout=200)
    for rank, other in ((0, 1), (1, 0)):
        assert len(out[rank]) == 2, out[rank]  # the error, not a sum
        text = out[rank][0]
        mine, theirs = ("all_reduce", "reduce_scatter") if rank == 0 else ("reduce_scatter", "all_reduce")
        assert f"[rank {rank}] collective mismatch: this rank issued {mine} #2 of 8 float32, rank {other} " \
               f"issued {theirs} #2 of 8 float32" in text, text
        assert float(out[rank][1]) == 120.0  # the harness's group timeout, not the 1800 s constant


def test_a_descriptor_names_kind_count_and_dtype() -> None:
    lane = shared_memory.SharedLane([torch.zeros(shared_memory.segment_bytes(400), dtype=torch.uint8)
                                     for _ in range(2)], 0, 400, timeout_s=5.0)
    lane.all_gather(torch.zeros(10, dtype=torch.bfloat16))
    assert shared_memory.describe(lane._descriptor(0, 1)) == "all_gather #1 of 10 bfloat16"
    # a collective of several pieces: each piece names the whole collective's size
    lane.all_reduce(torch.zeros(250))
    assert [shared_memory.describe(lane._descriptor(0, s)) for s in (2, 3, 4)] == [
        f"all_reduce #{s} of 250 float32" for s in (2, 3, 4)]
    assert lane.timeout_s == 5.0 and shared_memory.HEADER_BYTES % 64 == 0


def test_a_collective_is_ready_once_every_peer_posted_it() -> None:
    """Two lanes over the same two segments, in one process: rank 0's all-reduce is ready to
    complete (without waiting) only after rank 1 has posted its own."""
    segments = [torch.zeros(shared_memory.segment_bytes(400), dtype=torch.uint8) for _ in range(2)]
    lanes = [shared_memory.SharedLane(segments, r, 400, timeout_s=5.0) for r in range(2)]
    x, y = torch.full((250,), 1.0), torch.full((250,), 2.0)  # 3 pieces of 100 elements each
    seq = lanes[0].all_reduce(x)
    assert seq == 3 and not lanes[0].posted_by_all(seq)
    lanes[1].all_reduce(y)
    assert lanes[0].posted_by_all(seq) and lanes[1].posted_by_all(seq)
    lanes[0].complete_through(seq)
    lanes[1].complete_through(seq)
    assert x.tolist() == y.tolist() == [3.0] * 250


TOKEN = "feedfacecafe0028"


def _taken_then_die(rank: int, world: int, planted: str, report: str) -> None:
    """First a name another process holds (rank 1's), then rank 1 dying inside the lane's all_true."""
    shared_memory.new_token = lambda: TOKEN
    coll = Collectives(dist.group.WORLD, world, rank)
    opened = coll.open_shared_lane(SLOT_NUMEL)
    coll.all_true(True)
    taken = f"opened={opened} planted={os.path.exists(planted)} own={shared_memory.segment_path(TOKEN, 0).exists()}"
    coll.all_true(True)  # both ranks have looked before rank 1 frees the name
    os.unlink(planted) if rank == 1 else None
    coll.all_true(True)
    if rank == 1:
        def dies(ok: bool) -> bool:
            dist.destroy_process_group()  # its connections close now: rank 0 learns at once, however busy the host
            raise RuntimeError("rank 1 dies in all_true")

        coll.all_true = dies
    try:
        coll.open_shared_lane(SLOT_NUMEL)
        outcome = "no error"
    except Exception as e:  # rank 0: gloo tells it rank 1 is gone
        if rank == 1:
            raise
        outcome = type(e).__name__
    left = _lane_files(TOKEN)
    with open(report, "w") as f:
        f.write(f"{taken} {outcome} {left}")


@pytest.mark.timeout(120)
def test_a_name_this_rank_did_not_create_is_never_unlinked_and_a_peer_dying_leaks_no_segment(tmp_path) -> None:
    planted, report = shared_memory.segment_path(TOKEN, 1), tmp_path / "rank0.txt"
    planted.write_bytes(b"someone else's")
    try:
        with pytest.raises(RankFailure, match="rank 1 dies in all_true"):
            run_distributed(_taken_then_die, 2, str(planted), str(report), timeout=60, grace=60)
    finally:
        planted.unlink(missing_ok=True)
    text = report.read_text()
    assert text.startswith("opened=False planted=True own=False "), text  # refused, left alone, own name gone
    assert text.endswith(" []"), text  # after rank 1 died in all_true, neither segment is left
    assert not _lane_files(TOKEN)

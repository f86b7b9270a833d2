"""A reduce-scatter into ``out`` (stages 2 and 3 sum straight into the gradient accumulator) gives the
bits the in-place one leaves in the rank's chunk, and with ``scale`` those bits times the scale (the
accumulator's average), on every path: the shared-memory lane (in more
pieces than it has slots), the point-to-point exchange, the native collective (NCCL's policy on gloo)
and the deferred stand-in, whose sum is copied into ``out`` once complete. A path that ignored
``out``, or wrote another chunk there, fails.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from tests.dist_harness import run_distributed
from zerorun.engine.comm.checks import CHECK_ENV
from zerorun.engine.comm.collectives import Collectives

PATHS = {"lane": "", "point-to-point": "", "native": "native", "deferred": "deferred"}


def _inputs(rank: int, n: int, dtype: torch.dtype, k: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(100 * k + rank)).to(dtype)


def _both_ways(rank: int, world: int, path: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    os.environ[CHECK_ENV] = PATHS[path]
    coll = Collectives(dist.group.WORLD, world, rank)
    if path == "lane":
        assert coll.open_shared_lane(32)  # 32-element slots: the 600-element cases go in many pieces
    pairs = []
    for k, (n, dtype) in enumerate([(600, torch.float32), (96, torch.bfloat16), (600, torch.bfloat16)]):
        n = n // world * world
        in_place = _inputs(rank, n, dtype, k)
        coll.reduce_scatter(in_place, async_op=True).wait()
        out = torch.full((n // world,), float("nan"), dtype=dtype)
        flat = _inputs(rank, n, dtype, k)
        pending = coll.reduce_scatter(flat, out=out, async_op=True)
        pending.wait()
        blocking = torch.full_like(out, float("nan"))
        coll.reduce_scatter(_inputs(rank, n, dtype, k), out=blocking)
        scaled = torch.full_like(out, float("nan"))
        coll.reduce_scatter(_inputs(rank, n, dtype, k), out=scaled, scale=1 / 3, async_op=True).wait()
        summed = coll.shard_of(in_place)
        pairs += [(summed, out), (summed, blocking), (summed * (1 / 3), scaled)]
    return pairs


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("path", list(PATHS))
def test_a_reduce_scatter_into_out_gives_the_in_place_sum(world: int, path: str) -> None:
    for rank, pairs in enumerate(run_distributed(_both_ways, world, path, timeout=200)):
        for k, (want, got) in enumerate(pairs):
            assert torch.equal(got, want), f"rank {rank}, case {k}: out differs from the in-place sum"
            assert not torch.equal(want, torch.zeros_like(want))

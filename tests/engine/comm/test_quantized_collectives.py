"""qwZ's all-gather and qgZ's reduce-scatter on gloo ranks: each within its written bound, bytes as counted.

Every rank builds every rank's input from a seed, so each checks its result against the
exact one computed locally (float64), element by element, with the bound the modules
write down (:mod:`zerorun.engine.comm.quantize`, :mod:`zerorun.engine.comm.quantized`):
* all-gather: chunk r within ``max|block of r's chunk| / 254``, then the output dtype's rounding;
  every rank ends with the same buffer (the owner's chunk dequantized too);
* reduce-scatter: within the sum over the senders p != r of ``max|block of p's chunk| / 254``,
  then the output dtype's rounding.
World 2 and 4 over gloo's point-to-point exchanges, world 2 with the shared-memory lane open
(the all-gather goes through it), and world 2 on the native (NCCL-policy) path.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.dist_harness import run_distributed
from zerorun.engine.comm.checks import CHECK_ENV
from zerorun.engine.comm.collectives import Collectives
from zerorun.engine.comm.quantize import BLOCK, error_bound, packed_bytes
from zerorun.engine.comm.quantized import quantized_all_gather, quantized_reduce_scatter

SIZE = 2 * BLOCK + 40  # elements per rank's chunk: two whole blocks and a short one
SLACK = 2.0**-20  # fp32 arithmetic on top of the bound, relative to the block's max (quantize.py)
ROUNDING = {torch.float32: 2.0**-23, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def _chunk(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SIZE, generator=g)
    x[torch.randint(0, SIZE, (3,), generator=g)] *= 300.0  # outliers
    x[BLOCK:2 * BLOCK] = 0.0  # an all-zero block
    return x


def _bound(x: torch.Tensor) -> torch.Tensor:
    b = error_bound(x)
    return b + SLACK * 254 * b


def _check(got: torch.Tensor, exact: torch.Tensor, bound: torch.Tensor, what: str) -> float:
    allowed = bound + exact.abs() * ROUNDING[got.dtype] + 1e-30
    err = (got.double() - exact).abs()
    worst = int(torch.argmax(err - allowed))
    assert bool((err <= allowed).all()), f"{what}: element {worst} off by {err[worst]:.3g} > {allowed[worst]:.3g}"
    return float((err / allowed.clamp_min(1e-30)).max())


def _run_all(rank: int, world: int, modes: list[tuple[str, bool]]) -> list[dict]:
    return [_run(rank, world, checks, lane) for checks, lane in modes]


def _run(rank: int, world: int, checks: str, lane: bool) -> dict:
    os.environ[CHECK_ENV] = checks
    coll = Collectives(torch.distributed.group.WORLD, world, rank)
    if lane:
        assert coll.open_shared_lane(world * SIZE)
    out: dict = {"via": coll.counter.via.get("all_gather", "native")}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        name = str(dtype).removeprefix("torch.")
        # all-gather: rank r's chunk is _chunk(r)
        full = torch.empty(world * SIZE, dtype=dtype)
        coll.shard_of(full).copy_(_chunk(rank))
        before = coll.counter.counts["all_gather"].bytes
        quantized_all_gather(coll, full, label="test").wait()
        moved = coll.counter.counts["all_gather"].bytes - before
        assert moved == world * packed_bytes(SIZE), moved
        ratio = 0.0
        for r in range(world):
            src = _chunk(r).to(dtype)
            ratio = max(ratio, _check(full.narrow(0, r * SIZE, SIZE), src.double(), _bound(src),
                                      f"{name} all-gather, chunk {r}"))
        out[f"gather-{name}"] = full.float()
        out[f"gather-ratio-{name}"] = ratio
        out[f"gather-bytes-{name}"] = (moved, world * SIZE * full.element_size())
        # reduce-scatter: rank p's buffer is _chunk(100 p + c) for chunk c
        inputs = [torch.cat([_chunk(100 * p + c) for c in range(world)]).to(dtype) for p in range(world)]
        flat = inputs[rank].clone()
        before = coll.counter.counts["reduce_scatter"].bytes
        quantized_reduce_scatter(coll, flat, async_op=True).wait()
        moved = coll.counter.counts["reduce_scatter"].bytes - before
        assert moved == world * packed_bytes(SIZE), moved
        mine = [x.narrow(0, rank * SIZE, SIZE) for x in inputs]
        exact = sum(m.double() for m in mine)
        bound = sum(_bound(m) for p, m in enumerate(mine) if p != rank)
        out[f"reduce-ratio-{name}"] = _check(coll.shard_of(flat), exact, bound.double(), f"{name} reduce-scatter")
    return out


# world 2 runs three ways in one spawned group: point to point, the shared-memory lane, the native path
MODES = {2: [("", False), ("", True), ("native", False)], 4: [("", False)]}


@pytest.mark.parametrize("world", [2, 4])
def test_quantized_collectives_stay_within_their_bounds(world: int) -> None:
    per_rank = run_distributed(_run_all, world, MODES[world], timeout=240)
    for m, (_checks, lane) in enumerate(MODES[world]):
        results = [r[m] for r in per_rank]
        _assert_mode(results, lane)


def _assert_mode(results: list[dict], lane: bool) -> None:
    if lane:
        assert results[0]["via"] == "shared memory between the ranks of this host"
    for r in results[1:]:  # every rank computes with the same gathered weights
        for key in ("gather-float32", "gather-bfloat16", "gather-float16"):
            assert torch.equal(r[key], results[0][key]), key
    for r in results:
        # the bounds are met and not vacuous: the worst element uses a good part of its allowance
        assert 0.2 < r["gather-ratio-float32"] <= 1.0 and 0.05 < r["reduce-ratio-float32"] <= 1.0, r
        moved, bf16 = r["gather-bytes-bfloat16"]
        assert 0.5 < moved / bf16 < 0.51  # int8 + an fp32 scale per 2048: half of bf16, plus 0.2 %

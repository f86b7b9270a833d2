"""ZeRO++'s quantized collectives (Wang et al., arXiv:2306.10209): qwZ's all-gather, qgZ's reduce-scatter.

Both quantize on the sender and dequantize on the receiver with the blockwise int8 of
:mod:`zerorun.engine.comm.quantize` (one fp32 scale per 2048 elements), and both go
through the counted :class:`~zerorun.engine.comm.collectives.Collectives`, so the per-kind
counters hold the bytes that actually moved: the packed int8 values and scales (about
half of bf16's, a quarter of fp32's). On these rows ``elements`` counts the packed int8
buffer too, so it equals the bytes.

* :func:`quantized_all_gather` (qwZ): each rank packs its chunk of a stage-3 bucket; the
  packed chunks are all-gathered; every rank dequantizes every chunk, its own included, so
  all ranks compute with the same weights (as DeepSpeed does). Error per element:
  ``max|block| / 254`` (then the compute dtype's rounding).
* :func:`quantized_reduce_scatter` (qgZ): each rank packs every peer's chunk of its
  gradient bucket and sends it by an all-to-all; the receiver dequantizes the N-1 chunks
  it gets and adds them in fp32 to its own chunk, which never left it (unquantized). Error
  of the sum: at most the sum over the senders of ``max|their block| / 254``, plus the
  rounding of the result to the bucket's dtype. DeepSpeed 0.19.8 does this in two levels
  (int4 all-to-all inside the node, reduce, re-quantize, all-to-all across nodes); zerorun
  does one level over the group: every element is quantized once, so the bound holds
  without the re-quantization's second error term, and across nodes it moves int8 where
  DeepSpeed's second hop moves int4.
"""

from __future__ import annotations

import torch

from zerorun.engine.comm.collectives import Collectives, Pending
from zerorun.engine.comm.quantize import dequantize, pack, packed_bytes, unpack


def quantized_all_gather(coll: Collectives, full: torch.Tensor, *, label: str | None = None,
                         packed: torch.Tensor | None = None) -> Pending:
    """All-gather ``full`` (this rank's chunk filled) as int8 blocks; every chunk dequantized at the wait.

    ``packed``: this rank's chunk already quantized (a shard resting as int8, :func:`pack`'s
    layout): sent as it is, ``full``'s own chunk not read. Asynchronous: the returned handle's
    ``wait()`` completes the transfer, then writes the dequantized chunks into ``full``.
    """
    world, rank = coll.world_size, coll.rank
    size = full.numel() // world
    chunk = packed_bytes(size)
    out = torch.empty(world * chunk, dtype=torch.int8, device=full.device)
    if packed is None:
        pack(coll.shard_of(full), out.narrow(0, rank * chunk, chunk))
    else:
        out.narrow(0, rank * chunk, chunk).copy_(packed)
    packed = out

    def finish() -> None:
        for r in range(world):
            q, scale = unpack(packed.narrow(0, r * chunk, chunk), size)
            dequantize(q, scale, out=full.narrow(0, r * size, size))

    return coll.all_gather(packed, async_op=True, label=label).then(finish)


def quantized_reduce_scatter(coll: Collectives, flat: torch.Tensor, *, async_op: bool = False) -> Pending:
    """Sum ``flat`` across ranks into this rank's chunk (as :meth:`Collectives.reduce_scatter`), the peers'
    chunks crossing as int8 blocks and added in fp32 on the receiver. Other chunks are left as they were."""
    world, rank = coll.world_size, coll.rank
    size = flat.numel() // world
    chunk = packed_bytes(size)
    send = torch.empty(world * chunk, dtype=torch.int8, device=flat.device)
    recv = torch.empty_like(send)
    for p in range(world):
        if p != rank:
            pack(flat.narrow(0, p * size, size), send.narrow(0, p * chunk, chunk))
    mine = coll.shard_of(flat)

    def finish() -> None:
        total = mine.float()
        for p in range(world):
            if p != rank:
                q, scale = unpack(recv.narrow(0, p * chunk, chunk), size)
                total.add_(dequantize(q, scale))
        mine.copy_(total)

    return coll.all_to_all(send, recv, counted_as="reduce_scatter", finish=finish, async_op=async_op)

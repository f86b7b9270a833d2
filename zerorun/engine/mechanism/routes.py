"""Where a stage-3 bucket's all-gather goes: the shard group (plain), hpZ's secondary copy, or MiCS's two hops.

* **hpZ** (``zero_hpz_partition_size`` = h, DeepSpeed's secondary tensor): when a gathered
  bucket is released, its full buffer is still whole, so the chunk of it that this rank's
  place in its node's group of h owns is kept (``numel / h`` elements). While that copy is
  held, a gather fills the buffer from it over the h ranks of the node, never the world: the
  backward's gathers, and the next micro-step's forward, as in DeepSpeed. The step changes the
  primary shards, so it drops every copy (``GatherCoordinator.after_step``), as does any write
  of the resting shard; the next forward gathers over the world again. A persistent bucket is
  never released, so it has none.
* **MiCS hierarchical** (``mics_hierarchical_params_gather``, DeepSpeed's
  ``_hierarchical_all_gather_params``): the shard group spans ``n`` nodes of ``g`` ranks, the
  buffer is ``[n][g]`` chunks. First this rank's chunk is all-gathered with the ranks at the
  same place on the other nodes (``inter``: one chunk per node crosses the network), then the
  columns of the node's ``g`` places are all-gathered inside the node (``intra``) and laid out as
  the buffer's ``[node][place]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from zerorun.engine.comm.collectives import Collectives
from zerorun.engine.comm.quantized import quantized_all_gather
from zerorun.engine.comm.work import Pending


@dataclass
class GatherRoutes:
    """A bucket's gather routes; the defaults are plain stage 3 (every gather over the bucket's own group)."""

    secondary: Collectives | None = None  # hpZ: the node-local group
    hierarchy: tuple[Collectives, Collectives] | None = None  # MiCS: (inter, intra)
    world: Collectives | None = None  # the world, when the bucket's group is not (MiCS): broadcasts from a rank
    copy: torch.Tensor | None = field(default=None, repr=False)  # hpZ's secondary shard, while valid

    def secondary_held(self) -> bool:
        return self.copy is not None

    def keep_secondary(self, full: torch.Tensor) -> None:
        """Released with its buffer whole: keep this rank's secondary chunk (unless one is held already)."""
        if self.secondary is not None and self.copy is None:
            self.copy = self.secondary.shard_of(full).clone()

    def drop_secondary(self) -> None:
        self.copy = None

    def gather_secondary(self, full: torch.Tensor, label: str, quantized: bool = False) -> Pending:
        """``quantized`` (qwZ): int8 blocks over the node's group too, as DeepSpeed quantizes its
        secondary partition's gathers."""
        assert self.secondary is not None and self.copy is not None
        self.secondary.shard_of(full).copy_(self.copy)
        if quantized:
            return quantized_all_gather(self.secondary, full, label=label)
        return self.secondary.all_gather(full, async_op=True, label=label)

    def gather_hierarchical(self, full: torch.Tensor, label: str) -> Pending:
        """``full`` holds this rank's chunk in place; fill the rest: across nodes, then inside."""
        assert self.hierarchy is not None
        inter, intra = self.hierarchy
        n, g = inter.world_size, intra.world_size
        chunks = full.view(n, g, -1)  # [node][place on the node] of the shard group
        column = full.new_empty(n * chunks.shape[2])  # this place's chunk of every node, contiguous
        inter.shard_of(column).copy_(chunks[inter.rank, intra.rank])
        inter.all_gather(column, label=label)  # blocking: the second hop sends what it brought
        # second hop: every place's column from the node's ranks, into a buffer laid out [place][node],
        # then transposed into the unit's [node][place] (one collective, which the caller may overlap)
        places = full.new_empty(full.numel())
        intra.shard_of(places).copy_(column)
        pending = intra.all_gather(places, async_op=True, label=label)
        return pending.then(lambda: chunks.copy_(places.view(g, n, -1).transpose(0, 1)))

    def held_bytes(self) -> int:
        return 0 if self.copy is None else self.copy.numel() * self.copy.element_size()

"""Stage 3's gradient reduction: stage 2's per-bucket reduce-scatter, with small units coalesced.

Each stage-3 bucket is one module unit, so a model of many small units (norms, biases,
the projections of a small transformer) would pay one collective's fixed latency per
unit per micro-step. A bucket smaller than ``coalesce_numel`` is therefore not reduced on
its own: once its gradients are in, its staging buffer is copied into a *group* laid out
rank-major (rank r's chunk of the group is the concatenation of every member's chunk r),
the staging buffer goes back to the pool, and the group is reduce-scattered in one
collective when the next member would overflow it, or when backward ends. Each rank
receives exactly the elements it would have received bucket by bucket (the counted
volume is unchanged) and adds each member's part into that bucket's fp32 shard. A bucket
of ``coalesce_numel`` elements or more keeps its own reduce-scatter, overlapped with the
rest of backward as before.
"""

from __future__ import annotations

import torch

from zerorun.engine.collectives import Collectives
from zerorun.engine.gather import GatherCoordinator
from zerorun.engine.grad_sync import PartitionedGradSync, ReducePolicy
from zerorun.engine.partition import PartitionedBucket

# A group is reduced once it holds this many elements (4 MB in fp32): past that size one
# collective's fixed latency is small against its transfer, and backward keeps overlapping it.
COALESCE_LIMIT = 1 << 20


class Stage3GradSync(PartitionedGradSync):
    """Reduce-scatter per bucket (small ones coalesced); a bucket whose gradients are all in is released."""

    in_order = False  # a bucket is reduced (and its unit released) as soon as its gradients are in

    def __init__(self, buckets: list[PartitionedBucket], coll: Collectives, policy: ReducePolicy,
                 coordinator: GatherCoordinator, coalesce_numel: int = COALESCE_LIMIT) -> None:
        super().__init__(buckets, coll, policy)  # type: ignore[arg-type]
        self.coordinator = coordinator
        self.coalesce_numel = coalesce_numel
        small = sum(b.plan.padded_numel for b in buckets if b.plan.padded_numel < coalesce_numel)
        # columns of the [world, cap] group buffer: never more than all the small buckets together
        self.cap = max(1, min(coalesce_numel, small) // coll.world_size)
        self.group: torch.Tensor | None = None
        self.members: list[tuple[int, int, int]] = []  # (bucket index, column offset, shard numel)
        self.used = 0

    def _launch(self, bucket_index: int) -> None:
        bucket = self.buckets[bucket_index]
        if bucket.plan.padded_numel >= self.coalesce_numel:
            super()._launch(bucket_index)
        else:
            self._join(bucket_index)
        self.coordinator.post_backward_bucket(bucket_index)

    def _join(self, bi: int) -> None:
        """Copy bucket ``bi``'s complete gradients into the group (reducing the group first if full)."""
        self.tracker.launched[bi] = True
        bucket = self.buckets[bi]
        if bi not in self.staging:
            self._acquire(bi)  # no gradient arrived (unused in forward): all zeros
        buf, filled = self.staging.pop(bi), self.filled.pop(bi)
        for slot, ok in zip(bucket.plan.slots, filled, strict=True):  # what no gradient wrote: zero
            if not ok:
                buf.narrow(0, slot.offset, slot.numel).zero_()
        buf.narrow(0, bucket.plan.numel, bucket.plan.padded_numel - bucket.plan.numel).zero_()  # padding
        shard = bucket.shard_numel
        if self.used + shard > self.cap:
            self._flush()
        if self.group is None:
            self.group = torch.empty(self.coll.world_size, self.cap, dtype=buf.dtype, device=buf.device)
        rows = buf.narrow(0, 0, bucket.plan.padded_numel).view(self.coll.world_size, shard)  # row r: chunk r
        self.group.narrow(1, self.used, shard).copy_(rows)
        self.free.append(buf)
        self.members.append((bi, self.used, shard))
        self.used += shard

    def _flush(self) -> None:
        """Reduce-scatter the group in one collective; every member's part lands in its fp32 shard."""
        if not self.members:
            return
        assert self.group is not None
        world, total = self.coll.world_size, self.used
        flat = self.group.narrow(1, 0, total).contiguous().view(-1)  # a copy unless full
        self.group = None  # the launch owns the buffer; the next group gets a new one (none held at rest)
        members = self.members
        self.members, self.used = [], 0
        rank = self.coll.rank

        def done(comm: torch.Tensor) -> None:
            part = comm.narrow(0, rank * total, total)
            for bi, offset, shard in members:
                self.accum.add(bi, part.narrow(0, offset, shard), self.post)

        assert flat.numel() == world * total
        self._reduce(flat, True, done)

    def held_bytes(self) -> tuple[int, int]:
        """Stage 2's figures, plus the group buffer while a group is being filled (none at rest)."""
        grads, buffers = super().held_bytes()
        group = 0 if self.group is None else self.group.numel() * self.group.element_size()
        return grads, buffers + group

    def finish_backward(self) -> None:
        for i in range(len(self.buckets)):  # parameters unused in forward: their zero gradients
            if not self.tracker.launched[i]:
                self._launch(i)
        self._flush()
        super().finish_backward()  # everything is launched: waits for the reductions
        self.coordinator.end_pass()


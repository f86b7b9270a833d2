"""Gradients kept as fp32 shards (stages 2 and 3): staged, reduce-scattered every micro-step, summed.

* :class:`~zerorun.engine.mechanism.accumulator.ShardAccumulator`: the fp32 sum of a bucket's
  reduced chunks, on the device or, with optimizer offload, in host memory (each chunk landed
  there as its reduction completes: :mod:`zerorun.engine.mechanism.accumulator`).
* :class:`ShardedGradSync` (stage 2): each gradient is copied into a bucket-sized staging
  buffer and freed; a complete bucket is reduce-scattered (in layout order) and the rank's
  chunk added to its accumulator (the first reduction since ``zero()`` sums and averages
  straight into it: ``Collectives.reduce_scatter(out=, scale=)``). Staging buffers come from a bounded pool
  (:data:`MAX_STAGING_BUFFERS`).
* :class:`UnitGradSync` (stage 3): the same, per module unit as soon as its gradients are
  in, and the unit released (:meth:`~zerorun.engine.mechanism.gather.GatherCoordinator.post_backward_bucket`).
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

import weakref

import torch

from zerorun.engine.comm.collectives import Collectives
from zerorun.engine.mechanism.accumulator import GradHome, ShardAccumulator
from zerorun.engine.mechanism.buckets import FlatBucket, zero_padding
from zerorun.engine.mechanism.buffer_pool import BufferPool
from zerorun.engine.mechanism.gather import GatherCoordinator
from zerorun.engine.mechanism.grad_sync import GradSyncBase, ReducePolicy
from zerorun.engine.mechanism.partition import PartitionedBucket
from zerorun.engine.offload.copies import Fence

__all__ = ["ReplicaSum", "ShardAccumulator", "ShardedGradSync", "UnitGradSync"]

# Stage 2 keeps at most this many staging buffers (of one bucket each), however large
# reduce_bucket_size: with capped buckets four let backward run ahead of the reductions,
# and stage 2 still holds less than stage 1's full gradient (measured: an unbounded pool
# grew to 9 buckets on a loaded machine, more gradient bytes than stage 1).
MAX_STAGING_BUFFERS = 4

# A group is reduced once it holds this many elements (4 MB in fp32): past that size one
# collective's fixed latency is small against its transfer, and backward keeps overlapping it.
COALESCE_LIMIT = 1 << 20


class ShardedGradSync(GradSyncBase):
    """Stage 2: reduce-scatter every micro-step from staging buffers; keep only an fp32 gradient shard."""

    def __init__(self, buckets: list[FlatBucket], coll: Collectives, policy: ReducePolicy,
                 home: GradHome | None = None, pool: BufferPool | None = None) -> None:
        """``home``: with optimizer offload, the host memory the offloaded buckets' sums live in. ``pool``
        (stage 3 on the host): staging buffers are taken from and given back to the gathered buffers' pool."""
        super().__init__(buckets, coll, policy)
        self.accum = ShardAccumulator(buckets, eager=True, dtype=policy.accum_dtype, home=home)
        self.pool = pool
        self.staging_numel = max(b.plan.padded_numel for b in buckets)
        self.staging_dtype, self.staging_device = buckets[0].data.dtype, buckets[0].data.device
        two = 2 if policy.overlap_comm else 1
        # overlap_comm always double-buffers, even when one parameter makes a bucket larger than
        # reduce_bucket_size (the estimator counts two buckets; memory must not hang on bucket sizes)
        bound = two if policy.staging_numel is None else max(two, policy.staging_numel // self.staging_numel)
        self.limit = max(1, min(bound, MAX_STAGING_BUFFERS))
        # pooled, a buffer exists only while it stages or its reduction runs
        self.free: list[torch.Tensor] = [] if pool else [self._new() for _ in range(min(two, self.limit))]
        self.allocated = len(self.free)  # staging buffers in existence: free, staging or being reduced
        self.most = self.allocated  # the most at once (pooled, none exists between passes)
        self.extra_allocated = 0
        self.staging: dict[int, torch.Tensor] = {}
        self.filled: dict[int, list[bool]] = {}
        self.claimed: dict[int, list[bool]] = {}  # slots a landing gradient is being computed into (grad_landing)
        self.landed = 0  # gradients found in their slot, not copied (a count for the tests)
        self.slot_of = {id(p): (bi, si) for bi, b in enumerate(buckets) for si, p in enumerate(b.params)}
        self.landing: dict[int, Fence] = {}  # id of a free buffer -> the fence of the landing that reads it
        self.additions_at_arm = 0  # the accumulator's additions when the pass was armed

    def _reduces_now(self) -> bool:
        return True  # DeepSpeed's stage 2 reduces on every micro-step

    def _new(self) -> torch.Tensor:
        """A staging buffer: from the pool (a released unit's bytes, when one of this size is idle) or new."""
        if self.pool is None:
            return torch.empty(self.staging_numel, dtype=self.staging_dtype, device=self.staging_device)
        buf = torch.empty(0, dtype=self.staging_dtype, device=self.staging_device)
        self.pool.fill(buf.untyped_storage(), self.staging_numel * buf.element_size())
        return buf.set_(buf.untyped_storage(), 0, (self.staging_numel,))

    def _acquire(self, bucket_index: int) -> torch.Tensor:
        """A staging buffer: a free one, a finished reduction's, a new one within ``limit``, the
        oldest in flight's, or one extra."""
        if not self.free and self.inflight and self.inflight[0].ready():
            self.inflight.popleft().wait()  # the oldest reduction is over: reuse its buffer, don't grow
        while not self.free:
            if self.inflight and self.allocated >= self.limit:
                # completion returns its buffer to the free list (pooled: to the pool, which makes room);
                # a coalesced group's reduction (stage 3) returns none: wait again
                self.inflight.popleft().wait()
                continue
            # within the limit: backward outruns the reductions, stage one more bucket rather than wait;
            # past it with nothing in flight: buckets' gradients interleave, one more buffer
            if self.allocated >= self.limit:
                self.extra_allocated += 1
            self.allocated += 1
            self.free.append(self._new())
        self.most = max(self.most, self.allocated)
        buf = self.free.pop()
        self.accum.before_reuse(self.landing.pop(id(buf), None))  # its chunk's copy to the host read it first
        self.staging[bucket_index] = buf
        self.filled[bucket_index] = [False] * len(self.buckets[bucket_index].params)
        self.claimed[bucket_index] = [False] * len(self.buckets[bucket_index].params)
        return buf

    def claim(self, param: torch.Tensor, beside: torch.Tensor | None = None) -> torch.Tensor | None:
        """``param``'s slot in its bucket's staging buffer, for its gradient to be computed into
        (:mod:`zerorun.engine.mechanism.grad_landing`); None where that slot already has this pass's
        gradient or one is on its way (a weight used twice: the second gradient is added as usual), or
        where staging it now would make a buffer wait or grow: ``beside`` (the Linear's bias) may reach
        autograd's hook first and need a buffer of its own."""
        where = self.slot_of.get(id(param))
        if where is None:
            return None
        bi, si = where
        buf = self.staging.get(bi)
        if buf is None:
            other = self.slot_of.get(id(beside)) if beside is not None else None
            opening = 2 if other is not None and other[0] != bi and other[0] not in self.staging else 1
            if self._ready_buffers() < opening:
                return None  # the gradient comes the usual way, and its buffer where it always did
            buf = self._acquire(bi)
        if self.claimed[bi][si] or self.filled[bi][si] or buf.dtype != param.dtype:
            return None
        self.claimed[bi][si] = True
        slot = self.buckets[bi].plan.slots[si]
        return buf.narrow(0, slot.offset, slot.numel).view(param.shape)

    def _ready_buffers(self) -> int:
        """Staging buffers :meth:`_acquire` can hand out at once: none while a free one is still read by a
        copy to the host (it would be handed out first, after that copy: a claim must not wait for a landing
        the gradient's copy would overlap), else the free ones and room for new ones."""
        if any(id(b) in self.landing for b in self.free):
            return 0
        return len(self.free) + max(0, self.limit - self.allocated)

    def _absorb(self, bucket_index: int, slot_index: int, param: torch.Tensor) -> None:
        buf = self.staging.get(bucket_index)
        if buf is None:
            buf = self._acquire(bucket_index)
        slot = self.buckets[bucket_index].plan.slots[slot_index]
        if param.grad is not None:
            dest = buf.narrow(0, slot.offset, slot.numel)
            if param.grad.data_ptr() != dest.data_ptr():
                dest.copy_(param.grad.reshape(-1))
            else:  # computed there (grad_landing)
                self.landed += 1
            self.filled[bucket_index][slot_index] = True
        param.grad = None

    def _take(self, bucket_index: int) -> torch.Tensor:
        """The bucket's complete staging buffer, out of the staging map, with every element no gradient
        wrote (unused parameters, padding) zeroed: buffers are reused."""
        bucket = self.buckets[bucket_index]
        if bucket_index not in self.staging:
            self._acquire(bucket_index)  # no gradient arrived (unused in forward): all zeros
        buf, filled = self.staging.pop(bucket_index), self.filled.pop(bucket_index)
        self.claimed.pop(bucket_index)
        for slot, ok in zip(bucket.plan.slots, filled, strict=True):
            if not ok:
                buf.narrow(0, slot.offset, slot.numel).zero_()
        zero_padding(buf, bucket.plan)  # between the aligned slots and after the last
        return buf

    def _launch(self, bucket_index: int) -> None:
        self.tracker.launched[bucket_index] = True
        bucket = self.buckets[bucket_index]
        buf = self._take(bucket_index)
        flat = buf.narrow(0, 0, bucket.plan.padded_numel)
        # the first reduction since zero() sums straight into the accumulator (qgZ sums into its own buffer)
        out = None if self.policy.quantized else self.accum.fresh_target(bucket_index, self.comm_dtype(flat))

        def done(comm: torch.Tensor) -> None:
            if out is not None:
                self.accum.landed(bucket_index)
                fence = None
            else:
                fence = self.accum.add(bucket_index, bucket.shard(comm), self.post)
            self._release(buf, fence if comm.untyped_storage() is buf.untyped_storage() else None)

        self._reduce(flat, True, done, out, self.post if out is not None else 1.0)
        self._complete_ready()

    def _release(self, buf: torch.Tensor, fence: Fence | None) -> None:
        """``buf`` back to the free list at once; with ``fence`` (its chunk is being copied to the host), its
        next user's writes are ordered after that copy (:meth:`_acquire`)."""
        if fence is not None:
            self.landing[id(buf)] = fence
        elif self.pool is not None:  # its bytes serve the next gather or staging buffer of their size
            self.pool.keep(buf.untyped_storage())
            self.allocated -= 1
            return
        self.free.append(buf)

    def _complete_ready(self) -> None:
        """Complete the reductions that have finished, oldest first: their chunks land (offload: start for the
        host) while backward goes on, rather than when the pass ends or a buffer is short."""
        while self.inflight and self.inflight[0].ready():
            self.inflight.popleft().wait()

    def owned_grads(self) -> list[torch.Tensor]:
        return [self.accum.get(i) for i in range(len(self.buckets))]

    def prepare_backward(self, sync: bool) -> None:
        self.additions_at_arm = self.accum.additions
        super().prepare_backward(sync)

    def _drop_pass(self) -> None:
        """An unwound pass's staged gradients (never reduced): the buffers go back to the pool."""
        self.free.extend(self.staging.values())
        self.staging.clear()
        self.filled.clear()
        self.claimed.clear()

    def _partial_in_sum(self) -> bool:
        """Did the unwound pass's reductions (all complete now) add to the shards the step reads?"""
        return self.accum.additions != self.additions_at_arm

    def finish_backward(self) -> None:
        super().finish_backward()
        self.accum.settle()  # the pass's chunks are in their host sums: the device buffers are free

    def zero(self) -> None:
        self.accum.zero()
        self.unscaled_passes = 0
        self.window_passes = 0

    def held_bytes(self) -> tuple[int, int]:
        grads = self.accum.nbytes()
        return grads, self.most * self.staging_numel * self.staging_dtype.itemsize


class UnitGradSync(ShardedGradSync):
    """Reduce-scatter per bucket (small ones coalesced); a bucket whose gradients are all in is released."""

    in_order = False  # a bucket is reduced (and its unit released) as soon as its gradients are in

    def __init__(self, buckets: list[PartitionedBucket], coll: Collectives, policy: ReducePolicy,
                 coordinator: GatherCoordinator, coalesce_numel: int = COALESCE_LIMIT,
                 replica: Collectives | None = None, home: GradHome | None = None) -> None:
        """``replica`` (MiCS): the ranks holding the same shards; the boundary's shards are summed over it."""
        super().__init__(buckets, coll, policy, home, pool=coordinator.pool)  # type: ignore[arg-type]
        self.replicas = ReplicaSum(self.accum, replica) if replica is not None else None
        if replica is not None and policy.average:  # the mean is over the world: the group's ranks x its replicas
            self.post = policy.predivide / (coll.world_size * replica.world_size)
        self.coordinator = coordinator
        coordinator.reducer = weakref.ref(self)  # unwinds an aborted pass at each root forward (module calls too)
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
        buf = self._take(bi)
        shard = bucket.shard_numel
        if self.used + shard > self.cap:
            self._flush()
        if self.group is None:
            self.group = torch.empty(self.coll.world_size, self.cap, dtype=buf.dtype, device=buf.device)
        rows = buf.narrow(0, 0, bucket.plan.padded_numel).view(self.coll.world_size, shard)  # row r: chunk r
        self.group.narrow(1, self.used, shard).copy_(rows)
        self._release(buf, None)
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
        self._reduce(flat, True, done)  # a landing's copy keeps the group's memory (record_stream on CUDA)
        self._complete_ready()

    def held_bytes(self) -> tuple[int, int]:
        """:class:`ShardedGradSync`'s figures, plus the group buffer while a group is being filled (none at rest)."""
        grads, buffers = super().held_bytes()
        group = 0 if self.group is None else self.group.numel() * self.group.element_size()
        return grads, buffers + group

    def finish_backward(self) -> None:
        for i in range(len(self.buckets)):  # parameters unused in forward: their zero gradients
            if not self.tracker.launched[i]:
                self._launch(i)
        self._flush()
        super().finish_backward()  # everything is launched: waits for the reductions
        if self.replicas is not None and self.sync:
            self.replicas.reduce()
        self.coordinator.end_pass()

    def reduce_held(self) -> None:
        """The passes reduce-scattered already; MiCS's replica sum, which non-syncing passes skip, is left."""
        if self.replicas is not None and not self.replicas.summed:
            self.replicas.reduce()

    def prepare_backward(self, sync: bool) -> None:
        if self.replicas is not None:
            self.replicas.reopen()
        super().prepare_backward(sync)

    def _drop_pass(self) -> None:
        """Also the group being filled (never reduced), and every unit the pass left gathered."""
        super()._drop_pass()
        self.group, self.members, self.used = None, [], 0
        self.coordinator.end_pass(record=False)

    def zero(self) -> None:
        super().zero()
        if self.replicas is not None:
            self.replicas.summed = False


class ReplicaSum:
    """MiCS: at the accumulation boundary, the gradient shards summed across the replicas of the shard group.

    Each shard group reduce-scatters its own micro-batches; the ranks holding the same shard
    (one per group) then all-reduce it, as DeepSpeed's ``allreduce_mics_shard_grads`` does, in
    pieces of at most :data:`COALESCE_LIMIT` elements (one collective for a model's many small
    shards). A backward that lands after the sum (a second backward before the step) first
    divides it by the replica count, so the next sum counts what was summed once.
    """

    def __init__(self, accum: ShardAccumulator, replica: Collectives) -> None:
        self.accum = accum
        self.replica = replica
        self.summed = False

    def reduce(self) -> None:
        shards = [self.accum.get(i) for i in range(len(self.accum.buckets))]
        for piece in _pieces(shards, COALESCE_LIMIT):
            flat = torch.cat([t.reshape(-1) for t in piece]) if len(piece) > 1 else piece[0].reshape(-1)
            self.replica.all_reduce(flat)
            if len(piece) > 1:
                offset = 0
                for t in piece:
                    t.copy_(flat.narrow(0, offset, t.numel()))
                    offset += t.numel()
        self.summed = True

    def reopen(self) -> None:
        if self.summed:
            for i in range(len(self.accum.buckets)):
                if self.accum.holds(i):
                    self.accum.get(i).div_(self.replica.world_size)
            self.summed = False


def _pieces(tensors: list[torch.Tensor], limit: int) -> list[list[torch.Tensor]]:
    out: list[list[torch.Tensor]] = [[]]
    size = 0
    for t in tensors:
        if out[-1] and size + t.numel() > limit:
            out.append([])
            size = 0
        out[-1].append(t)
        size += t.numel()
    return [p for p in out if p]

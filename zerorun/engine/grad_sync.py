"""Gradient synchronisation strategies: how each stage turns local gradients into owned, reduced ones.

All strategies share the same flow, driven by post-accumulate-grad hooks: a backward
pass is *armed* -> hooks call ``on_grad_ready`` as gradients land -> a bucket whose
parameters are all ready is launched (asynchronously) -> ``finish_backward()`` launches
leftover buckets (parameters unused in forward) in bucket order and waits for
everything. After the boundary micro-step ``owned_grads()`` gives, per bucket, the
reduced gradient chunk this rank steps.

Who arms and finishes a pass:

* ``engine.backward(loss)`` arms it (``prepare_backward``), runs autograd, and calls
  ``finish_backward()``; the loss is multiplied by the loss scale and divided by the
  accumulation steps first.
* A plain ``loss.backward()`` works too: the first gradient hook of the pass arms it
  (whether it is the boundary micro-step comes from the engine's micro-step count, i.e.
  from ``engine.step()`` being called every micro-step) and queues ``finish_backward``
  as an autograd end-of-backward callback, so gradients are reduced when
  ``backward()`` returns, as DDP's are. As in DeepSpeed, nothing scales such a loss:
  with accumulation the reduced gradient is the *sum* of the micro-steps' rank-averaged
  gradients (divide the loss by ``gradient_accumulation_steps`` yourself for the
  mean), and fp16's loss scale is not applied (the step refuses it; use
  ``engine.backward``). Reentrant activation checkpointing runs nested backward passes
  that would end the pass early: use ``engine.backward`` with it.

* :class:`BucketGradSync` with ``scatter=False`` (stage 0): full gradient buffers
  (``param.grad`` is a view into them, so autograd accumulates micro-steps in place;
  after ``zero()`` it is ``None`` and the first gradient is copied in, so no step
  begins with a memset), an all-reduce per bucket on the boundary micro-step only.
* :class:`BucketGradSync` with ``scatter=True`` (stage 1): same buffers, a
  reduce-scatter per bucket on the boundary micro-step; the rank owns its chunk. The
  other chunks are undefined afterwards, so the pass then detaches the bucket's
  ``param.grad`` (``None``: the reduced chunk is the engine's), and a second backward on
  the same micro-step (a GAN's discriminator: real, then fake) first folds the owned
  chunk into an fp32 sum (:class:`~zerorun.engine.grad_accum.ShardAccumulator`, stage 2's
  accumulator) and restarts the buffer from zero; its reduction adds to that sum. Stage 0
  needs nothing: its all-reduce leaves every rank the whole average, which the next
  reduction averages again unchanged.

* :class:`PartitionedGradSync` (stage 2): no full gradient buffers. Each gradient is
  copied into a bucket-sized staging buffer and freed; a full bucket is reduce-scattered
  on every micro-step (as DeepSpeed does), and the rank's chunk is accumulated into an
  fp32 shard. Staging buffers are taken from a pool that grows, while backward runs
  ahead of the reductions, up to ``staging_numel`` elements (``reduce_bucket_size``,
  twice with ``overlap_comm``: what DeepSpeed's one or two buckets hold) and at most
  :data:`MAX_STAGING_BUFFERS` buckets; beyond it a hook waits for the oldest reduction
  to free its buffer.

Whatever the stage, the step uses the sum over all backward passes since the last step
of their rank-averaged gradients, as one backward of the summed loss would give.

Reductions are always issued asynchronously and waited for at the end of the pass (or
when their staging buffer is needed again): stages 0-1 reduce in the gradient buffers
themselves, so overlapping costs no memory there.

``zero()`` drops every gradient accumulated since the last optimizer step; the engine
routes ``model.zero_grad()`` and ``optimizer.zero_grad()`` to it
(:func:`route_zero_grad`), and a ``param.grad`` that user code replaced or set to
``None`` is noticed at the next gradient or step (stages 0-1; at stage 1 not after the
boundary reduction, which holds the reduced gradient itself).

Averaging: gradients are multiplied by ``1/predivide`` before the reduction and by
``predivide/world`` after it (DeepSpeed's ``gradient_predivide_factor``).
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd import Variable

from zerorun.engine.buckets import FlatBucket, zero_padding
from zerorun.engine.collectives import Collectives, Pending
from zerorun.engine.grad_accum import ShardAccumulator


@dataclass(frozen=True)
class ReducePolicy:
    """How gradients are reduced (from the config)."""

    comm_dtype: torch.dtype | None  # None: the gradients' own dtype
    predivide: float = 1.0
    overlap_comm: bool = True
    # stage 2: elements of staging buffers the backward may hold at once (filling or in flight).
    # None: one bucket, two with overlap_comm.
    staging_numel: int | None = None


# Stage 2 keeps at most this many staging buffers (of one bucket each), however large
# reduce_bucket_size: with capped buckets four let backward run ahead of the reductions,
# and stage 2 still holds less than stage 1's full gradient (measured: an unbounded pool
# grew to 9 buckets on a loaded machine, more gradient bytes than stage 1).
MAX_STAGING_BUFFERS = 4


class _Tracker:
    """Counts ready parameters per bucket within one backward pass."""

    def __init__(self, buckets: list[FlatBucket]) -> None:
        self.sizes = [len(b.params) for b in buckets]
        self.reset()

    def reset(self) -> None:
        self.ready = [0] * len(self.sizes)
        self.launched = [False] * len(self.sizes)
        self.next = 0  # in-order launching: the first bucket not launched yet

    def mark(self, index: int) -> bool:
        """Record one ready parameter; True when the bucket just became complete."""
        self.ready[index] += 1
        return self.ready[index] == self.sizes[index]


class GradSyncBase:
    def __init__(self, buckets: list[FlatBucket], coll: Collectives, policy: ReducePolicy) -> None:
        self.buckets = buckets
        self.coll = coll
        self.policy = policy
        self.tracker = _Tracker(buckets)
        self.inflight: deque[Pending] = deque()
        self.sync = True
        self.armed = False  # a backward pass is in progress
        self.unscaled_passes = 0  # plain loss.backward() passes since the last zero()
        self.boundary: Callable[[], bool] = lambda: True  # the engine's "is this the boundary micro-step?"
        self.pre = 1.0 / policy.predivide
        self.post = policy.predivide / coll.world_size

    def prepare_backward(self, sync: bool) -> None:
        """Arm a pass that the caller finishes itself with :meth:`finish_backward` (``engine.backward``)."""
        self.sync = sync
        self.tracker.reset()
        self.armed = True

    def on_grad_ready(self, bucket_index: int, slot_index: int, param: torch.Tensor) -> None:
        if not self.armed:  # a plain loss.backward(): arm now, finish when autograd is done
            self.prepare_backward(self.boundary())
            self.unscaled_passes += 1
            Variable._execution_engine.queue_callback(self.finish_backward)
        self._absorb(bucket_index, slot_index, param)
        if self.tracker.mark(bucket_index) and self._reduces_now():
            self._launch_complete(bucket_index)

    # Stages 0-2 launch buckets in bucket order (the layout's, which is backward's usual order), as
    # DDP does: every rank then issues the same collectives in the same order even when its gradients
    # arrive in another (routing that differs by rank, as in MoE); a complete bucket waits for the
    # earlier ones. Stage 3 launches on completion: its gathers already need every rank on one path.
    in_order = True

    def _launch_complete(self, bucket_index: int) -> None:
        t = self.tracker
        if not self.in_order:
            self._launch(bucket_index)
            return
        while t.next < len(t.sizes) and t.ready[t.next] == t.sizes[t.next]:
            self._launch(t.next)
            t.next += 1

    def finish_backward(self) -> None:
        self.armed = False
        if self._reduces_now():
            for i in range(len(self.buckets)):
                if not self.tracker.launched[i]:
                    self._launch(i)
        while self.inflight:
            self.inflight.popleft().wait()

    def _reduces_now(self) -> bool:
        return self.sync

    def _absorb(self, bucket_index: int, slot_index: int, param: torch.Tensor) -> None:
        raise NotImplementedError

    def _launch(self, bucket_index: int) -> None:
        raise NotImplementedError

    def _reduce(self, flat: torch.Tensor, scatter: bool, then) -> Pending:
        """Pre-scale, cast to the communication dtype if needed, reduce, and hand the result to ``then``."""
        comm = flat if self.policy.comm_dtype in (None, flat.dtype) else flat.to(self.policy.comm_dtype)
        if self.pre != 1.0:
            comm.mul_(self.pre)
        op = self.coll.reduce_scatter if scatter else self.coll.all_reduce
        pending = op(comm, async_op=True).then(lambda: then(comm))
        self.inflight.append(pending)
        return pending


class BucketGradSync(GradSyncBase):
    """Stages 0 and 1: full gradient buffers, reduced once per optimizer step."""

    def __init__(self, buckets: list[FlatBucket], coll: Collectives, policy: ReducePolicy,
                 scatter: bool) -> None:
        super().__init__(buckets, coll, policy)
        self.scatter = scatter
        self.grads = [torch.zeros_like(b.data) for b in buckets]
        self.views = [b.grad_views(g) for b, g in zip(buckets, self.grads, strict=True)]
        self.attach_views()
        # stage 1: buckets whose owned chunk holds a reduce-scatter result since the last zero(); their
        # params' .grad are detached (None) so that a second backward pass does not add into that chunk
        self.reduced = [False] * len(buckets)
        self.accum = ShardAccumulator(buckets, eager=False)  # the earlier reductions of a repeated backward

    def attach_views(self) -> None:
        """Make each ``param.grad`` a view of its bucket's gradient buffer (accumulated in place)."""
        for b, views in zip(self.buckets, self.views, strict=True):
            for p, v in zip(b.params, views, strict=True):
                p.grad = v

    def _absorb(self, bucket_index: int, slot_index: int, param: torch.Tensor) -> None:
        if self.reduced[bucket_index]:  # another backward on a reduced micro-step
            self._reopen(bucket_index)
        view = self.views[bucket_index][slot_index]
        if param.grad is not None and param.grad is not view:
            # user code cleared or replaced .grad since it was bound: what the buffer holds for this
            # parameter is gone, and autograd's fresh tensor is the whole gradient now
            view.copy_(param.grad)
            param.grad = view

    def _reopen(self, bucket_index: int) -> None:
        """Fold a reduced owned chunk into the fp32 sum and clear the buffer for the next pass's gradients.

        The chunks this rank does not own are undefined after a reduce-scatter: adding new
        gradients there and reducing again would be wrong, so the whole buffer restarts from zero.
        """
        bucket = self.buckets[bucket_index]
        self.accum.add(bucket_index, bucket.shard(self.grads[bucket_index]))
        self.grads[bucket_index].zero_()
        self.reduced[bucket_index] = False

    def finish_backward(self) -> None:
        super().finish_backward()
        for b, reduced in zip(self.buckets, self.reduced, strict=True):
            if reduced:  # a later pass must hand in its gradient alone: autograd assigns a new .grad
                for p in b.params:
                    p.grad = None

    def _sweep_cleared(self) -> None:
        """Bring every unreduced bucket's buffer up to date with its parameters' ``.grad``."""
        for i, reduced in enumerate(self.reduced):
            if not reduced:  # a reduced bucket's grads were detached by the engine: the owned chunk is the result
                self._sweep(i)

    def _sweep(self, bucket_index: int) -> None:
        """Zero the slot of each parameter without a gradient; copy in a ``.grad`` user code replaced."""
        for p, v in zip(self.buckets[bucket_index].params, self.views[bucket_index], strict=True):
            if p.grad is not v:
                if p.grad is None:
                    v.zero_()
                else:
                    v.copy_(p.grad)
                p.grad = v

    def _launch(self, bucket_index: int) -> None:
        self.tracker.launched[bucket_index] = True
        if self.reduced[bucket_index]:  # no new gradient on this rank, but every rank reduces every bucket
            self._reopen(bucket_index)
        self._sweep(bucket_index)  # a slot no gradient reached since zero() holds the last step's: zero it
        flat = self.grads[bucket_index]
        bucket = self.buckets[bucket_index]
        self.reduced[bucket_index] = self.scatter

        def done(comm: torch.Tensor) -> None:
            target = bucket.shard(flat) if self.scatter else flat
            if comm is not flat:
                target.copy_(bucket.shard(comm) if self.scatter else comm)
            target.mul_(self.post)

        self._reduce(flat, self.scatter, done)

    def owned_grads(self) -> list[torch.Tensor]:
        self._sweep_cleared()
        if not self.scatter:
            return list(self.grads)
        owned = []
        for i, (b, g) in enumerate(zip(self.buckets, self.grads, strict=True)):
            if self.accum.holds(i):  # reduced more than once this step: the fp32 sum of all of them
                if self.reduced[i]:
                    self._reopen(i)
                owned.append(self.accum.get(i))
            else:
                owned.append(b.shard(g))
        return owned

    def zero(self) -> None:
        # no memset: with .grad None autograd hands the next gradient over whole, and _absorb copies
        # it into the buffer (a copy instead of a memset plus an add: measured 2-3% of a step);
        # a parameter that gets none has its slot zeroed when its bucket is reduced (_sweep)
        for b in self.buckets:
            for p in b.params:
                p.grad = None
        self.reduced = [False] * len(self.buckets)
        self.accum.zero()
        self.unscaled_passes = 0

    def held_bytes(self) -> tuple[int, int]:
        """(gradient bytes, communication buffer bytes) this rank holds."""
        return sum(g.numel() * g.element_size() for g in self.grads) + self.accum.nbytes(), 0


class PartitionedGradSync(GradSyncBase):
    """Stage 2: reduce-scatter every micro-step from staging buffers; keep only an fp32 gradient shard."""

    def __init__(self, buckets: list[FlatBucket], coll: Collectives, policy: ReducePolicy) -> None:
        super().__init__(buckets, coll, policy)
        self.accum = ShardAccumulator(buckets, eager=True)
        size = max(b.plan.padded_numel for b in buckets)
        dtype, device = buckets[0].data.dtype, buckets[0].data.device
        self._new = lambda: torch.empty(size, dtype=dtype, device=device)
        two = 2 if policy.overlap_comm else 1
        # overlap_comm always double-buffers, even when one parameter makes a bucket larger than
        # reduce_bucket_size (the estimator counts two buckets; memory must not hang on bucket sizes)
        bound = two if policy.staging_numel is None else max(two, policy.staging_numel // size)
        self.limit = max(1, min(bound, MAX_STAGING_BUFFERS))
        self.free: list[torch.Tensor] = [self._new() for _ in range(min(two, self.limit))]
        self.allocated = len(self.free)
        self.extra_allocated = 0
        self.staging: dict[int, torch.Tensor] = {}
        self.filled: dict[int, list[bool]] = {}

    def _reduces_now(self) -> bool:
        return True  # DeepSpeed's stage 2 reduces on every micro-step

    def _acquire(self, bucket_index: int) -> torch.Tensor:
        """A staging buffer: a free one, a finished reduction's, a new one within ``limit``, the
        oldest in flight's, or one extra."""
        if not self.free and self.inflight and self.inflight[0].ready():
            self.inflight.popleft().wait()  # the oldest reduction is over: reuse its buffer, don't grow
        if not self.free and self.allocated < self.limit:
            self.allocated += 1  # backward outruns the reductions: stage one more bucket, don't wait
            self.free.append(self._new())
        if not self.free and self.inflight:
            self.inflight.popleft().wait()  # completion returns its buffer to the free list
        if not self.free:
            self.extra_allocated += 1  # buckets' gradients interleave: one more buffer
            self.allocated += 1
            self.free.append(self._new())
        buf = self.free.pop()
        self.staging[bucket_index] = buf
        self.filled[bucket_index] = [False] * len(self.buckets[bucket_index].params)
        return buf

    def _absorb(self, bucket_index: int, slot_index: int, param: torch.Tensor) -> None:
        buf = self.staging.get(bucket_index)
        if buf is None:
            buf = self._acquire(bucket_index)
        slot = self.buckets[bucket_index].plan.slots[slot_index]
        if param.grad is not None:
            buf.narrow(0, slot.offset, slot.numel).copy_(param.grad.reshape(-1))
            self.filled[bucket_index][slot_index] = True
        param.grad = None

    def _launch(self, bucket_index: int) -> None:
        self.tracker.launched[bucket_index] = True
        bucket = self.buckets[bucket_index]
        if bucket_index not in self.staging:
            self._acquire(bucket_index)
        buf = self.staging.pop(bucket_index)
        filled = self.filled.pop(bucket_index)
        # the staging buffer is reused: zero what no gradient overwrote (padding, unused parameters)
        for slot, ok in zip(bucket.plan.slots, filled, strict=True):
            if not ok:
                buf.narrow(0, slot.offset, slot.numel).zero_()
        zero_padding(buf, bucket.plan)  # between the aligned slots and after the last
        flat = buf.narrow(0, 0, bucket.plan.padded_numel)

        def done(comm: torch.Tensor) -> None:
            self.accum.add(bucket_index, bucket.shard(comm), self.post)
            self.free.append(buf)

        self._reduce(flat, True, done)

    def owned_grads(self) -> list[torch.Tensor]:
        return [self.accum.get(i) for i in range(len(self.buckets))]

    def zero(self) -> None:
        self.accum.zero()
        self.unscaled_passes = 0

    def held_bytes(self) -> tuple[int, int]:
        grads = self.accum.nbytes()
        n_buffers = len(self.free) + len(self.staging) + len(self.inflight)
        buf = self.free[0] if self.free else None
        per = buf.numel() * buf.element_size() if buf is not None else 0
        return grads, n_buffers * per


class _ZeroGradRoute:
    """``owner.zero_grad`` that also drops the engine's gradients (installed on the instance).

    Pickling or deep-copying the owner (``torch.save(model)``, an EMA copy) keeps the class's
    plain ``zero_grad``: the copy has no engine.
    """

    def __init__(self, owner: Any, on_zero: Callable[[], None]) -> None:
        self.owner = owner
        self.plain = type(owner).zero_grad
        self.on_zero = on_zero

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self.plain(self.owner, *args, **kwargs)
        self.on_zero()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return functools.partial, (self.plain, self.owner)


def route_zero_grad(owners: list[Any], sync: GradSyncBase) -> None:
    """Make ``zero_grad()`` of each owner (the module, the optimizer) clear ``sync``'s gradients too."""
    for owner in owners:
        owner.zero_grad = _ZeroGradRoute(owner, sync.zero)

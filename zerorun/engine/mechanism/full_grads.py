"""Stages 0 and 1: full gradient buffers that autograd accumulates into, reduced once per step.

``param.grad`` is a view into its bucket's buffer; on the boundary micro-step the bucket is
all-reduced (stage 0) or reduce-scattered into the owned chunk (stage 1). The flow and
its rules are :mod:`zerorun.engine.mechanism.grad_sync`'s.
"""

from __future__ import annotations

import torch

from zerorun.engine.comm.collectives import Collectives
from zerorun.engine.mechanism.accumulator import ShardAccumulator
from zerorun.engine.mechanism.buckets import FlatBucket
from zerorun.engine.mechanism.grad_sync import GradSyncBase, ReducePolicy


class FullGradSync(GradSyncBase):
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
        self.accum = ShardAccumulator(buckets, eager=False, dtype=policy.accum_dtype)  # the earlier reductions of a repeated backward

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
        self._detach_reduced()

    def reduce_held(self) -> None:
        """Reduce every bucket once, in bucket order: the sum the non-syncing passes accumulated in the
        buffers (a slot no gradient reached is zeroed first, as on a boundary pass)."""
        self.sync = True
        self.tracker.reset()
        for i in range(len(self.buckets)):
            self._launch(i)
        while self.inflight:
            self.inflight.popleft().wait()
        self._detach_reduced()

    def _detach_reduced(self) -> None:
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
        self.window_passes = 0

    def held_bytes(self) -> tuple[int, int]:
        """(gradient bytes, communication buffer bytes) this rank holds."""
        return sum(g.numel() * g.element_size() for g in self.grads) + self.accum.nbytes(), 0

"""The sum of a bucket's reduced gradient chunks, where the optimizer steps it: the device, or host memory.

:class:`ShardAccumulator` keeps one sum per bucket, of the bucket's shard size, in the
masters' dtype (fp32 unless bf16 masters). The first addition since :meth:`~ShardAccumulator.zero`
overwrites (no memset on the common path), later ones add; read with nothing added, it is
zeroed then. Every reducer that keeps a gradient shard uses it (stages 2 and 3 every
micro-step; stage 1 when a second backward lands on a micro-step already reduced).

With optimizer offload the sums of the offloaded buckets live in host memory (a
:class:`GradHome`, :mod:`zerorun.engine.offload.host_grads`): a reduced chunk still on the
device is *landed* there as its reduction completes (copied off the compute stream, then
cast, scaled or added on the host by exactly the operations a device sum would run), and
the device buffer that held it is free again once the copy's fence is passed, which the
reducer asks for with :meth:`~ShardAccumulator.before_reuse`. So the device holds no
gradient shard: only the buckets in flight. Where the host memory is the device's own (a
CPU run) a chunk is added in place as without offload, and a reduction writes the first
sum straight into the host buffer.
"""

from __future__ import annotations

from typing import Protocol

import torch

from zerorun.engine.comm.sums import land
from zerorun.engine.mechanism.buckets import FlatBucket
from zerorun.engine.offload.copies import Fence


class GradHome(Protocol):
    """Where the offloaded buckets' gradient sums live, and how a reduced chunk gets there."""

    def hosts(self, index: int) -> bool:
        """Bucket ``index``'s sum lives in host memory (Twin-Flow's device buckets keep theirs on the device)."""
        ...

    def zeros(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A zeroed host buffer (pinned when the policy pins)."""
        ...

    def reachable(self, t: torch.Tensor) -> bool:
        """``t`` is in host memory already: a host sum adds it in place, no copy."""
        ...

    def land(self, acc: torch.Tensor, part: torch.Tensor, alpha: float, fresh: bool) -> Fence | None:
        """Queue ``acc = part * alpha`` (``fresh``) or ``acc += alpha * part``; the fence after which ``part``'s
        device memory may be written again (``None``: done already)."""
        ...

    def settle(self) -> None:
        """Every landing queued so far is complete in its host sum."""
        ...

    def reuse_after(self, fence: Fence) -> None:
        """The compute stream's next writes come after ``fence`` (a landing's copy has read its source)."""
        ...


class ShardAccumulator:
    """One accumulator per bucket, of the bucket's shard size, in the masters' dtype (fp32 unless bf16 masters)."""

    def __init__(self, buckets: list[FlatBucket], eager: bool, dtype: torch.dtype = torch.float32,
                 home: GradHome | None = None) -> None:
        """``home``: with optimizer offload, where the offloaded buckets' sums live (host memory)."""
        self.buckets = buckets
        self.dtype = dtype
        self.home = home
        # bucket i's sum is in host memory while its reduced chunks arrive on the device: they are landed
        self.remote = [home is not None and home.hosts(i) and not home.reachable(b.data)
                       for i, b in enumerate(buckets)]
        self.flat: torch.Tensor | None = None  # eager sums that live in one place: views of this one buffer
        self.acc: list[torch.Tensor | None] = (self._in_one_buffer() or [self._new(i) for i in range(len(buckets))]
                                               if eager else [None] * len(buckets))
        self.fresh = [True] * len(buckets)  # holds nothing since the last zero(): overwrite, not add
        self.additions = 0  # reduced chunks summed in so far (a reducer tells whether a pass added any)

    def _new(self, index: int) -> torch.Tensor:
        bucket = self.buckets[index]
        if self.home is not None and self.home.hosts(index):
            return self.home.zeros(bucket.shard_numel, self.dtype)
        return torch.zeros(bucket.shard_numel, dtype=self.dtype, device=bucket.data.device)

    def _in_one_buffer(self) -> list[torch.Tensor | None] | None:
        """Every bucket's sum as a view of :attr:`flat` (DeepSpeed's ``grad_partitions_flat_buffer``), back to
        back, so the bytes are those of one buffer per bucket, to the byte (the estimate's); None where the sums
        live in more than one place (part on the device, part in host memory: ZeRO-Offload++'s ratio)."""
        hosted = {self.home is not None and self.home.hosts(i) for i in range(len(self.buckets))}
        devices = {b.data.device for b in self.buckets}
        if len(hosted) != 1 or len(devices) != 1:
            return None
        sizes = [b.shard_numel for b in self.buckets]
        total = sum(sizes)
        if self.home is not None and hosted == {True}:
            self.flat = self.home.zeros(total, self.dtype)
        else:
            self.flat = torch.zeros(total, dtype=self.dtype, device=devices.pop())
        return list(self.flat.split(sizes))

    def add(self, index: int, part: torch.Tensor, alpha: float = 1.0) -> Fence | None:
        """Add ``alpha * part`` (a reduced chunk) to bucket ``index``'s sum. A landed chunk returns the fence
        after which ``part``'s memory may be written (:meth:`before_reuse`); ``None``: free at once."""
        acc = self._buffer(index)
        fresh, self.fresh[index] = self.fresh[index], False
        self.additions += 1
        if self.remote[index]:
            assert self.home is not None
            return self.home.land(acc, part, alpha, fresh)
        if fresh:
            land(acc, part, alpha)  # cast, then scale in the sum's dtype, as the later add_ does
        else:
            acc.add_(part, alpha=alpha)
        return None

    def before_reuse(self, fence: Fence | None) -> None:
        """A buffer whose chunk was landed under ``fence`` is about to be written again."""
        if fence is not None and self.home is not None:
            self.home.reuse_after(fence)

    def _buffer(self, index: int) -> torch.Tensor:
        acc = self.acc[index]
        if acc is None:
            acc = self.acc[index] = self._new(index)
        return acc

    def fresh_target(self, index: int, dtype: torch.dtype) -> torch.Tensor | None:
        """Bucket ``index``'s sum buffer when the next addition overwrites it and a ``dtype`` reduction can
        write there itself (a reduce-scatter's ``out``, scaled as :meth:`add` scales: no copy of the reduced
        chunk); then :meth:`landed`. Never a host sum the device's reduction cannot reach."""
        if self.remote[index]:
            return None
        return self._buffer(index) if self.fresh[index] and dtype == self.dtype else None

    def landed(self, index: int) -> None:
        """A reduction wrote bucket ``index``'s scaled chunk into :meth:`fresh_target`'s buffer."""
        self.fresh[index] = False
        self.additions += 1

    def holds(self, index: int) -> bool:
        return not self.fresh[index]

    def settle(self) -> None:
        """Every chunk added so far is in its sum (landings to host memory complete)."""
        if self.home is not None:
            self.home.settle()

    def get(self, index: int) -> torch.Tensor:
        acc = self.acc[index]
        assert acc is not None
        self.settle()
        if self.fresh[index]:  # nothing added since zero() (a step without backward): the sum is zero
            acc.zero_()
        return acc

    def zero(self) -> None:
        self.settle()  # a landing still on its way would add into the next step's sum
        self.fresh = [True] * len(self.buckets)  # the next add overwrites: no memset per step

    def nbytes(self, host: bool | None = None) -> int:
        """Bytes of the sums: all of them, or those in host memory (``host=True``) or on the device (``False``)."""
        on_host = [self.home is not None and self.home.hosts(i) for i in range(len(self.buckets))]
        return sum(a.numel() * a.element_size() for a, h in zip(self.acc, on_host, strict=True)
                   if a is not None and (host is None or h == host))

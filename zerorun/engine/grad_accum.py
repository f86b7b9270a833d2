"""fp32 sums of reduced gradient chunks: what a rank steps when a step's gradients are reduced more than once.

Stage 2 (and 3) reduce-scatter on every micro-step and add each reduced chunk here. Stage 1
reduces once per step in its gradient buffers, and comes here only when a second backward
pass lands on a micro-step that was already reduced (a GAN's discriminator: real, then
fake): the first reduction's chunk is folded in before the buffer is reused, so only that
case allocates (``eager=False``).

The first addition since :meth:`zero` overwrites (no memset on the common path), later ones add;
an accumulator read with nothing added is zeroed then.
"""

from __future__ import annotations

import torch

from zerorun.engine.buckets import FlatBucket


class ShardAccumulator:
    """One fp32 accumulator per bucket, of the bucket's shard size."""

    def __init__(self, buckets: list[FlatBucket], eager: bool) -> None:
        self.buckets = buckets
        self.acc: list[torch.Tensor | None] = [self._new(b) if eager else None for b in buckets]
        self.fresh = [True] * len(buckets)  # holds nothing since the last zero(): overwrite, not add

    @staticmethod
    def _new(bucket: FlatBucket) -> torch.Tensor:
        return torch.zeros(bucket.shard_numel, dtype=torch.float32, device=bucket.data.device)

    def add(self, index: int, part: torch.Tensor, alpha: float = 1.0) -> None:
        """Add ``alpha * part`` (a reduced chunk) to bucket ``index``'s sum."""
        acc = self.acc[index]
        if acc is None:
            acc = self.acc[index] = self._new(self.buckets[index])
        if self.fresh[index]:
            torch.mul(part, alpha, out=acc)
            self.fresh[index] = False
        else:
            acc.add_(part, alpha=alpha)

    def holds(self, index: int) -> bool:
        return not self.fresh[index]

    def get(self, index: int) -> torch.Tensor:
        acc = self.acc[index]
        assert acc is not None
        if self.fresh[index]:  # nothing added since zero() (a step without backward): the sum is zero
            acc.zero_()
        return acc

    def zero(self) -> None:
        self.fresh = [True] * len(self.buckets)  # the next add overwrites: no memset per step

    def nbytes(self) -> int:
        return sum(a.numel() * a.element_size() for a in self.acc if a is not None)

"""``optimizer.accumulated_grads_in_cpu`` of DeepSpeed's ZeRO-1/2 optimizer under optimizer offload.

DeepSpeed keeps, with ``offload_optimizer`` and more than one micro-step per step, the gradients
summed over the accumulation window in host memory, one tensor per parameter partition; at one
micro-step per step it allocates none. zerorun keeps the same sums as one host tensor per bucket
(the rank's fp32 chunk, :class:`~zerorun.engine.mechanism.accumulator.ShardAccumulator`, at
stages 1 and 2 alike: offload reduces every micro-step), so the mapping is keyed by bucket index
and read from the accumulator at each access: each item is the sum itself, no copy. Empty at one
micro-step per step, as DeepSpeed's, and for a bucket that has received nothing since the last step.
"""

from __future__ import annotations

import weakref

import torch

from zerorun.engine.mechanism.accumulator import ShardAccumulator
from zerorun.engine.surface.live_views import LiveMapping
from zerorun.engine.views import BatchFacts


class HostGradSums(LiveMapping[int, torch.Tensor]):
    """Bucket index -> this window's host gradient sum, for the buckets whose sums live in host memory."""

    def __init__(self, accum: ShardAccumulator, engine: BatchFacts) -> None:
        self._accum = weakref.ref(accum)  # both held weakly: the engine owns the accumulator
        self._engine = weakref.ref(engine)  # its accumulation steps, read at each access (set_train_batch_size)

    def _live(self) -> dict[int, torch.Tensor]:
        accum, engine = self._accum(), self._engine()
        if accum is None or engine is None or accum.home is None or engine.gradient_accumulation_steps() == 1:
            return {}
        home = accum.home
        return {i: accum.get(i) for i in range(len(accum.buckets)) if home.hosts(i) and accum.holds(i)}


"""Which stage-3 buckets ZeRO++ quantizes: qwZ's gathers and frozen shards resting as int8.

DeepSpeed 0.19.8 reads ``zero_quantized_weights`` and ``zero_quantized_nontrainable_weights``
from the config or from ``zero.Init``'s arguments; either asks. ``zero.Init`` marks the
parameters it builds (:func:`mark`), so the request survives into the engine's buckets
whatever unit layout they get. Persistent buckets are left exact (gathered once, refreshed
unquantized after each step, as DeepSpeed's persistent parameters are).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from zerorun.engine.mechanism.partition import PartitionedBucket

QWZ_ATTR = "zr_quantized_weights"  # zero.Init(zero_quantized_weights=True) built this parameter
FROZEN_ATTR = "zr_quantized_nontrainable_weights"  # zero.Init(zero_quantized_nontrainable_weights=True)


def mark(params: Iterable[torch.Tensor], weights: bool, nontrainable: bool) -> None:
    """Remember ``zero.Init``'s ZeRO++ arguments on the parameters it builds."""
    for p in params:
        if weights:
            setattr(p, QWZ_ATTR, True)
        if nontrainable:
            setattr(p, FROZEN_ATTR, True)


def _asked(bucket: PartitionedBucket, by_config: bool, attr: str) -> bool:
    return by_config or any(getattr(p, attr, False) for p in bucket.params)


def apply(buckets: list[PartitionedBucket], frozen: list[PartitionedBucket], weights: bool,
          nontrainable: bool) -> None:
    """Set each non-persistent bucket's qwZ gathers, and rest frozen ones as int8 where asked."""
    for b in [*buckets, *frozen]:
        b.quantized_gather = not b.persistent and _asked(b, weights, QWZ_ATTR)
    for b in frozen:
        if not b.persistent and _asked(b, nontrainable, FROZEN_ATTR):
            b.rest_quantized()

"""``deepspeed.runtime.swap_tensor``: DeepSpeed's size constants for NVMe swapping.

DeepSpeed swaps no tensor under ``MIN_AIO_BYTES`` (1 MiB; ``MIN_SWAPPABLE_BYTES`` is the same number) and
its tests size models from it. zerorun's NVMe offload (``offload_optimizer``/``offload_param`` with
``device: nvme``) swaps whole buckets, every one of them, so it has no such threshold of its own: the
names carry DeepSpeed's values, for scripts and tests that size things by them. DeepSpeed's swapper
classes are not provided.
"""

from __future__ import annotations

MIN_AIO_BYTES = 1024**2
AIO_ALIGNED_BYTES = 1024
MIN_SWAPPABLE_BYTES = MIN_AIO_BYTES

__all__ = ["AIO_ALIGNED_BYTES", "MIN_AIO_BYTES", "MIN_SWAPPABLE_BYTES"]

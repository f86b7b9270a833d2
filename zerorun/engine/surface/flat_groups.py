"""``optimizer.bit16_groups_flat`` and the flatten log line of DeepSpeed's ZeRO-1/2 optimizer.

At stages 1 and 2 the parameters are views of flat buffers in the compute dtype on the engine's
device (:class:`~zerorun.engine.mechanism.buckets.FlatBucket`), what DeepSpeed's ZeRO-1/2 optimizer
keeps as ``bit16_groups_flat``. Two differences: DeepSpeed has one flat buffer per parameter group,
zerorun one per bucket (a group's parameters span several buckets: ``reduce_bucket_size``, capped on
gloo; each bucket's ``plan.group_index`` names its group), and the list is read from the live buckets
at each access, so a bucket whose tensor is replaced (``engine.offload_states()`` moves it off the
device and back) is never seen stale. It is exposed where DeepSpeed's ZeRO-1/2 optimizer has it:
stage 0 keeps no partitioned optimizer (DeepSpeed's stage-0 optimizers name their buffers
``bf16_groups_flat`` / ``fp16_groups_flat``), and stage 3's buckets are sharded.

The log line ``Flattening param group N on DEVICE (sufficient memory)`` goes, once per parameter
group, at INFO, to DeepSpeed's logger (``logging.getLogger("DeepSpeed")``, the object
``deepspeed.utils.logger`` is in the compatibility layer, its ``.info`` looked up at each call).
It is true in zerorun's terms: every bucket is made on the engine's device, one at a time. A
script on zerorun's own API has no handler on that logger and no level set, so INFO stays silent.
"""

from __future__ import annotations

import logging
import weakref

import torch

from zerorun.engine.mechanism.buckets import ALIGN_BYTES, FlatBucket
from zerorun.engine.surface.live_views import LiveSequence

LOGGER_NAME = "DeepSpeed"
"""The name of DeepSpeed's logger (``deepspeed.utils.logger``; zerorun.compat.utils gives it DeepSpeed's handler)."""


class FlatGroups(LiveSequence[torch.Tensor]):
    """The flat parameter buffer of every bucket, in layout order, read from the buckets at each access.

    Each item is the bucket's buffer itself (no copy, never part of an autograd graph: ``grad_fn`` is None),
    so writing into it writes the parameters. The buckets are held weakly: the engine owns them."""

    def __init__(self, buckets: list[FlatBucket]) -> None:
        self._buckets = [weakref.ref(b) for b in buckets]

    def buckets(self) -> list[FlatBucket]:
        """The buckets still alive, in layout order."""
        return [b for b in (ref() for ref in self._buckets) if b is not None]

    def _live(self) -> list[torch.Tensor]:
        return [b.data for b in self.buckets()]

    def __repr__(self) -> str:
        shapes = ", ".join(f"{t.numel()} x {t.dtype} on {t.device}" for t in self._live())
        return f"FlatGroups([{shapes}])"


class RankPartitions(LiveSequence[list[torch.Tensor]]):
    """``parallel_partitioned_bit16_groups``: per bucket, every rank's chunk of its flat buffer (views, rank order)."""

    def __init__(self, groups: FlatGroups) -> None:
        self._groups = groups

    def _live(self) -> list[list[torch.Tensor]]:
        return [list(b.data.chunk(b.world_size)) for b in self._groups.buckets()]


def expose(optimizer: torch.optim.Optimizer, buckets: list[FlatBucket]) -> None:
    """Set ``optimizer.bit16_groups_flat`` (and each rank's chunks of it, ``parallel_partitioned_bit16_groups``, with
    their alignment in 16-bit elements, ``nccl_start_alignment_factor``) over ``buckets``, and log the flatten line
    once per parameter group."""
    optimizer.bit16_groups_flat = groups = FlatGroups(buckets)  # type: ignore[attr-defined]
    optimizer.parallel_partitioned_bit16_groups = RankPartitions(groups)  # type: ignore[attr-defined]
    # DeepSpeed's factor is in 16-bit elements (2: 4-byte starts); zerorun starts every chunk at ALIGN_BYTES
    optimizer.nccl_start_alignment_factor = ALIGN_BYTES // 2  # type: ignore[attr-defined]
    by_group: dict[int, list[FlatBucket]] = {}
    for b in buckets:
        by_group.setdefault(b.plan.group_index, []).append(b)
    for gi, group in sorted(by_group.items()):
        device, dtype = group[0].data.device, group[0].data.dtype
        numel = sum(b.plan.numel for b in group)
        # looked up now: a test (DeepSpeed's own) may have replaced the logger's .info
        logging.getLogger(LOGGER_NAME).info(
            f"Flattening param group {gi} on {device.type} (sufficient memory): {numel} elements in {len(group)} "
            f"flat bucket(s) of {dtype}, each made on {device} (the engine's device) one at a time; the parameters "
            f"are views of them (optimizer.bit16_groups_flat)")

"""``optimizer.single_partition_of_fp32_groups`` and ``optimizer.averaged_gradients`` of DeepSpeed's ZeRO optimizer.

RLHF frameworks and DeepSpeed's own tests read these two between ``backward`` and ``step`` and around
``engine.offload_states()``:

* ``single_partition_of_fp32_groups``: the fp32 master partition this rank steps, one flat tensor per
  parameter group in DeepSpeed, one per bucket in zerorun (a group's parameters span several buckets:
  ``reduce_bucket_size``). Each item is the master itself, the tensor ``optimizer.state`` is keyed by,
  so ``optimizer.state[p]["exp_avg"]`` works; writing into one writes the master.
* ``averaged_gradients``: parameter group index -> this rank's reduced gradient partitions, on the
  engine's device, once the accumulation boundary's backward has reduced them and until the step:
  one tensor per parameter that has elements in this rank's chunk of its bucket (views of the sums,
  without the padding; DeepSpeed's partitions are per parameter, zerorun's per bucket). Empty before
  that, after the step, and always under ``offload_optimizer``: there, as in DeepSpeed, the sums live in
  host memory (``optimizer.accumulated_grads_in_cpu``).

Both are read from the engine at each access, held weakly (the engine owns them): a master that
``offload_states`` moves is never seen stale.
"""

from __future__ import annotations

import weakref

import torch

from zerorun.engine.mechanism.buckets import FlatBucket
from zerorun.engine.surface.live_views import LiveMapping, LiveSequence
from zerorun.engine.views import Shards


class _OverEngine:
    """Holds the engine weakly (the engine owns what the views read)."""

    def __init__(self, engine: Shards) -> None:
        self._ref = weakref.ref(engine)

    @property
    def _engine(self) -> Shards:
        engine = self._ref()
        if engine is None:
            raise RuntimeError("the engine of this optimizer is gone")
        return engine


class FP32Partitions(_OverEngine, LiveSequence[torch.Tensor]):
    """The fp32 master partition of every bucket, in layout order (the optimizer's own parameters)."""

    def _live(self) -> list[torch.Tensor]:
        return list(self._engine.parts.masters.masters)


class SubGroupParams(_OverEngine, LiveSequence[list[torch.Tensor]]):
    """Stage 3's ``fp16_groups``: the trainable parameters of each bucket (DeepSpeed's sub-group), in layout order."""

    def _live(self) -> list[list[torch.Tensor]]:
        return [list(b.params) for b in self._engine.parts.buckets]


class AveragedGradients(_OverEngine, LiveMapping[int, list[torch.Tensor]]):
    """Group index -> this rank's piece of each of its parameters' reduced gradients, held between the boundary
    backward and the step."""

    def _live(self) -> dict[int, list[torch.Tensor]]:
        parts = self._engine.parts
        sync = parts.grad_sync
        home = getattr(getattr(sync, "accum", None), "home", None)
        if home is not None or sync.armed or not sync.window_passes or not sync.sync:
            return {}  # offloaded, mid-pass, nothing since the step, or the last pass kept its gradients local
        out: dict[int, list[torch.Tensor]] = {}
        for bucket, chunk in zip(parts.buckets, sync.owned_grads(), strict=True):
            out.setdefault(bucket.plan.group_index, []).extend(_pieces(bucket, chunk))
        return out


def _pieces(bucket: FlatBucket, chunk: torch.Tensor) -> list[torch.Tensor]:
    """The part of each parameter that falls in this rank's ``chunk`` of ``bucket`` (views, layout order): no
    padding, as DeepSpeed's list has one tensor per parameter partition."""
    lo, hi = bucket.shard_offset, bucket.shard_offset + bucket.shard_numel
    out = []
    for slot in bucket.plan.slots:
        a, b = max(slot.offset, lo), min(slot.offset + slot.numel, hi)
        if a < b:
            out.append(chunk[a - lo:b - lo])
    return out


def expose_partitions(optimizer: torch.optim.Optimizer, engine: Shards, sharded_params: bool) -> None:
    """The masters under DeepSpeed's names: ZeRO-1/2's ``single_partition_of_fp32_groups``; stage 3's
    ``fp32_partitioned_groups_flat``, one per sub-group (zerorun's buckets), with ``fp16_groups``, each
    sub-group's parameters."""
    if not sharded_params:
        optimizer.single_partition_of_fp32_groups = FP32Partitions(engine)  # type: ignore[attr-defined]
        return
    optimizer.fp32_partitioned_groups_flat = FP32Partitions(engine)  # type: ignore[attr-defined]
    optimizer.fp16_groups = SubGroupParams(engine)  # type: ignore[attr-defined]


def expose_gradients(optimizer: torch.optim.Optimizer, engine: Shards) -> None:
    """ZeRO-1/2/3: ``optimizer.averaged_gradients`` over ``engine``'s gradient sync."""
    optimizer.averaged_gradients = AveragedGradients(engine)  # type: ignore[attr-defined]

"""DeepSpeed's per-parameter attributes on stage-3 parameters (``ds_status``, ``ds_numel``, ...).

Libraries written against DeepSpeed ZeRO-3 read these from each parameter: TRL's fused
LM-head loss asks ``p.ds_status`` before gathering the head, the Trainer and PEFT count
parameters through ``ds_numel``, PEFT sizes adapters from ``ds_shape``, TRL's generation
helper clears ``ds_active_sub_modules``. :func:`sync` writes them from the bucket, and the
bucket calls it when it is made and when it takes its shard, and :func:`sync_status` on every
state transition (:meth:`~zerorun.engine.mechanism.partition.PartitionedBucket._move`), so they are never stale:

* ``ds_status``: a :class:`ZeroParamStatus` (``AVAILABLE`` for persistent buckets, which stay gathered);
* ``ds_id``: an integer unique to the parameter, the same on every rank (ranks build the same
  model in the same order); kept when the engine re-packs a ``zero.Init`` parameter;
* ``ds_numel`` / ``ds_shape``: the full parameter's element count and shape, whatever its state;
* ``ds_tensor``: this rank's part of the parameter, a view of the bucket's resting shard
  (a bucket's shard is one contiguous chunk of its flat buffer, so this may hold fewer
  elements than DeepSpeed's per-parameter partition, or none; empty while an nvme-offloaded
  shard rests on disk);
* ``ds_persist``: the bucket is under ``stage3_param_persistence_threshold`` and never released;
* ``ds_active_sub_modules``: the units whose forward is running with this parameter gathered
  (a live view of the gather coordinator's stack);
* ``is_external_param``: ``False`` (DeepSpeed's flag for a parameter registered on a module that does not
  own it; zerorun registers none: ``register_external_parameter`` is refused);
* the methods ``all_gather``, ``all_gather_coalesced`` and ``partition``
  (:mod:`zerorun.engine.surface.ds_param_methods`).

A parameter with ``ds_id`` is a ZeRO-3 parameter (:func:`is_zero_param`, DeepSpeed's test).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Set
from enum import Enum
from typing import Any, Protocol

import torch
from torch import nn

from zerorun import torch_compat
from zerorun.engine.mechanism.buckets import BucketPlan
from zerorun.engine.mechanism.param_state import ParamState


class PartitionedBucket(Protocol):
    """What the attributes are written from: a stage-3 bucket
    (:class:`zerorun.engine.mechanism.partition.PartitionedBucket`, which calls :func:`sync`)."""

    params: list[nn.Parameter]
    plan: BucketPlan
    state: ParamState
    persistent: bool
    local: torch.Tensor | None
    data: torch.Tensor
    toucher: Callable[..., bool] | None

    @property
    def shard_offset(self) -> int: ...


class ZeroParamStatus(Enum):
    """DeepSpeed's names (and values) for a stage-3 parameter's state."""

    AVAILABLE = 1  # the full parameter is present (gathered, or never partitioned)
    NOT_AVAILABLE = 2  # only this rank's shard is held
    INFLIGHT = 3  # its all-gather is running


_FROM_STATE = {ParamState.GATHERED: ZeroParamStatus.AVAILABLE, ParamState.SHARDED: ZeroParamStatus.NOT_AVAILABLE,
               ParamState.IN_FLIGHT: ZeroParamStatus.INFLIGHT}
# DeepSpeed numbers parameters with one counter per process too (zero.Init.param_id); only the order matters
_next_id = itertools.count()


def status_of(bucket: PartitionedBucket) -> ZeroParamStatus:
    return ZeroParamStatus.AVAILABLE if bucket.persistent else _FROM_STATE[bucket.state]


class ActiveSubModules(Set):
    """The units (by index) whose forward is running with ``bucket`` held: read from the coordinator."""

    def __init__(self, bucket: PartitionedBucket) -> None:
        self._bucket = bucket

    def _units(self) -> list[int]:
        coordinator = getattr(self._bucket.toucher, "__self__", None)  # the coordinator's bound touch()
        index = getattr(coordinator, "index_of", {}).get(id(self._bucket))
        if index is None:  # not (yet) under an engine's coordinator: zero.Init, or before initialize
            return []
        return [u for u, held in coordinator.stack if index in held]  # type: ignore[union-attr]

    def __contains__(self, unit: object) -> bool:
        return unit in self._units()

    def __iter__(self) -> Iterator[int]:
        return iter(self._units())

    def __len__(self) -> int:
        return len(self._units())

    def clear(self) -> None:
        """What TRL calls before removing the hooks. The coordinator keeps its own counts, and between
        passes (where generation helpers call this) they are empty already: nothing to undo."""

    def __repr__(self) -> str:
        return f"ds_active_sub_modules({set(self._units())})"


def _part_of_shard(bucket: PartitionedBucket, offset: int, numel: int) -> torch.Tensor:
    """The elements of slot ``[offset, offset + numel)`` that fall in this rank's chunk, as a view of ``local``."""
    local = bucket.local
    if local is None:
        return torch.empty(0, dtype=bucket.data.dtype, device=bucket.data.device)
    lo, hi = bucket.shard_offset, bucket.shard_offset + local.numel()
    start, end = max(offset, lo), min(offset + numel, hi)
    if end <= start:  # the slot lies wholly in another rank's chunk
        return local.narrow(0, 0, 0)
    return local.narrow(0, start - lo, end - start)


@torch_compat.disable_compile  # torch.compiler.disable, importing torch._dynamo at the first call (collectives.py)
def sync(bucket: PartitionedBucket) -> None:
    """Write every parameter's DeepSpeed attributes from ``bucket`` (its state, shard and persistence)."""
    status = status_of(bucket)
    for p, slot in zip(bucket.params, bucket.plan.slots, strict=True):
        d: dict[str, Any] = p.__dict__  # no tensor dispatch: these are plain attributes
        if "ds_id" not in d:
            d["ds_id"] = next(_next_id)
            from zerorun.engine.surface.ds_param_methods import attach  # it imports the bucket's module

            attach(p)  # all_gather, all_gather_coalesced, partition
        if not isinstance(d.get("ds_active_sub_modules"), ActiveSubModules) or \
                d["ds_active_sub_modules"]._bucket is not bucket:
            d["ds_active_sub_modules"] = ActiveSubModules(bucket)
        d["ds_status"] = status
        d["ds_numel"] = slot.numel
        d["ds_shape"] = slot.shape
        d["ds_persist"] = bucket.persistent
        d["ds_tensor"] = _part_of_shard(bucket, slot.offset, slot.numel)
        d["is_external_param"] = False  # zerorun registers no parameter on a module that does not own it


@torch_compat.disable_compile  # plain attribute writes on parameters: dynamo cannot trace them, so not in a graph
def sync_status(bucket: PartitionedBucket) -> None:
    """A state transition: only ``ds_status`` changes (the hot path: every gather and release)."""
    status = status_of(bucket)
    for p in bucket.params:
        p.__dict__["ds_status"] = status


def sync_all(buckets: list[PartitionedBucket]) -> None:
    """After the engine set each bucket's persistence (which is no state transition)."""
    for b in buckets:
        sync(b)


def is_zero_param(param: object) -> bool:
    """DeepSpeed's ``is_zero_param``: the parameter is managed by ZeRO stage 3."""
    return hasattr(param, "ds_id")

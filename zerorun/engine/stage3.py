"""Assemble stage 3 on the shared mechanism: one bucket per module unit, sharded at rest.

The recipe mirrors :func:`zerorun.engine.build.build_parts`, unit by unit so that only
one unit is ever whole on a rank while building: (gather the unit's ``zero.Init``
shards) -> pack the unit's parameters into a bucket per optimizer group -> broadcast
from rank 0 -> keep this rank's chunk (``local``) and its fp32 master -> cast to the
compute dtype -> release the full buffer (unless the bucket is under
``stage3_param_persistence_threshold`` elements: then it stays gathered). Then the
optimizer is pointed at the masters, gradients are reduce-scattered per bucket by the
stage-2 strategy (:class:`PartitionedGradSync`), and the gather coordinator's hooks are
attached.

Units: every module whose own trainable parameters are non-empty (for an MLP block,
each Linear/LayerNorm; for the GPT, each embedding, projection and norm). That is
DeepSpeed's granularity; a unit never spans two modules, so a block of 4 Linears is
4 all-gathers in flight back to back, which the prefetch overlaps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from zerorun.engine.bootstrap import DistContext
from zerorun.engine.build import Parts, optimizer_groups
from zerorun.engine.collectives import Collectives
from zerorun.engine.gather import GatherCoordinator, GatherPolicy, Unit
from zerorun.engine.grad_sync import PartitionedGradSync, ReducePolicy
from zerorun.engine.offload import OffloadPolicy, wrap_masters
from zerorun.engine.offload.params import ParamOffload
from zerorun.engine.param_state import ParamState
from zerorun.engine.partition import PartitionedBucket, bucket_of, unit_bucket
from zerorun.engine.precision import PrecisionPolicy
from zerorun.engine.shard import MasterShards


class PartitionedMasters(MasterShards):
    """Masters over each bucket's ``local`` chunk (the fp32 shard itself with fp32 compute)."""

    def __init__(self, buckets: list[PartitionedBucket], alias: bool, coordinator: GatherCoordinator) -> None:
        super().__init__(buckets, sharded=True, alias=alias)  # type: ignore[arg-type]
        self.coordinator = coordinator
        self.param_offload: ParamOffload | None = None
        for b, m in zip(buckets, self.masters, strict=True):
            b.master = None if alias else m.data

    def owned(self, bucket: Any, flat: torch.Tensor) -> torch.Tensor:
        return bucket.master if bucket.master is not None else bucket.local

    def step(self, optimizer: torch.optim.Optimizer, owned_grads: list[torch.Tensor], multiplier: float,
             coll: Collectives) -> None:
        """One optimizer step over every shard; no all-gather follows (the next forward gathers)."""
        self.set_grads(owned_grads, multiplier)
        optimizer.step()
        self.clear_grads()
        self.publish(coll)

    def publish(self, coll: Collectives) -> None:
        """Write the stepped masters into the shards; gathered buckets re-gather or are released."""
        if not self.alias:
            with torch.no_grad():
                for b, m in zip(self.buckets, self.masters, strict=True):
                    b.set_local(m)
        if self.param_offload is not None:
            self.param_offload.flush()  # nvme: the new shards are on disk before anything reads them
        self.coordinator.after_step()


class Stage3GradSync(PartitionedGradSync):
    """Stage 2's per-bucket reduce-scatter; a bucket whose gradients are all in is released."""

    def __init__(self, buckets: list[PartitionedBucket], coll: Collectives, policy: ReducePolicy,
                 coordinator: GatherCoordinator) -> None:
        super().__init__(buckets, coll, policy)  # type: ignore[arg-type]
        self.coordinator = coordinator

    def _launch(self, bucket_index: int) -> None:
        super()._launch(bucket_index)
        self.coordinator.post_backward_bucket(bucket_index)

    def finish_backward(self) -> None:
        super().finish_backward()
        self.coordinator.end_pass()


@dataclass
class Stage3Parts(Parts):
    coordinator: GatherCoordinator | None = None
    units: list[Unit] | None = None
    param_offload: ParamOffload | None = None  # offload_param: the resting shards in host memory / swap files


def _materialize(params: list[nn.Parameter]) -> None:
    """Gather the ``zero.Init`` shards of ``params`` so they are whole tensors again (one unit at a time)."""
    for prov in {id(b): b for p in params if (b := bucket_of(p)) is not None and b.provisional}.values():
        prov.gather()
        for p in prov.params:
            if bucket_of(p) is prov:
                p.data = p.data.clone()
                delattr(p, "zr_bucket")
        prov.retire()


def _make_bucket(name: str, params: list[nn.Parameter], gi: int, coll: Collectives, precision: PrecisionPolicy,
                 threshold: int) -> PartitionedBucket:
    b = unit_bucket(params, coll, name, gi)
    with torch.no_grad():
        coll.broadcast(b.data, src=0)
    b.seal()
    if not precision.master_is_alias:
        b.master = b.local.float()  # fp32 master taken before the cast; MasterShards clones it once more
    b.cast_(precision.compute_dtype)
    b.persistent = b.plan.numel < threshold
    if not b.persistent:
        b.release()
    return b


def plan_stage3(module: nn.Module, groups: list[list[nn.Parameter]], coll: Collectives,
                precision: PrecisionPolicy, threshold: int
                ) -> tuple[list[PartitionedBucket], list[Unit], list[nn.Module], list[int]]:
    group_of = {id(p): gi for gi, ps in enumerate(groups) for p in ps}
    buckets: list[PartitionedBucket] = []
    group_of_bucket: list[int] = []
    index_of: dict[int, int] = {}
    units: list[Unit] = []
    modules: list[nn.Module] = []
    for name, m in module.named_modules():
        direct = [p for p in m.parameters(recurse=False) if id(p) in group_of]
        if not direct:
            continue
        own = [p for p in direct if id(p) not in index_of]
        _materialize(own)
        for gi in sorted({group_of[id(p)] for p in own}):
            ps = [p for p in own if group_of[id(p)] == gi]
            label = f"{name or '<root>'}" + (f"[group {gi}]" if len(groups) > 1 else "")
            buckets.append(_make_bucket(label, ps, gi, coll, precision, threshold))
            group_of_bucket.append(gi)
            for p in ps:
                index_of[id(p)] = len(buckets) - 1
        units.append(Unit(len(units), name or "<root>", tuple(sorted({index_of[id(p)] for p in direct}))))
        modules.append(m)
    _materialize(list(module.parameters()))  # zero.Init shards of frozen / non-optimized parameters
    return buckets, units, modules, group_of_bucket


def build_stage3_parts(module: nn.Module, optimizer: torch.optim.Optimizer, ctx: DistContext, coll: Collectives,
                       precision: PrecisionPolicy, zero_cfg: Any, reduce: ReducePolicy,
                       offload: OffloadPolicy | None = None, param_offload: OffloadPolicy | None = None
                       ) -> Stage3Parts:
    groups = optimizer_groups(module, optimizer)
    threshold = int(zero_cfg.stage3_param_persistence_threshold)
    buckets, units, modules, group_of_bucket = plan_stage3(module, groups, coll, precision, threshold)
    module.to(precision.compute_dtype)  # buffers and frozen parameters; buckets are already cast
    policy = GatherPolicy(prefetch_numel=int(zero_cfg.stage3_prefetch_bucket_size),
                          max_live=int(zero_cfg.stage3_max_live_parameters),
                          max_reuse=int(zero_cfg.stage3_max_reuse_distance))
    coordinator = GatherCoordinator(buckets, units, policy)
    # an offloaded master, or a master over an offloaded shard, is a separate copy
    offloaded = any(p is not None and p.enabled for p in (offload, param_offload))
    inner = PartitionedMasters(buckets, alias=precision.master_is_alias and not offloaded, coordinator=coordinator)
    if param_offload is not None and param_offload.enabled:
        inner.param_offload = ParamOffload(param_offload, buckets)
    masters = wrap_masters(inner, offload, optimizer)
    masters.bind_optimizer(optimizer, group_of_bucket)
    grad_sync = Stage3GradSync(buckets, coll, reduce, coordinator)
    hooks: list[Any] = []
    for bi, b in enumerate(buckets):
        for si, p in enumerate(b.params):
            hooks.append(p.register_post_accumulate_grad_hook(
                lambda param, bi=bi, si=si: grad_sync.on_grad_ready(bi, si, param)))
    coordinator.attach(module, modules)
    return Stage3Parts(buckets, masters, grad_sync, hooks, coordinator, units,  # type: ignore[arg-type]
                       inner.param_offload)


def is_partitioned(param: torch.Tensor) -> bool:
    b = bucket_of(param)
    return b is not None and b.state is not ParamState.GATHERED

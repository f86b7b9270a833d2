"""Assemble stage 3 on the shared mechanism: one bucket per module unit, sharded at rest.

The recipe mirrors :func:`zerorun.engine.build.build_parts`, unit by unit so that only
one unit is ever whole on a rank while building. A unit that ``zero.Init`` sharded as one
bucket of the same parameters keeps that bucket: its shards are already consistent, so
it only gets its master, its dtype and its place (nothing is communicated). Otherwise:
(gather the unit's ``zero.Init`` shards) -> move the unit's parameters to the engine's device (the whole model is never
moved: :mod:`zerorun.engine.placement`) -> pack them into a bucket per optimizer group
(and one for the parameters the optimizer does not step: frozen, sharded too) -> broadcast
from rank 0 -> keep this rank's chunk (``local``) and its fp32 master -> cast to the
compute dtype -> release the full buffer (unless the bucket is under
``stage3_param_persistence_threshold`` elements: then it stays gathered). Then the
optimizer is pointed at the masters, gradients are reduce-scattered per bucket by the
stage-2 strategy (:class:`~zerorun.engine.stage3_grads.Stage3GradSync`, small units coalesced), and the gather coordinator's hooks are
attached.

Units: every module whose own parameters are non-empty (for an MLP block, each
Linear/LayerNorm; for the GPT, each embedding, projection and norm), and the root. That is
DeepSpeed's granularity; a unit never spans two modules, so a block of 4 Linears is
4 all-gathers in flight back to back, which the prefetch overlaps.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from zerorun.engine.bootstrap import DistContext
from zerorun.engine.build import Parts, optimizer_groups
from zerorun.engine.collectives import Collectives
from zerorun.engine.gather import GatherCoordinator, GatherPolicy, Unit
from zerorun.engine.grad_sync import ReducePolicy
from zerorun.engine.offload import OffloadPolicy, wrap_masters
from zerorun.engine.offload.params import ParamOffload
from zerorun.engine.param_state import ParamState
from zerorun.engine.partition import PartitionedBucket, bucket_of, unit_bucket
from zerorun.engine.placement import to_device
from zerorun.engine.precision import PrecisionPolicy
from zerorun.engine.shard import MasterShards
from zerorun.engine.stage3_grads import COALESCE_LIMIT, Stage3GradSync


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

    # step() is MasterShards' whole step; no all-gather follows it here (the next forward gathers)
    def publish(self, coll: Collectives) -> None:
        """Write the stepped masters into the shards; gathered buckets re-gather or are released."""
        if not self.alias:
            with torch.no_grad():
                for b, m in zip(self.buckets, self.masters, strict=True):
                    b.set_local(m)
        if self.param_offload is not None:
            self.param_offload.flush()  # nvme: the new shards are on disk before anything reads them
        self.coordinator.after_step()


@dataclass
class Stage3Parts(Parts):
    coordinator: GatherCoordinator | None = None
    units: list[Unit] | None = None
    param_offload: ParamOffload | None = None  # offload_param: the resting shards in host memory / swap files
    frozen: list[PartitionedBucket] = field(default_factory=list)  # sharded parameters the optimizer does not step


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
                 threshold: int, device: torch.device, frozen: bool) -> PartitionedBucket:
    b = unit_bucket(params, coll, name, gi, device=device)
    b.frozen = frozen
    with torch.no_grad():
        coll.broadcast(b.data, src=0)
    b.seal()
    return _finish_bucket(b, precision, threshold)


def _adopt(params: list[nn.Parameter], name: str, gi: int, coll: Collectives, precision: PrecisionPolicy,
           threshold: int, frozen: bool) -> PartitionedBucket | None:
    """``zero.Init``'s bucket of exactly ``params``, taken over as the engine's (None: there is none).

    Its shards already hold rank 0's values on every rank, laid out as :func:`unit_bucket`
    lays out the same parameters, so set-up moves nothing for this unit: no gather, no
    second broadcast (set-up traffic is ``zero.Init``'s one broadcast of each module).
    """
    prov = bucket_of(params[0])
    if (prov is None or not prov.provisional or prov.state is not ParamState.SHARDED
            or len(prov.params) != len(params) or {id(p) for p in prov.params} != {id(p) for p in params}):
        return None
    prov.provisional, prov.coll, prov.name, prov.frozen = False, coll, name, frozen
    prov.plan = replace(prov.plan, group_index=gi)
    return _finish_bucket(prov, precision, threshold)


def _finish_bucket(b: PartitionedBucket, precision: PrecisionPolicy, threshold: int) -> PartitionedBucket:
    """fp32 master of the shard, then the compute dtype; sharded at rest unless under the persistence threshold."""
    if not precision.master_is_alias and not b.frozen:
        b.master = b.local.float()  # fp32 master taken before the cast; MasterShards clones it once more
    b.cast_(precision.compute_dtype)
    b.persistent = b.plan.numel < threshold
    if b.persistent:
        b.gather()
    elif b.state is ParamState.GATHERED:
        b.release()
    return b


@dataclass
class Stage3Plan:
    buckets: list[PartitionedBucket]  # trainable: one per unit and optimizer group, stepped by the optimizer
    frozen: list[PartitionedBucket]  # parameters the optimizer does not step, one per unit
    units: list[Unit]  # bucket indices count the trainable buckets first, then the frozen ones
    modules: list[nn.Module]
    group_of_bucket: list[int]


def plan_stage3(module: nn.Module, groups: list[list[nn.Parameter]], coll: Collectives,
                precision: PrecisionPolicy, threshold: int, device: torch.device) -> Stage3Plan:
    """Shard ``module`` unit by unit: only one unit is ever whole (on ``device``) while this runs.

    The root module is always a unit (possibly with no buckets of its own), so a parameter
    used directly by the root's forward has a unit to be filed under. A module flagged
    ``_z3_leaf`` (``deepspeed.utils.set_z3_leaf_modules``) is one unit with its whole subtree.
    """
    group_of = {id(p): gi for gi, ps in enumerate(groups) for p in ps}
    plan = Stage3Plan([], [], [], [], [])
    bucket_of_param: dict[int, PartitionedBucket] = {}
    unit_members: list[list[PartitionedBucket]] = []
    inside_leaf: set[int] = set()  # descendants of a leaf module belong to the leaf's unit
    for name, m in module.named_modules():
        if id(m) in inside_leaf:
            continue
        leaf = bool(getattr(m, "_z3_leaf", False))  # set_z3_leaf_modules: the whole subtree is one unit
        if leaf:
            inside_leaf.update(id(c) for c in m.modules() if c is not m)
        direct = list(m.parameters(recurse=leaf))
        if not direct and m is not module:
            continue
        own = [p for p in direct if id(p) not in bucket_of_param]
        for gi in sorted({group_of.get(id(p), -1) for p in own}):  # -1: not stepped by the optimizer
            ps = [p for p in own if group_of.get(id(p), -1) == gi]
            label = (name or "<root>") + ("[frozen]" if gi < 0 else f"[group {gi}]" if len(groups) > 1 else "")
            b = _adopt(ps, label, max(gi, 0), coll, precision, threshold, frozen=gi < 0)
            if b is None:
                _materialize(ps)
                b = _make_bucket(label, ps, max(gi, 0), coll, precision, threshold, device, frozen=gi < 0)
            if gi < 0:
                plan.frozen.append(b)
            else:
                plan.buckets.append(b)
                plan.group_of_bucket.append(gi)
            bucket_of_param.update((id(p), b) for p in ps)
        unit_members.append(list({id(b): b for b in (bucket_of_param[id(p)] for p in direct)}.values()))
        plan.modules.append(m)
        plan.units.append(Unit(len(plan.units), name or "<root>", ()))
    index = {id(b): i for i, b in enumerate(plan.buckets + plan.frozen)}
    plan.units = [Unit(u.index, u.name, tuple(sorted(index[id(b)] for b in members)))
                  for u, members in zip(plan.units, unit_members, strict=True)]
    _move_buffers(module, device)
    return plan


def _move_buffers(module: nn.Module, device: torch.device) -> None:
    """Every module's buffers to ``device``, one module at a time (the parameters are already there)."""
    for m in module.modules():
        names = [k for k, v in m._buffers.items() if v is not None]
        if names:
            for k, t in zip(names, to_device([m._buffers[k] for k in names], device), strict=True):
                m._buffers[k] = t


def build_stage3_parts(module: nn.Module, optimizer: torch.optim.Optimizer, ctx: DistContext, coll: Collectives,
                       precision: PrecisionPolicy, zero_cfg: Any, reduce: ReducePolicy,
                       offload: OffloadPolicy | None = None, param_offload: OffloadPolicy | None = None
                       ) -> Stage3Parts:
    groups = optimizer_groups(module, optimizer)
    threshold = int(zero_cfg.stage3_param_persistence_threshold)
    plan = plan_stage3(module, groups, coll, precision, threshold, ctx.device)
    buckets, units, group_of_bucket = plan.buckets, plan.units, plan.group_of_bucket
    # same-host gloo ranks gather and reduce through shared memory (a slot holds the largest unit)
    coll.open_shared_lane(max((b.plan.padded_numel for b in buckets + plan.frozen), default=1))
    # every parameter is a cast bucket; buffers keep their dtype (see build.cast_parameters)
    policy = GatherPolicy(prefetch_numel=int(zero_cfg.stage3_prefetch_bucket_size),
                          max_live=int(zero_cfg.stage3_max_live_parameters),
                          max_reuse=int(zero_cfg.stage3_max_reuse_distance))
    coordinator = GatherCoordinator(buckets + plan.frozen, units, policy)
    # an offloaded master, or a master over an offloaded shard, is a separate copy
    offloaded = any(p is not None and p.enabled for p in (offload, param_offload))
    inner = PartitionedMasters(buckets, alias=precision.master_is_alias and not offloaded, coordinator=coordinator)
    if param_offload is not None and param_offload.enabled:
        inner.param_offload = ParamOffload(param_offload, buckets)
    masters = wrap_masters(inner, offload, optimizer)
    masters.bind_optimizer(optimizer, group_of_bucket)
    coalesce = min(int(zero_cfg.reduce_bucket_size), COALESCE_LIMIT)  # units under this share reduce-scatters
    grad_sync = Stage3GradSync(buckets, coll, reduce, coordinator, coalesce)
    hooks: list[Any] = []
    for bi, b in enumerate(buckets):
        for si, p in enumerate(b.params):
            hooks.append(p.register_post_accumulate_grad_hook(
                lambda param, bi=bi, si=si: grad_sync.on_grad_ready(bi, si, param)))
    coordinator.attach(module, plan.modules)
    return Stage3Parts(buckets, masters, grad_sync, hooks, coordinator, units,  # type: ignore[arg-type]
                       inner.param_offload, plan.frozen)


def is_partitioned(param: torch.Tensor) -> bool:
    b = bucket_of(param)
    return b is not None and b.state is not ParamState.GATHERED


def gathered_frozen(parts: Any, modifier_rank: int | None = None) -> contextlib.AbstractContextManager[None]:
    """Gather stage 3's frozen buckets on every rank for a ``with`` (a no-op for other stages).

    The checkpoint writes and reads frozen parameters with the buffers, as whole tensors.
    """
    from zerorun.engine.gathered import GatheredParameters

    return GatheredParameters([p for b in getattr(parts, "frozen", ()) for p in b.params], modifier_rank)


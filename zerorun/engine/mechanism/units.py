"""Stage 3's layout: one bucket per module unit, sharded at rest, built unit by unit.

Only one unit is ever whole on a rank while this runs. A unit that ``zero.Init`` sharded as
one bucket of the same parameters keeps that bucket: its shards are already consistent, so
it only gets its master, its dtype and its place (nothing is communicated). Otherwise:
(gather the unit's ``zero.Init`` shards) -> move the unit's parameters to the engine's
device (the whole model is never moved: :mod:`zerorun.engine.mechanism.placement`) -> pack them into a
bucket per optimizer group (and one for the parameters the optimizer does not step: frozen,
sharded too) -> broadcast from rank 0 -> keep this rank's chunk (``local``) and its fp32
master -> cast to the compute dtype -> release the full buffer (unless the bucket is under
``stage3_param_persistence_threshold`` elements: then it stays gathered). The rest of the
recipe is :func:`zerorun.engine.build.build_parts`'s, shared with every stage.

Units: every module whose own parameters are non-empty (for an MLP block, each
Linear/LayerNorm; for the GPT, each embedding, projection and norm), and the root. That is
DeepSpeed's granularity; a unit never spans two modules, so a block of 4 Linears is
4 all-gathers in flight back to back, which the prefetch overlaps.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from zerorun import torch_compat
from zerorun.engine.comm.collectives import Collectives
from zerorun.engine.mechanism.gather import Unit
from zerorun.engine.mechanism.param_state import ParamState
from zerorun.engine.mechanism.partition import PartitionedBucket, bucket_of, unit_bucket
from zerorun.engine.mechanism.placement import to_device
from zerorun.engine.numerics.precision import PrecisionPolicy


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
                 threshold: int, device: torch.device, frozen: bool, init: Collectives) -> PartitionedBucket:
    b = unit_bucket(params, coll, name, gi, device=device)
    b.frozen = frozen
    with torch.no_grad():
        init.broadcast(b.data, src=0)  # the world's rank 0, also when the bucket is sharded over a MiCS group
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
            or prov.coll.world_size != coll.world_size  # zero.Init sharded over the world, the engine over MiCS's
            or len(prov.params) != len(params) or {id(p) for p in prov.params} != {id(p) for p in params}):
        return None
    prov.provisional, prov.coll, prov.name, prov.frozen = False, coll, name, frozen
    prov.plan = replace(prov.plan, group_index=gi)
    return _finish_bucket(prov, precision, threshold)


def _finish_bucket(b: PartitionedBucket, precision: PrecisionPolicy, threshold: int) -> PartitionedBucket:
    """fp32 master of the shard, then the compute dtype; sharded at rest unless under the persistence threshold."""
    if not precision.master_is_alias and not b.frozen:
        b.master = b.local.to(precision.master_dtype)  # taken before the cast; MasterShards clones it once more
    b.cast_(precision.compute_dtype)
    b.persistent = b.plan.numel < threshold
    if b.persistent:
        b.gather()
    elif b.state is ParamState.GATHERED:
        b.release()
    return b


@dataclass
class UnitPlan:
    buckets: list[PartitionedBucket]  # trainable: one per unit and optimizer group, stepped by the optimizer
    frozen: list[PartitionedBucket]  # parameters the optimizer does not step, one per unit
    units: list[Unit]  # bucket indices count the trainable buckets first, then the frozen ones
    modules: list[nn.Module]
    group_of_bucket: list[int]


def plan_units(module: nn.Module, groups: list[list[nn.Parameter]], coll: Collectives,
                precision: PrecisionPolicy, threshold: int, device: torch.device,
                init: Collectives | None = None) -> UnitPlan:
    """Shard ``module`` unit by unit: only one unit is ever whole (on ``device``) while this runs.

    The root module is always a unit (possibly with no buckets of its own), so a parameter
    used directly by the root's forward has a unit to be filed under. A module flagged
    ``_z3_leaf`` (``deepspeed.utils.set_z3_leaf_modules``) is one unit with its whole subtree.
    """
    group_of = {id(p): gi for gi, ps in enumerate(groups) for p in ps}
    plan = UnitPlan([], [], [], [], [])
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
                b = _make_bucket(label, ps, max(gi, 0), coll, precision, threshold, device, frozen=gi < 0,
                                 init=init or coll)
            if gi < 0:
                plan.frozen.append(b)
            else:
                plan.buckets.append(b)
                plan.group_of_bucket.append(gi)
            bucket_of_param.update((id(p), b) for p in ps)
        unit_members.append(list({id(b): b for b in (bucket_of_param[id(p)] for p in direct)}.values()))
        plan.modules.append(m)
        plan.units.append(Unit(len(plan.units), name or "<root>", (), leaf))
    index = {id(b): i for i, b in enumerate(plan.buckets + plan.frozen)}
    plan.units = [Unit(u.index, u.name, tuple(sorted(index[id(b)] for b in members)), u.leaf)
                  for u, members in zip(plan.units, unit_members, strict=True)]
    _move_buffers(module, device)
    return plan


def _move_buffers(module: nn.Module, device: torch.device) -> None:
    """Every module's buffers to ``device``, one module at a time (the parameters are already there)."""
    for m in module.modules():
        names = [k for k, v in torch_compat.own_buffers(m).items() if v is not None]
        if names:
            for k, t in zip(names, to_device([torch_compat.own_buffers(m)[k] for k in names], device), strict=True):
                torch_compat.set_own_buffer(m, k, t)

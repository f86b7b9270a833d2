"""Assemble an engine's parts from the model, the optimizer, the config and the process group.

One recipe for every stage; the policy answers its questions:

1. **layout**: pack the trainable parameters into buckets per optimizer group - in layout
   order up to ``reduce_bucket_size`` (parameters replicated), or one bucket per module unit,
   sharded at rest, with the parameters the optimizer does not step in frozen buckets
   (parameters sharded: :mod:`zerorun.engine.mechanism.units`);
2. every rank starts from rank 0's weights (the unit layout broadcasts unit by unit);
3. **masters**: fp32 copies of the owned chunks (taken before the cast to the compute
   dtype), offloaded when the config says so; the optimizer is pointed at them;
4. **gradients**: the reducer the policy picks, fed by a post-accumulate hook per parameter;
5. **gather schedule** (parameters sharded): the coordinator's module hooks gather each
   unit before its forward and backward and release it after.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from zerorun.engine.comm.bootstrap import DistContext
from zerorun.engine.comm.collectives import Collectives
from zerorun.engine.comm.groups import Groups
from zerorun.engine.errors import EngineError
from zerorun.engine.flat_setup import broadcast_frozen, move_the_rest, streamed_buckets, streamed_masters
from zerorun.engine.mechanism import grad_landing, quantized_units
from zerorun.engine.mechanism.buckets import FlatBucket
from zerorun.engine.mechanism.gather import GatherCoordinator, GatherPolicy, Unit
from zerorun.engine.mechanism.grad_sync import GradSyncBase, ReducePolicy
from zerorun.engine.mechanism.leaves import flag_leaves
from zerorun.engine.mechanism.masters import PartitionedMasters
from zerorun.engine.mechanism.partition import PartitionedBucket
from zerorun.engine.mechanism.routes import GatherRoutes
from zerorun.engine.mechanism.sharded_grads import COALESCE_LIMIT, ShardedGradSync
from zerorun.engine.mechanism.units import plan_units
from zerorun.engine.numerics.compensated import Compensation
from zerorun.engine.numerics.precision import PrecisionPolicy
from zerorun.engine.offload import OffloadPolicy, wrap_masters
from zerorun.engine.offload.host import device_buckets
from zerorun.engine.offload.host_grads import grad_home
from zerorun.engine.offload.params import ParamOffload
from zerorun.engine.policy import StagePolicy
from zerorun.engine.training.optimizer_state import make_adam_state

if TYPE_CHECKING:
    from zerorun.config.schema_zero import ZeroConfig
    from zerorun.engine.offload import Masters


@dataclass
class Parts:
    """What the engine sequences. With parameters replicated, ``frozen`` and ``units`` are empty and
    ``coordinator`` is None."""

    buckets: list[FlatBucket]  # FlatBucket, or PartitionedBucket when parameters are sharded: stepped by the optimizer
    masters: Masters  # MasterShards, or an offload wrapper with its interface
    grad_sync: GradSyncBase
    hooks: list[RemovableHandle | grad_landing.Landed]  # the gradient hooks, the landed Linears' forwards
    frozen: list[PartitionedBucket] = field(default_factory=list)  # sharded parameters the optimizer does not step
    coordinator: GatherCoordinator | None = None  # gathers and releases sharded parameters unit by unit
    units: list[Unit] = field(default_factory=list)
    param_offload: ParamOffload | None = None  # offload_param: the resting shards in host memory / swap files
    groups: Groups | None = None  # the shard group and hpZ's / MiCS's others (None: the world alone)


@dataclass
class Layout:
    """The buckets a build packs (step 1 of the recipe), in the order the optimizer groups and the hooks use."""

    buckets: list[FlatBucket]  # PartitionedBucket (a FlatBucket) in the unit layout
    group_of_bucket: list[int]
    frozen: list[PartitionedBucket] = field(default_factory=list)
    units: list[Unit] = field(default_factory=list)
    modules: list[nn.Module] = field(default_factory=list)

    def largest(self) -> int:
        return max((b.plan.padded_numel for b in [*self.buckets, *self.frozen]), default=1)


def optimizer_groups(module: nn.Module, optimizer: torch.optim.Optimizer) -> list[list[nn.Parameter]]:
    """The trainable parameters of each optimizer group; every one must belong to ``module``."""
    owned = {id(p) for p in module.parameters()}
    seen: set[int] = set()
    groups: list[list[nn.Parameter]] = []
    for gi, group in enumerate(optimizer.param_groups):
        params = []
        for p in group["params"]:
            if id(p) not in owned:
                raise EngineError(f"optimizer group {gi} holds a parameter that is not in the model",
                                  "build the optimizer from model.parameters() (or pass model_parameters=)")
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
        groups.append(params)
    if not seen:
        raise EngineError("the optimizer has no trainable parameters",
                          "pass model_parameters=model.parameters() or an optimizer built from them")
    return groups


def cast_parameters(module: nn.Module, dtype: torch.dtype) -> None:
    """Floating-point parameters to the compute dtype; buffers keep the dtype they have.

    DeepSpeed 0.19.8's rule at every stage and precision (engine._cast_module_mixed_precision):
    parameters are cast, buffers are not (a Llama ``inv_freq`` stays fp32) unless its
    ``data_types.buffer_dtype`` says otherwise, which zerorun does not accept.
    """
    for p in module.parameters():
        if p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)


def _unit_masters(layout: Layout, coordinator: GatherCoordinator, precision: PrecisionPolicy,
                  offload: OffloadPolicy | None, param_offload: OffloadPolicy | None,
                  optimizer: torch.optim.Optimizer) -> tuple[Masters, ParamOffload | None]:
    """Masters over the resting shards (the unit layout already cast them); a resting shard may be offloaded."""
    offloaded = any(p is not None and p.enabled for p in (offload, param_offload))  # then a separate copy
    inner = PartitionedMasters(layout.buckets, alias=precision.master_is_alias and not offloaded,
                               coordinator=coordinator, dtype=precision.master_dtype)
    if param_offload is not None and param_offload.enabled:
        inner.param_offload = ParamOffload(param_offload, layout.buckets)
    return wrap_masters(inner, offload, optimizer), inner.param_offload


def grad_hooks(buckets: list[FlatBucket], grad_sync: GradSyncBase) -> list[RemovableHandle]:
    """One post-accumulate hook per trainable parameter: its gradient is complete for this backward.

    The hooks hold the reducer weakly: autograd keeps a parameter's hooks in C++, where Python's
    collector cannot see them, so a strong reference there (reducer -> engine -> parameters) kept
    every dropped engine and its device buffers alive for the life of the process (an H200 run of
    the GPU check held 1.6-2 GiB more after each engine it had built and dropped)."""
    sync = weakref.ref(grad_sync)

    def ready(param: torch.Tensor, bi: int, si: int) -> None:
        reducer = sync()
        if reducer is not None:  # None: the engine is gone; the parameter outlives it
            reducer.on_grad_ready(bi, si, param)

    return [p.register_post_accumulate_grad_hook(functools.partial(ready, bi=bi, si=si))
            for bi, b in enumerate(buckets) for si, p in enumerate(b.params)]


def build_parts(module: nn.Module, optimizer: torch.optim.Optimizer, ctx: DistContext, coll: Collectives,
                policy: StagePolicy, precision: PrecisionPolicy, zero_cfg: ZeroConfig, reduce: ReducePolicy,
                offload: OffloadPolicy | None = None, param_offload: OffloadPolicy | None = None,
                process_groups: Groups | None = None) -> Parts:
    """``coll``: the world. ``process_groups`` (sharded parameters): the shard group the parameters,
    gradients and masters are sharded over, and hpZ's / MiCS's other groups (default: the world alone)."""
    pg = process_groups or Groups.plain(coll)
    world, coll = coll, pg.shard
    groups = optimizer_groups(module, optimizer)
    bucket_size = int(zero_cfg.reduce_bucket_size)
    master_data: list[torch.Tensor] = []
    if policy.shard_parameters:
        layout = unit_layout(module, groups, coll, precision, zero_cfg, ctx.device, init=world)
        route_gathers([*layout.buckets, *layout.frozen], pg)
    else:  # bucket by bucket onto the device, masters taken on the way (flat_setup)
        buckets, group_of, master_data, alias = streamed_buckets(groups, coll, ctx.device, bucket_size, policy,
                                                                 precision, offload)
        move_the_rest(module, ctx.device)
        cast_parameters(module, precision.compute_dtype)  # the frozen ones; bucket views are already cast
        broadcast_frozen(module, buckets, coll)
        layout = Layout(list(buckets), group_of)
    for group in pg.by_name().values():  # same-host gloo ranks: shared memory, a slot per bucket
        group.open_shared_lane(layout.largest())
    coordinator = None
    param_store = None
    # offload: the gradient sums live in host memory (Twin-Flow's device buckets keep theirs on the device)
    home = grad_home(offload, device_buckets(len(layout.buckets), offload.ratio) if offload else ())
    if policy.shard_parameters:
        coordinator = GatherCoordinator([*layout.buckets, *layout.frozen], layout.units,
                                        GatherPolicy.from_config(zero_cfg))
        masters, param_store = _unit_masters(layout, coordinator, precision, offload, param_offload, optimizer)
        # units under this share reduce-scatters
        grad_sync = policy.grad_sync(layout.buckets, coll, reduce, coordinator, min(bucket_size, COALESCE_LIMIT),
                                     replica=pg.replica, home=home)
    else:
        masters = streamed_masters(layout.buckets, master_data, alias, policy, coll, offload, optimizer)
        # the staging holds at most what DeepSpeed's bucket(s) would: reduce_bucket_size elements, twice
        # with overlap_comm; the layout's smaller buckets then let backward run ahead of the reductions
        staging = bucket_size * (2 if reduce.overlap_comm else 1)
        grad_sync = policy.grad_sync(layout.buckets, coll, replace(reduce, staging_numel=staging), home=home)
    masters.bind_optimizer(optimizer, layout.group_of_bucket)
    if not (offload and offload.nvme_path):  # NVMe: the swapper owns the state's residency
        make_adam_state(optimizer)  # before training, not between the first step's temporaries
    if precision.compensation != "none":
        masters.set_compensation(Compensation(precision.compensation, coll.rank, ctx.device))
    hooks: list[RemovableHandle | grad_landing.Landed] = [*grad_hooks(layout.buckets, grad_sync)]
    if isinstance(grad_sync, ShardedGradSync) and grad_landing.enabled(ctx.device):
        hooks.append(grad_landing.install(module, grad_sync, {id(p) for b in layout.buckets for p in b.params}))
    if coordinator is not None:
        coordinator.attach(module, layout.modules)
    return Parts(layout.buckets, masters, grad_sync, hooks, layout.frozen, coordinator, layout.units, param_store,
                 groups=pg)


def unit_layout(module: nn.Module, groups: list[list[nn.Parameter]], coll: Collectives, precision: PrecisionPolicy,
                zero_cfg: ZeroConfig, device: torch.device, init: Collectives | None = None) -> Layout:
    """Stage 3's buckets, unit by unit (:func:`zerorun.engine.mechanism.units.plan_units`), sharded over ``coll``;
    ``init`` (default ``coll``): the group rank 0's weights are broadcast over."""
    flag_leaves(module, zero_cfg)  # zero_optimization.leaf_module, stage3_module_granularity_threshold
    plan = plan_units(module, groups, coll, precision, int(zero_cfg.stage3_param_persistence_threshold), device,
                      init=init)
    quantized_units.apply(plan.buckets, plan.frozen, bool(zero_cfg.zero_quantized_weights),
                          bool(zero_cfg.zero_quantized_nontrainable_weights))  # ZeRO++: qwZ, frozen shards as int8
    return Layout(plan.buckets, plan.group_of_bucket, plan.frozen, plan.units, plan.modules)


def route_gathers(buckets: list[PartitionedBucket], pg: Groups) -> None:
    """hpZ's secondary group and MiCS's two hops, on every bucket (persistent ones are never released: no copy)."""
    hierarchy = (pg.inter, pg.intra) if pg.inter is not None and pg.intra is not None else None
    world = pg.world if pg.shard is not pg.world else None
    for b in buckets:
        b.routes = GatherRoutes(secondary=pg.secondary, hierarchy=hierarchy, world=world)

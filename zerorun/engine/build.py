"""Assemble an engine's parts from the model, the optimizer, the config and the process group.

The order matters and is the whole recipe: pack trainable parameters into buckets
(per optimizer group) -> make every rank start from rank 0's weights -> take fp32
masters of the owned chunks -> cast the compute copies -> point the optimizer at the
masters -> pick the gradient-sync strategy -> register gradient hooks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from zerorun.engine.bootstrap import DistContext
from zerorun.engine.buckets import ALIGN_ELEMENTS, FlatBucket, layout_numel, plan_buckets
from zerorun.engine.collectives import Collectives
from zerorun.engine.errors import EngineError
from zerorun.engine.grad_sync import GradSyncBase, ReducePolicy
from zerorun.engine.offload import OffloadPolicy, wrap_masters
from zerorun.engine.precision import PrecisionPolicy
from zerorun.engine.shard import MasterShards
from zerorun.engine.stages import StagePolicy


@dataclass
class Parts:
    buckets: list[FlatBucket]
    masters: MasterShards
    grad_sync: GradSyncBase
    hooks: list[Any]


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


def build_parts(module: nn.Module, optimizer: torch.optim.Optimizer, ctx: DistContext, coll: Collectives,
                stage: StagePolicy, precision: PrecisionPolicy, bucket_size: int,
                reduce: ReducePolicy, offload: OffloadPolicy | None = None) -> Parts:
    groups = optimizer_groups(module, optimizer)
    buckets: list[FlatBucket] = []
    group_of_bucket: list[int] = []
    for gi, params in enumerate(groups):
        size = layout_numel(bucket_size, coll.native_reduce_scatter)
        for plan in plan_buckets([p.shape for p in params], size, ctx.world_size, gi, align=ALIGN_ELEMENTS):
            buckets.append(FlatBucket(plan, [params[i] for i in plan.param_indices], ctx.world_size, ctx.rank))
            group_of_bucket.append(gi)
    coll.open_shared_lane(max(b.plan.padded_numel for b in buckets))  # same-host gloo ranks: shared memory
    with torch.no_grad():
        for b in buckets:
            coll.broadcast(b.data, src=0)
    offloaded = offload is not None and offload.enabled  # an offloaded master is a separate (host) copy
    masters = wrap_masters(MasterShards(buckets, sharded=stage.shard_optimizer,
                                        alias=precision.master_is_alias and not offloaded,
                                        overlap_gather=coll.device.type == "cuda"), offload, optimizer)
    for b in buckets:
        b.cast_(precision.compute_dtype)
    masters.rebind()
    cast_parameters(module, precision.compute_dtype)  # the frozen ones; bucket views are already cast
    masters.bind_optimizer(optimizer, group_of_bucket)
    # stage 2 stages at most what DeepSpeed's bucket(s) would hold: reduce_bucket_size elements, twice with
    # overlap_comm; the layout's smaller buckets then let backward run ahead of the reductions
    staging = bucket_size * (2 if reduce.overlap_comm else 1)
    grad_sync = stage.grad_sync(buckets, coll, replace(reduce, staging_numel=staging))
    hooks = []
    for bi, b in enumerate(buckets):
        for si, p in enumerate(b.params):
            hooks.append(p.register_post_accumulate_grad_hook(
                lambda param, bi=bi, si=si: grad_sync.on_grad_ready(bi, si, param)))
    return Parts(buckets, masters, grad_sync, hooks)

"""Stages 0-2's set-up, bucket by bucket: the model is never whole on the device in fp32.

Where DeepSpeed casts the model and then moves it, and 9b6a4ae moved it whole in fp32 and then
copied every bucket (a model sized for its steady state, 13-20B with ``offload_optimizer`` on
80 GB, failed at set-up), each bucket of the layout now goes, in layout order:

1. its fp32 flat buffer is made on the device and filled from the parameters where they are
   (the host, usually); the parameters become its views, which frees their host storage;
2. it is broadcast from rank 0 (every rank starts from rank 0's weights);
3. its master is taken: the owned chunk itself (fp32 compute), an fp32 copy on the device, or,
   with ``offload_optimizer``, a host copy (the masters never get a device allocation);
4. it is cast to the compute dtype and its parameters re-bound, which frees the fp32 buffer.

So the device holds the buckets done (compute dtype) + one bucket in fp32 + its cast:
at most the model in the compute dtype + one fp32 bucket, plus the masters that live on the
device anyway. What no bucket holds (frozen parameters, buffers) then moves module by module,
each move through :func:`~zerorun.engine.mechanism.placement.to_device` (countable), and the
frozen parameters are broadcast from rank 0 as the buckets were (:func:`broadcast_frozen`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from zerorun import torch_compat
from zerorun.engine.comm.collectives import Collectives
from zerorun.engine.mechanism.buckets import ALIGN_ELEMENTS, FlatBucket, layout_numel, plan_buckets
from zerorun.engine.mechanism.masters import MasterShards
from zerorun.engine.mechanism.placement import to_device
from zerorun.engine.numerics.precision import PrecisionPolicy
from zerorun.engine.offload import OffloadPolicy, copy_checks, wrap_masters
from zerorun.engine.policy import StagePolicy

if TYPE_CHECKING:
    from zerorun.engine.offload import Masters


def streamed_buckets(groups: list[list[nn.Parameter]], coll: Collectives, device: torch.device, bucket_size: int,
                     policy: StagePolicy, precision: PrecisionPolicy, offload: OffloadPolicy | None
                     ) -> tuple[list[FlatBucket], list[int], list[torch.Tensor], bool]:
    """The buckets (cast, on ``device``), the group of each, their masters' data, and whether the masters alias."""
    offloaded = offload is not None and offload.enabled
    alias = precision.master_is_alias and not offloaded
    # nvme writes the masters to files and frees them: pinned there, torch's host cache would keep them
    home = copy_checks.transfers(offloaded and offload.device == "cpu" and offload.pin_memory) if offloaded else None
    size = layout_numel(bucket_size, coll.native_reduce_scatter)
    buckets: list[FlatBucket] = []
    group_of: list[int] = []
    masters: list[torch.Tensor] = []
    for gi, params in enumerate(groups):
        for plan in plan_buckets([p.shape for p in params], size, coll.world_size, gi, align=ALIGN_ELEMENTS):
            b = FlatBucket(plan, [params[i] for i in plan.param_indices], coll.world_size, coll.rank, device=device)
            with torch.no_grad():
                coll.broadcast(b.data, src=0)
                owned = b.shard(b.data) if policy.shard_optimizer else b.data
                if alias:
                    masters.append(owned)
                elif home is not None:
                    masters.append(home.host_copy(owned, precision.master_dtype))
                else:
                    masters.append(owned.detach().clone().to(precision.master_dtype))
                del owned  # else it keeps this bucket's fp32 buffer alive while the next one is made
            b.cast_(precision.compute_dtype)
            buckets.append(b)
            group_of.append(gi)
    return buckets, group_of, masters, alias


def streamed_masters(buckets: list[FlatBucket], masters: list[torch.Tensor], alias: bool, policy: StagePolicy,
                     coll: Collectives, offload: OffloadPolicy | None, optimizer: torch.optim.Optimizer) -> Masters:
    inner = MasterShards(buckets, sharded=policy.shard_optimizer, alias=alias,
                         overlap_gather=coll.device.type == "cuda", masters=masters)
    out = wrap_masters(inner, offload, optimizer)
    out.rebind()
    return out


def broadcast_frozen(module: nn.Module, buckets: list[FlatBucket], coll: Collectives) -> None:
    """Rank 0's values for the parameters no bucket holds (the frozen ones), on every rank.

    DeepSpeed's ``initialize`` broadcasts every parameter, frozen ones included, so a frozen layer each
    rank initialized differently (another seed, a random projection) is one model everywhere; the
    buckets are broadcast as they are made. Buffers are not broadcast, as in DeepSpeed."""
    held = {id(p) for b in buckets for p in b.params}
    with torch.no_grad():
        for p in module.parameters():  # tied parameters once
            if id(p) in held:
                continue
            data = p.data.contiguous()  # itself when contiguous
            coll.broadcast(data.reshape(-1).view(torch.uint8), src=0)  # any dtype and shape, as raw bytes
            if data is not p.data:
                p.data.copy_(data)


def move_the_rest(module: nn.Module, device: torch.device) -> None:
    """Parameters no bucket holds (frozen ones) and buffers to ``device``, one module at a time."""
    for m in module.modules():
        params = [k for k, p in torch_compat.own_parameters(m).items() if p is not None and p.device != device]
        for k, t in zip(params, to_device([torch_compat.own_parameters(m)[k].data for k in params], device), strict=True):
            torch_compat.own_parameters(m)[k].data = t
        names = [k for k, v in torch_compat.own_buffers(m).items() if v is not None and v.device != device]
        for k, t in zip(names, to_device([torch_compat.own_buffers(m)[k] for k in names], device), strict=True):
            torch_compat.set_own_buffer(m, k, t)

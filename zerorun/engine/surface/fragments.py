"""One parameter's piece of the engine's flat state: its fp32 master, gradient and optimizer state.

DeepSpeed's ``safe_get_full_*`` / ``safe_set_full_*`` (``deepspeed.utils``) read and
write these per parameter. Each rank owns a contiguous chunk of every bucket, so a
parameter's *fragment* on this rank is the part of its slot inside that chunk (possibly
empty). A full value is assembled as DeepSpeed does it: every rank writes its fragment
into a zero buffer of the parameter's size and one all-reduce sums them; every rank
must call it. Setting a full value writes only this rank's fragment.

Gradients are the reduced ones the next optimizer step would use, so they are valid
after a ``backward`` on an accumulation boundary and before ``step`` (as in DeepSpeed),
and under fp16 they still carry the loss scale (as DeepSpeed's do).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from zerorun.engine.views import Shards

_ENGINE_ATTR = "_zerorun_engine"  # a weak reference: a parameter never keeps a finished engine alive


def register(engine: Shards) -> None:
    """Let ``engine_of(param)`` find ``engine`` from any of its trainable parameters."""
    ref = weakref.ref(engine)
    for bucket in engine.parts.buckets:
        for p in bucket.params:
            setattr(p, _ENGINE_ATTR, ref)


def engine_of(param: torch.Tensor) -> Shards | None:
    ref = getattr(param, _ENGINE_ATTR, None)
    return ref() if ref is not None else None


@dataclass(frozen=True)
class Fragment:
    """Where this rank's piece of one parameter lives: in the owned chunk and in the flat parameter."""

    bucket_index: int
    owned_start: int  # into the owned tensors (master, gradient, optimizer state) of the bucket
    param_start: int  # into the parameter, flattened
    numel: int
    shape: torch.Size  # the parameter's full shape (a released stage-3 parameter may show another)

    @property
    def param_numel(self) -> int:
        return self.shape.numel()


def fragment(engine: Shards, param: torch.Tensor) -> Fragment | None:
    """This rank's fragment of ``param`` (None if the engine does not train it)."""
    masters = engine.parts.masters
    for bi, bucket in enumerate(engine.parts.buckets):
        for p, slot in zip(bucket.params, bucket.plan.slots, strict=True):
            if p is not param:
                continue
            lo, hi = (bucket.shard_offset, bucket.shard_offset + bucket.shard_numel) if masters.sharded \
                else (0, bucket.plan.padded_numel)
            start, end = max(slot.offset, lo), min(slot.offset + slot.numel, hi)
            if end <= start:  # none of it on this rank (narrow() wants a start inside the tensor)
                return Fragment(bi, 0, 0, 0, slot.shape)
            return Fragment(bi, start - lo, start - slot.offset, end - start, slot.shape)
    return None


def owned_tensor(engine: Shards, bucket_index: int, what: str) -> torch.Tensor:
    """The owned chunk of bucket ``bucket_index``: ``"fp32"`` master, ``"grad"`` or an optimizer-state key."""
    master = engine.parts.masters.masters[bucket_index]
    if what == "fp32":
        return master
    if what == "grad":
        return engine.parts.grad_sync.owned_grads()[bucket_index]
    state = engine.optimizer.state.get(master, {})
    if what not in state:
        from zerorun.engine.errors import EngineError

        raise EngineError(f"the optimizer state has no key {what!r} for this parameter "
                          f"(it has {sorted(state) or 'nothing yet: no step has run'})",
                          "use one of the optimizer's state keys, e.g. 'exp_avg' or 'exp_avg_sq' for Adam")
    return state[what]


def local(engine: Shards, param: torch.Tensor, what: str) -> torch.Tensor | None:
    """This rank's fragment of ``param``'s ``what`` (1-D, possibly empty), as a view one can write."""
    frag = fragment(engine, param)
    if frag is None:
        return None
    return owned_tensor(engine, frag.bucket_index, what).detach().narrow(0, frag.owned_start, frag.numel)


def full(engine: Shards, param: torch.Tensor, what: str) -> torch.Tensor | None:
    """``param``'s whole ``what`` in fp32 and ``param``'s shape, on every rank (a collective when sharded)."""
    frag = fragment(engine, param)
    if frag is None:
        return None
    piece = owned_tensor(engine, frag.bucket_index, what).detach().narrow(0, frag.owned_start, frag.numel)
    out = torch.zeros(frag.param_numel, dtype=torch.float32, device=engine.ctx.device)
    out.narrow(0, frag.param_start, frag.numel).copy_(piece)
    if engine.parts.masters.sharded:
        engine.shard_coll.all_reduce(out)  # each shard group holds the whole of it (MiCS)
    return out.view(frag.shape)


def set_full(engine: Shards, param: torch.Tensor, value: torch.Tensor, what: str) -> None:
    """Write this rank's fragment of the full ``value`` into ``param``'s ``what``."""
    frag = fragment(engine, param)
    if frag is None:
        return
    target = owned_tensor(engine, frag.bucket_index, what).detach().narrow(0, frag.owned_start, frag.numel)
    with torch.no_grad():
        target.copy_(value.reshape(-1).narrow(0, frag.param_start, frag.numel))


def set_local(engine: Shards, param: torch.Tensor, value: torch.Tensor, what: str) -> None:
    """Write this rank's fragment of ``param``'s ``what`` from ``value`` (the fragment's own size)."""
    target = local(engine, param, what)
    if target is not None:
        with torch.no_grad():
            target.copy_(value.reshape(-1))

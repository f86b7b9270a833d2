"""Read an engine's layout (bucket -> parameter names, shapes, offsets) and its owned chunks.

The only place the checkpoint code looks inside the engine's buckets and master shards;
everything else works on the pure :mod:`manifest` entries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from zerorun.engine.checkpoint.manifest import BucketEntry, ParamEntry

if TYPE_CHECKING:
    from zerorun.engine.views import Shards


def param_names(module: nn.Module) -> tuple[dict[int, str], dict[str, str]]:
    """``id(param) -> name`` (first name of each tensor) and the tied aliases ``other name -> first name``."""
    names: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        if id(p) in names:
            aliases[name] = names[id(p)]
        else:
            names[id(p)] = name
    return names, aliases


def engine_layout(engine: Shards) -> tuple[tuple[BucketEntry, ...], dict[str, str]]:
    names, aliases = param_names(engine.module)
    buckets = []
    for b in engine.parts.buckets:
        params = tuple(ParamEntry(names[id(p)], tuple(slot.shape), slot.offset, slot.numel)
                       for p, slot in zip(b.params, b.plan.slots, strict=True))
        buckets.append(BucketEntry(b.plan.group_index, b.plan.padded_numel, params))
    return tuple(buckets), aliases


def owned_parts(engine: Shards) -> tuple[int, int]:
    """(parts, index): the masters hold chunk ``index`` of ``parts`` of every bucket (parts: the shard
    group's size, which is the world's unless MiCS shards inside smaller groups)."""
    masters, shard = engine.parts.masters, engine.shard_coll
    return (shard.world_size, shard.rank) if masters.sharded else (1, 0)


def saved_world(engine: Shards) -> tuple[int, int, bool]:
    """(world, rank, writes): the checkpoint is one of ``world`` rank files, this rank's is ``rank``, and
    ``writes`` says whether this rank writes it. Under MiCS the replicas hold the same shards, so the
    first shard group writes a checkpoint of a world of its size (loadable at any world, as any other)."""
    replica = engine.parts.groups.replica if engine.parts.groups is not None else None
    shard = engine.shard_coll
    if replica is None:
        return engine.ctx.world_size, engine.ctx.rank, True
    return shard.world_size, shard.rank, replica.rank == 0


def chunk_of(flat: torch.Tensor, padded_numel: int, owned: tuple[int, int], world: int, rank: int) -> torch.Tensor:
    """Chunk ``rank`` of ``world`` of a bucket, from a tensor that holds the owned range ``owned``."""
    parts, _ = owned
    if parts == world:
        return flat.reshape(-1)
    size = padded_numel // world
    return flat.reshape(-1).narrow(0, rank * size, size)


def publish_masters(engine: Shards) -> None:
    """Make the compute parameters equal the (just loaded) fp32 masters on every rank: the step's own
    publish (written into the owned chunks and all-gathered, or into the resting shards)."""
    engine.parts.masters.publish(engine.coll)


def extra_state(module: nn.Module, stored: set[str], aliases: dict[str, str],
                exclude_frozen: bool = False) -> dict[str, torch.Tensor]:
    """Entries of ``module.state_dict()`` the buckets do not hold: buffers and frozen parameters (the latter
    left out with ``exclude_frozen``, DeepSpeed's ``exclude_frozen_parameters``)."""
    skip = set(stored) | set(aliases) | (set(frozen_names(module, stored)) if exclude_frozen else set())
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items() if k not in skip}


def frozen_names(module: nn.Module, stored: set[str]) -> list[str]:
    """The module's parameters no bucket holds, in the module's order: the frozen ones (``requires_grad=False``)."""
    return [n for n, _ in module.named_parameters() if n not in stored]

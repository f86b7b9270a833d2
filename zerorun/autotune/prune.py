"""Drop candidates the memory estimate says cannot fit, before anything runs.

The estimate is ``zerorun.estimate``'s, with the candidate's bucket sizes (and micro
batch, for activations) in place of the starting config's. A headroom fraction keeps
a margin for what the estimate does not see (fragmentation, the user's own tensors).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from zerorun.autotune.space import MICRO_BATCH
from zerorun.estimate import (
    DEFAULT_OVERHEAD,
    FIT_HEADROOM,
    ActivationPolicy,
    Buckets,
    EstimateRequest,
    ModelShape,
    Placement,
    Training,
    estimate_row,
    gib,
    usable_bytes,
)

_BUCKET_FIELDS = frozenset(Buckets.__dataclass_fields__)


@dataclass(frozen=True)
class MemoryContext:
    """The fixed part of every candidate's estimate: model, world, placement, GPU size."""

    training: Training
    placement: Placement
    gpu_memory: int
    gpus_per_node: int = 1
    nodes: int = 1
    shape: ModelShape | None = None
    activation_policy: ActivationPolicy = field(default_factory=ActivationPolicy)
    buckets: Buckets = field(default_factory=Buckets)
    overhead: int = DEFAULT_OVERHEAD
    headroom: float = FIT_HEADROOM  # fraction of the GPU kept free: the estimate's own threshold


@dataclass(frozen=True)
class PruneVerdict:
    """One candidate's predicted bytes per GPU, and whether it may run."""

    knobs: dict[str, Any]
    predicted_bytes: int
    fits: bool
    reason: str


def predicted_bytes(ctx: MemoryContext, knobs: Mapping[str, Any]) -> int:
    """The estimate's total bytes per GPU with ``knobs`` applied."""
    buckets = replace(ctx.buckets, **{k: v for k, v in knobs.items() if k in _BUCKET_FIELDS})
    shape = ctx.shape
    if shape is not None and MICRO_BATCH in knobs:
        shape = replace(shape, micro_batch=int(knobs[MICRO_BATCH]))
    request = EstimateRequest(
        training=ctx.training,
        gpus_per_node=ctx.gpus_per_node,
        nodes=ctx.nodes,
        buckets=buckets,
        shape=shape,
        activation_policy=ctx.activation_policy,
        overhead=ctx.overhead,
        gpu_memory=ctx.gpu_memory,
    )
    return estimate_row(request, ctx.placement).total


def check(ctx: MemoryContext, knobs: Mapping[str, Any]) -> PruneVerdict:
    """Fits when the prediction leaves ``headroom`` of the GPU free."""
    need = predicted_bytes(ctx, knobs)
    limit = usable_bytes(ctx.gpu_memory, ctx.headroom)
    fits = need <= limit
    reason = (
        f"predicted {gib(need):.1f} GiB of {gib(limit):.1f} GiB usable"
        if fits
        else f"predicted {gib(need):.1f} GiB per GPU > {gib(limit):.1f} GiB usable "
        f"({gib(ctx.gpu_memory):.1f} GiB less {ctx.headroom:.0%} headroom)"
    )
    return PruneVerdict(dict(knobs), need, fits, reason)


def split(ctx: MemoryContext, candidates: Iterable[Mapping[str, Any]]) -> tuple[list[PruneVerdict], list[PruneVerdict]]:
    """(candidates that may run, candidates pruned), each with its verdict."""
    verdicts = [check(ctx, c) for c in candidates]
    return [v for v in verdicts if v.fits], [v for v in verdicts if not v.fits]

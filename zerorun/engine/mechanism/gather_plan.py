"""The data of stage 3's gathering: a unit (a module and its buckets), the gather policy from the config, the stats,
the reducer as the gathering sees it.

Kept apart from :mod:`zerorun.engine.mechanism.gather` (which re-exports them) so the coordinator's file holds
its mechanism alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from zerorun.config.schema_zero import ZeroConfig


@dataclass(frozen=True)
class Unit:
    index: int
    name: str
    buckets: tuple[int, ...]
    leaf: bool = False  # a leaf module (``_z3_leaf``): its whole subtree is this one unit


@dataclass(frozen=True)
class GatherPolicy:
    prefetch_numel: int  # stage3_prefetch_bucket_size: elements in flight ahead of use (0: no prefetch)
    max_live: int  # stage3_max_live_parameters: cap on gathered elements when prefetching or keeping
    max_reuse: int  # stage3_max_reuse_distance: keep a bucket needed again within this many elements

    @classmethod
    def from_config(cls, zero_cfg: ZeroConfig) -> GatherPolicy:
        """From the ``zero_optimization`` block."""
        return cls(prefetch_numel=int(zero_cfg.stage3_prefetch_bucket_size),
                   max_live=int(zero_cfg.stage3_max_live_parameters),
                   max_reuse=int(zero_cfg.stage3_max_reuse_distance))


@dataclass
class GatherStats:
    fallbacks: int = 0  # passes that left the recorded order
    prefetched: int = 0  # buckets all-gathered ahead of use
    touches: int = 0  # buckets gathered because a parameter was used without its unit listing it
    peak_live_numel: int = 0  # most non-persistent elements gathered or in flight at once
    history: list[int] = field(default_factory=list)


class Unwinding(Protocol):
    """The gradient reducer, as the root forward pre-hook sees it: it unwinds a backward that raised."""

    armed: bool  # a backward pass is in progress (at a root forward: one that raised)

    def unwind_aborted(self) -> None: ...

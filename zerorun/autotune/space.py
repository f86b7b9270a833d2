"""What the tuner may change, per stage, and the values it tries.

Only knobs the bundled engine reads are tuned: stages 1-2 tune the reduce bucket and
``overlap_comm``; stage 3 the prefetch bucket, the persistence threshold, the
live-parameter cap, the reuse distance and ``overlap_comm``. DeepSpeed's
``allgather_bucket_size`` and ``contiguous_gradients`` (and, at stage 3,
``reduce_bucket_size``: gradients are reduced per module unit) change nothing in this
engine, so trials over them would only measure noise. Sizes centre on the
hidden-size rules (h^2 for buckets, 0.9*h^2 for prefetch, 10*h for persistence) and
spread on a log grid; without a hidden size they centre on the starting config.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from zerorun.errors import ZerorunError

STAGE_KNOBS: dict[int, tuple[str, ...]] = {
    1: ("reduce_bucket_size", "overlap_comm"),
    2: ("reduce_bucket_size", "overlap_comm"),
    3: (
        "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
        "stage3_max_live_parameters", "stage3_max_reuse_distance", "overlap_comm",
    ),
}
IGNORED_BY_ENGINE: dict[int, tuple[str, ...]] = {
    1: ("allgather_bucket_size", "contiguous_gradients"),
    2: ("allgather_bucket_size", "contiguous_gradients"),
    3: ("reduce_bucket_size", "allgather_bucket_size", "contiguous_gradients"),
}
"""DeepSpeed knobs the bundled engine does not read at that stage: never tuned (``--knobs`` says why)."""
BOOL_KNOBS = frozenset({"overlap_comm", "contiguous_gradients"})
EVEN_KNOBS = frozenset({"allgather_bucket_size"})  # DeepSpeed's stage 1/2 asserts an even size
DEFAULTS: dict[str, int | bool] = {
    "reduce_bucket_size": 500_000_000,
    "allgather_bucket_size": 500_000_000,
    "overlap_comm": False,
    "contiguous_gradients": True,
    "stage3_prefetch_bucket_size": 50_000_000,
    "stage3_param_persistence_threshold": 100_000,
    "stage3_max_live_parameters": 1_000_000_000,
    "stage3_max_reuse_distance": 1_000_000_000,
}
MICRO_BATCH = "train_micro_batch_size_per_gpu"
ACCUMULATION = "gradient_accumulation_steps"


class SpaceError(ZerorunError):
    """A search space that cannot be built."""


def hidden_size_centres(hidden_size: int) -> dict[str, int]:
    """HF's "auto" rules: h^2 for the buckets, int(0.9*h^2) prefetch, 10*h persistence."""
    h2 = hidden_size * hidden_size
    return {
        "reduce_bucket_size": h2,
        "allgather_bucket_size": h2 + (h2 % 2),
        "stage3_prefetch_bucket_size": int(0.9 * h2),
        "stage3_param_persistence_threshold": 10 * hidden_size,
    }


def log_grid(centre: int, *, factor: float = 4.0, each_side: int = 2, minimum: int = 1, even: bool = False) -> list[int]:
    """``centre * factor**k`` for k in -each_side..each_side: sorted, distinct, >= minimum."""
    if centre < 1:
        raise SpaceError(f"a grid needs a positive centre, got {centre}", hint="check the starting config's sizes")
    values = set()
    for k in range(-each_side, each_side + 1):
        v = max(minimum, round(centre * factor**k))
        values.add(v + (v % 2) if even else v)
    return sorted(values)


def refine(values: list[int], best: int, *, even: bool = False) -> list[int]:
    """Geometric midpoints between ``best`` and its grid neighbours: the local refinement."""
    ordered = sorted(set(values) | {best})
    i = ordered.index(best)
    out = []
    for neighbour in ordered[max(0, i - 1) : i] + ordered[i + 1 : i + 2]:
        mid = round(math.sqrt(best * neighbour))
        mid += mid % 2 if even else 0
        if mid not in ordered:
            out.append(mid)
    return out


@dataclass(frozen=True)
class SearchSpace:
    """The knobs of one stage, each with its coarse values, and the starting point."""

    stage: int
    start: dict[str, Any]
    values: dict[str, tuple[Any, ...]]

    @property
    def knobs(self) -> tuple[str, ...]:
        return tuple(self.values)

    def size(self) -> int:
        return math.prod(len(v) for v in self.values.values())


def micro_batch_choices(global_batch: int, world_size: int, max_micro_batch: int = 64) -> list[tuple[int, int]]:
    """(micro batch, accumulation steps) pairs that keep ``global_batch`` exactly."""
    per_rank, rem = divmod(global_batch, world_size)
    if rem or per_rank < 1:
        raise SpaceError(
            f"train_batch_size {global_batch} does not divide over {world_size} ranks",
            hint="choose a global batch that is a multiple of the world size",
        )
    return [(m, per_rank // m) for m in range(1, min(per_rank, max_micro_batch) + 1) if per_rank % m == 0]


def build_space(
    stage: int,
    start: Mapping[str, Any],
    *,
    hidden_size: int | None = None,
    factor: float = 4.0,
    each_side: int = 2,
    micro_batches: list[tuple[int, int]] | None = None,
) -> SearchSpace:
    """The space for ``stage``; ``start`` is the starting config's ``zero_optimization`` (plus
    the micro batch and accumulation when those are tuned)."""
    if stage not in STAGE_KNOBS:
        raise SpaceError(f"stage {stage} has no communication knobs to tune", hint="autotune stages 1, 2 or 3")
    centres = hidden_size_centres(hidden_size) if hidden_size else {}
    begin: dict[str, Any] = {}
    values: dict[str, tuple[Any, ...]] = {}
    for knob in STAGE_KNOBS[stage]:
        value = start.get(knob)
        if knob == "overlap_comm" and value is None:
            value = stage == 3
        begin[knob] = DEFAULTS[knob] if value is None else value
        if knob in BOOL_KNOBS:
            values[knob] = (True, False)
        else:
            grid = log_grid(int(centres.get(knob, begin[knob])), factor=factor, each_side=each_side, even=knob in EVEN_KNOBS)
            values[knob] = tuple(grid)
    if micro_batches:
        mbs = int(start.get(MICRO_BATCH) or micro_batches[0][0])
        begin[MICRO_BATCH], begin[ACCUMULATION] = next(
            ((m, g) for m, g in micro_batches if m == mbs), micro_batches[0]
        )
        values[MICRO_BATCH] = tuple(m for m, _ in micro_batches)
    return SearchSpace(stage, begin, values)


def with_value(knobs: Mapping[str, Any], knob: str, value: Any) -> dict[str, Any]:
    """``knobs`` with one knob changed (accumulation follows the micro batch)."""
    out = dict(knobs)
    out[knob] = value
    if knob == MICRO_BATCH and ACCUMULATION in out:
        total = knobs[MICRO_BATCH] * knobs[ACCUMULATION]
        out[ACCUMULATION] = total // value
    return out

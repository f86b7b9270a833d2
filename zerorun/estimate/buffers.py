"""Communication buffers per GPU, from the config's bucket sizes, as zerorun's engine holds them.

Stages 0-1 reduce each gradient bucket in place (the gradient buffers are the
communication buffers) and all-gather parameters in place, so they hold no extra
buffer; ``allgather_bucket_size`` therefore costs nothing here (DeepSpeed allocates
one). Stage 2 reduce-scatters through staging buffers of one bucket each
(``reduce_bucket_size`` at most 2^21 elements, never smaller than the largest parameter,
never larger than the model), two of them with ``overlap_comm``: one in flight while the next fills.
Stage 3 adds the gathered parameters at their peak: the unit running now, what is
prefetched and what forward keeps gathered for backward (``stage3_max_reuse_distance``,
at most ``stage3_max_live_parameters``: :mod:`zerorun.estimate.stage3_window`), that unit's full gradient before it is
reduce-scattered, and the small parameters kept gathered under
``stage3_param_persistence_threshold``. ZeRO++ at stage 3 adds, when its keys are on: hpZ's
secondary copy (``zero_hpz_partition_size``: the parameters over the node's h ranks, held
from forward to backward), qwZ's int8 send/receive buffer of every gather in flight
(``zero_quantized_weights``) and qgZ's int8 send and receive buffers of one reduce-scatter
plus the fp32 sum of this rank's chunk (``zero_quantized_gradients``). Nothing is counted
for a ZeRO++ key that is off: the engine allocates nothing for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zerorun.estimate.in_flight import StepSizes
from zerorun.estimate.model_states import Placement, Training
from zerorun.estimate.shape import ModelShape
from zerorun.estimate.stage3_window import WindowPolicy, decoder_window
from zerorun.estimate.topology import quantized_bytes


@dataclass(frozen=True)
class Buckets:
    """The five bucket knobs (elements), with DeepSpeed's defaults."""

    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000
    overlap_comm: bool | None = None  # None: DeepSpeed's default, on at stage 3 only
    stage3_prefetch_bucket_size: int = 50_000_000
    stage3_max_live_parameters: int = 1_000_000_000
    stage3_param_persistence_threshold: int = 100_000
    stage3_max_reuse_distance: int = 1_000_000_000
    # stages 0-2 cap their bucket layout at MAX_BUCKET_NUMEL on gloo (the engine's layout_numel); on
    # NCCL, the GPU this estimate is for, the configured reduce_bucket_size holds: None
    layout_cap: int | None = None
    # ZeRO++ (stage 3): hpZ's secondary group size, qwZ, qgZ
    zero_hpz_partition_size: int = 1
    zero_quantized_weights: bool = False
    zero_quantized_gradients: bool = False

    @classmethod
    def from_zero_config(cls, zero: Any) -> Buckets:
        """From a resolved ``cfg.zero_optimization`` (or any object with those attributes)."""
        defaults = cls()
        values = {
            name: getattr(zero, name, getattr(defaults, name))
            for name in cls.__dataclass_fields__
        }
        overlap, cap = values.pop("overlap_comm"), values.pop("layout_cap")
        flags = {k: bool(values.pop(k)) for k in ("zero_quantized_weights", "zero_quantized_gradients")}
        return cls(overlap_comm=None if overlap is None else bool(overlap), layout_cap=cap, **flags,
                   **{k: int(v) for k, v in values.items()})


def window_policy(buckets: Buckets) -> WindowPolicy:
    """The stage-3 gather knobs of ``buckets``."""
    return WindowPolicy(buckets.stage3_max_live_parameters, buckets.stage3_max_reuse_distance,
                        buckets.stage3_prefetch_bucket_size, buckets.stage3_param_persistence_threshold)


# Stages 0-2 lay buckets out at most this large (zerorun.engine.mechanism.buckets.MAX_BUCKET_NUMEL, mirrored here
# so the estimate needs no torch; a test holds the two equal).
MAX_BUCKET_NUMEL = 2**21


def largest_bucket(training: Training, buckets: Buckets, shape: ModelShape | None, stage: int = 2) -> int:
    """Elements of the largest bucket: the layout's bucket size (``reduce_bucket_size``, at most
    ``buckets.layout_cap`` at stages 0-2), or one parameter that is larger, capped by Ψ. At
    stage 3 a bucket is one module, so with the shape known it is the largest parameter's module."""
    largest_param = max(shape.embedding_params(), shape.hidden * shape.ffn_size) if shape else 0
    if stage == 3:  # without the shape the unit is unknown: the bucket size bounds it
        layout = 0 if shape else buckets.reduce_bucket_size
    else:
        cap = buckets.layout_cap
        layout = buckets.reduce_bucket_size if cap is None else min(buckets.reduce_bucket_size, cap)
    return min(training.params, max(layout, largest_param))


def stage3_gathered(training: Training, buckets: Buckets, unit: int, shape: ModelShape | None = None) -> int:
    """Elements stage 3 holds gathered at its peak: the largest unit plus the prefetch window,
    at most ``stage3_max_live_parameters`` (the running unit counts regardless), at most Ψ; with
    the shape known, what the coordinator really keeps (the reuse window into backward too)."""
    window = min(buckets.stage3_max_live_parameters, unit + buckets.stage3_prefetch_bucket_size)
    if shape:
        window = decoder_window(shape, training.world_size, window_policy(buckets)).peak_live_numel
    return min(training.params, max(unit, window))


def step_sizes(training: Training, placement: Placement, buckets: Buckets, shape: ModelShape | None) -> StepSizes:
    """The element counts of :mod:`zerorun.estimate.in_flight` for the engine at these bucket settings."""
    overlap = placement.stage == 3 if buckets.overlap_comm is None else buckets.overlap_comm
    unit = min(shape.largest_unit(), training.params) if shape else 0
    return StepSizes(unit=unit, bucket=largest_bucket(training, buckets, shape, placement.stage),
                     gathered=stage3_gathered(training, buckets, unit, shape) if placement.stage == 3 else 0,
                     staging_buffers=2 if overlap else 1)


def buffer_terms(
    training: Training, placement: Placement, buckets: Buckets, shape: ModelShape | None
) -> dict[str, int]:
    """Bytes of each communication buffer one rank holds during a step."""
    nbytes = training.dtype.nbytes
    if not placement.stages_gradients:
        return {}
    sizes = step_sizes(training, placement, buckets, shape)
    terms = {"reduce_staging": sizes.bucket * nbytes * sizes.staging_buffers}
    if placement.stage == 3:
        terms["gathered_params"] = sizes.gathered * nbytes
        terms["unit_gradients"] = sizes.unit * nbytes
        if shape and shape.hidden <= buckets.stage3_param_persistence_threshold:
            terms["persistent_params"] = (2 * shape.layers + 1) * shape.hidden * nbytes  # the norms
        terms.update(zeropp_terms(training, buckets, sizes, shape))
    return terms


def zeropp_terms(training: Training, buckets: Buckets, sizes: StepSizes, shape: ModelShape | None) -> dict[str, int]:
    """Stage 3's ZeRO++ buffers, each only when its key is on (see the module docstring)."""
    terms = {}
    hpz, world, nbytes = buckets.zero_hpz_partition_size, training.world_size, training.dtype.nbytes
    if hpz > 1:  # the secondary copy: the non-persistent parameters over the h ranks of the node
        sharded = training.params
        if shape:
            window = decoder_window(shape, world, window_policy(buckets))
            sharded = window.total_numel - window.persistent_numel
        terms["hpz_secondary"] = -(-sharded // hpz) * nbytes
    if buckets.zero_quantized_weights:  # the int8 blocks of every gather in flight, the whole world's chunks
        terms["qwz_scratch"] = world * quantized_bytes(-(-sizes.gathered // world))
    if buckets.zero_quantized_gradients:  # send and receive, int8 blocks of a unit; the fp32 sum of one chunk
        chunk = -(-sizes.bucket // world)
        terms["qgz_scratch"] = 2 * world * quantized_bytes(chunk) + 4 * chunk
    return terms

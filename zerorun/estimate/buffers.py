"""Communication buffers per GPU, from the config's bucket sizes.

Stages 0-2 reduce gradients through a bucket of ``reduce_bucket_size`` elements (two
with ``overlap_comm``: one in flight while the next fills); stages 1-2 all-gather the
updated parameters through ``allgather_bucket_size``. Stage 3 holds the gathered
parameters of the unit running now plus what is prefetched (at most
``stage3_max_live_parameters``), that unit's full gradient before it is
reduce-scattered, and the small parameters kept gathered under
``stage3_param_persistence_threshold``. No bucket is larger than the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zerorun.estimate.model_states import Placement, Training
from zerorun.estimate.shape import ModelShape


@dataclass(frozen=True)
class Buckets:
    """The five bucket knobs (elements), with DeepSpeed's defaults."""

    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000
    overlap_comm: bool | None = None  # None: DeepSpeed's default, on at stage 3 only
    stage3_prefetch_bucket_size: int = 50_000_000
    stage3_max_live_parameters: int = 1_000_000_000
    stage3_param_persistence_threshold: int = 100_000

    @classmethod
    def from_zero_config(cls, zero: Any) -> Buckets:
        """From a resolved ``cfg.zero_optimization`` (or any object with those attributes)."""
        defaults = cls()
        values = {
            name: getattr(zero, name, getattr(defaults, name))
            for name in cls.__dataclass_fields__
        }
        overlap = values.pop("overlap_comm")
        return cls(overlap_comm=None if overlap is None else bool(overlap), **{k: int(v) for k, v in values.items()})


def buffer_terms(
    training: Training, placement: Placement, buckets: Buckets, shape: ModelShape | None
) -> dict[str, int]:
    """Bytes of each communication buffer one rank holds during a step."""
    psi, nbytes = training.params, training.dtype.nbytes
    overlap = placement.stage == 3 if buckets.overlap_comm is None else buckets.overlap_comm
    in_flight = 2 if overlap else 1
    terms = {"reduce_bucket": min(buckets.reduce_bucket_size, psi) * nbytes * in_flight}
    if placement.stage in (1, 2):
        terms["allgather_bucket"] = min(buckets.allgather_bucket_size, psi) * nbytes
    if placement.stage == 3:
        unit = min(shape.largest_unit(), psi) if shape else 0
        window = min(buckets.stage3_max_live_parameters, unit + buckets.stage3_prefetch_bucket_size)
        terms["gathered_params"] = min(psi, max(unit, window)) * nbytes
        terms["unit_gradients"] = unit * nbytes
        if shape and shape.hidden <= buckets.stage3_param_persistence_threshold:
            terms["persistent_params"] = (2 * shape.layers + 1) * shape.hidden * nbytes  # the norms
    return terms

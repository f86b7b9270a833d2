"""A stage's physical floor: its model states plus what a step must hold in flight.

The yardstick of the memory benchmark and of ``estimate --measure`` (issue 19): a rank
cannot train a step in less. Model states follow :func:`model_states` (the engine's
layout: the fp32 gradient shard at stages 2-3; in fp32 the master is the parameter), the
in-flight terms :mod:`zerorun.estimate.in_flight` at their minimum:

* every stage: one unit's autograd gradients (the unit: the model's repeating layer);
* stage 2: one staging bucket (two with ``overlap_comm``);
* stage 3: two gathered units (the one computing and the one prefetched); its staging is
  the unit's gradients themselves;
* the optimizer's temporaries for one bucket, in the step phase (smaller than backward's
  transients whenever a bucket is no larger than a unit);
* the activations, when given.

Frozen parameters (a LoRA-style base) are held in the compute dtype only: whole at
stages 0-2, a 1/N shard at stage 3; they have no gradients and no optimizer state.
"""

from __future__ import annotations

from dataclasses import dataclass

from zerorun.estimate.in_flight import InFlight, StepSizes, in_flight
from zerorun.estimate.model_states import Placement, Training, model_states


@dataclass(frozen=True)
class Floor:
    """The floor of one stage, per rank: model-state bytes, in-flight bytes, and their terms."""

    model_states: int
    in_flight: InFlight
    frozen: int = 0

    @property
    def total(self) -> int:
        return self.model_states + self.frozen + self.in_flight.peak

    def terms(self) -> dict[str, int]:
        return {"model_states": self.model_states, "frozen_params": self.frozen, **self.in_flight.terms()}


def frozen_bytes(training: Training, stage: int, frozen_params: int) -> int:
    """Compute-dtype bytes of ``frozen_params`` parameters the optimizer never steps."""
    held = -(-frozen_params // training.world_size) if stage == 3 else frozen_params
    return held * training.dtype.nbytes


def physical_floor(training: Training, stage: int, *, unit: int, bucket: int, gathered_unit: int | None = None,
                   overlap_comm: bool = False, frozen_params: int = 0, activations: int = 0) -> Floor:
    """The floor of ``stage`` for ``training.params`` trainable parameters.

    ``unit``: trainable elements of the largest unit (a layer); ``gathered_unit``: all its elements,
    frozen ones included (default ``unit``); ``bucket``: the largest flat bucket of stages 0-2.
    """
    placement = Placement(stage)
    gathered = 2 * (unit if gathered_unit is None else gathered_unit)
    staging = (2 if overlap_comm else 1) if stage == 2 else 0
    step_bucket = gathered // 2 if stage == 3 else bucket  # stage 3's buckets are its units
    sizes = StepSizes(unit=unit, bucket=step_bucket, gathered=gathered, staging_buffers=staging)
    return Floor(model_states(training, placement).total, in_flight(training, placement, sizes, activations=activations),
                 frozen_bytes(training, stage, frozen_params))

"""What a training step holds besides the model states, phase by phase (pure arithmetic).

A step has two phases whose transients never coexist:

* **backward**: the unit whose gradients autograd is producing (its full gradients, in the
  compute dtype, before they are accumulated into the flat buffers or staged for the
  reduce-scatter), and at stage 3 the gathered parameters (the unit computing plus the
  prefetched ones) and the activations;
* **step**: the optimizer's temporaries. torch's AdamW with ``foreach`` (its
  ``_multi_tensor_adam``) allocates one fp32 tensor per stepped tensor
  (``exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sqs)``; everything else is in place), so one
  element per element it steps in one call; the for-loop form holds two tensors of the
  largest one (``exp_avg_sq.sqrt() / bias_correction2_sqrt``). SGD's are in place. Once the
  step is bounded to a bucket, one call steps one bucket's shard. bf16 masters step each chunk
  in fp32 temporaries of its master, gradient and two moments, plus the sqrt (20 bytes per
  element; zerorun.engine.numerics.compensated).

Stage 2-3's staging buffers are allocated once and held through both phases. The
in-flight peak is ``held + max(backward, step)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from zerorun.estimate.model_states import Masters, Offload, Optimizer, Placement, Training


@dataclass(frozen=True)
class StepSizes:
    """The element counts that set the in-flight terms (parameters, not bytes)."""

    unit: int
    """Trainable elements of the largest unit of work: their gradients leave autograd together."""
    bucket: int
    """Elements of the largest flat bucket: a staging buffer, one bounded optimizer call (before sharding)."""
    gathered: int = 0
    """Stage 3: elements gathered at once (the unit computing plus the prefetched ones)."""
    staging_buffers: int = 1
    """Stage 2-3: staging buffers of one bucket each (two with ``overlap_comm``)."""


@dataclass(frozen=True)
class InFlight:
    """Bytes of each in-flight term, by phase."""

    held: dict[str, int]
    backward: dict[str, int]
    step: dict[str, int]

    @property
    def peak(self) -> int:
        """The most a step holds at once beyond the model states."""
        return sum(self.held.values()) + max(sum(self.backward.values()), sum(self.step.values()))

    def terms(self) -> dict[str, int]:
        return {**self.held, **self.backward, **self.step}


def optimizer_temporaries(optimizer: Optimizer, elements: int, foreach: bool = True,
                          masters: Masters = Masters.FP32) -> int:
    """Bytes one optimizer call allocates while it steps ``elements`` (one tensor of them when not
    ``foreach``), in the masters' dtype. Adam with coupled weight decay (``Adam``'s
    ``weight_decay > 0``) makes one more copy of the gradients; that is not counted."""
    if masters.low:  # fp32 master, gradient, moments and the sqrt of one chunk
        return 4 * elements * (2 + optimizer.state_bytes // 4 + (optimizer in (Optimizer.ADAM, Optimizer.ADAMW)))
    if optimizer in (Optimizer.SGD, Optimizer.SGD_NO_MOMENTUM):
        return 0
    return 4 * elements * (1 if foreach else 2)


def in_flight(training: Training, placement: Placement, sizes: StepSizes, *, activations: int = 0,
              foreach: bool = True) -> InFlight:
    """The in-flight terms of one step for ``sizes`` (see the module docstring for each)."""
    nbytes = training.dtype.nbytes
    held = {"reduce_staging": sizes.staging_buffers * sizes.bucket * nbytes} if placement.stages_gradients else {}
    backward = {"unit_gradients": sizes.unit * nbytes, "activations": activations}
    if placement.stage == 3:
        backward["gathered_params"] = sizes.gathered * nbytes
    bucket = min(sizes.bucket, training.params)
    stepped = -(-bucket // training.world_size) if placement.stage >= 1 else bucket  # the rank's shard of it
    on_device = placement.offload_optimizer is Offload.NONE  # offloaded, the step runs on the host
    step = {"optimizer_temporaries": optimizer_temporaries(training.optimizer, stepped, foreach, training.masters)
                                      if on_device else 0}
    return InFlight(held, backward, step)

"""``engine.tput_timer``: DeepSpeed's throughput timer, with its state and its rules.

The engine starts it at each ``forward`` and stops it at each ``step`` (every micro-step;
``global_step=True`` on an accumulation boundary); a script may drive it by hand too, as
DeepSpeed's tests do. Its rules are DeepSpeed 0.19.8's (``deepspeed.utils.timer``):

* ``start()`` marks it ``initialized`` and ``started``; from global step ``start_step`` (2) on,
  it also records ``start_time`` (the first steps hold set-up and first-call costs);
* ``stop(global_step=False)`` does nothing unless started; else it counts a micro step (and a
  global step when ``global_step``), and when a ``start_time`` was recorded it adds the
  elapsed time to ``total_elapsed_time`` and ``step_elapsed_time`` (``end_time`` is the stop's);
  ``step_elapsed_time`` starts over after each global step;
* ``avg_samples_per_sec()``: ``batch_size`` (the train batch size) over the mean time of the
  timed global steps.

Differences, on purpose: ``avg_samples_per_sec()`` is 0.0 while no step has been timed
(DeepSpeed's gives ``-inf`` before the first global step and divides by zero in the two
after); the clock is read without a device synchronize (DeepSpeed's ``timers.throughput.
synchronized``, on by default, waits for the device at every start and stop; zerorun
ignores the ``timers`` block), and it reports nothing itself (the engine prints its own
throughput every ``steps_per_print`` steps).
"""

from __future__ import annotations

import time


class TputTimer:
    """``engine.tput_timer`` (DeepSpeed's ``ThroughputTimer``)."""

    def __init__(self, batch_size: int, start_step: int = 2) -> None:
        self.batch_size = batch_size
        self.start_step = start_step
        self.initialized = False
        self.started = False
        self.start_time = 0.0
        self.end_time = 0.0
        self.epoch_count = 0
        self.micro_step_count = 0
        self.global_step_count = 0
        self.total_elapsed_time = 0.0
        self.step_elapsed_time = 0.0

    def update_epoch_count(self) -> None:
        """A new epoch: the micro-step count starts over."""
        self.epoch_count += 1
        self.micro_step_count = 0

    def start(self) -> None:
        self.initialized = True
        self.started = True
        if self.global_step_count >= self.start_step:
            self.start_time = time.time()

    def stop(self, global_step: bool = False, report_speed: bool = True) -> None:
        """End a timed span; ``report_speed`` is accepted (the engine reports throughput itself)."""
        if not self.started:
            return
        self.started = False
        self.micro_step_count += 1
        if global_step:
            self.global_step_count += 1
        if self.start_time > 0:
            self.end_time = time.time()
            duration = self.end_time - self.start_time
            self.total_elapsed_time += duration
            self.step_elapsed_time += duration
            if global_step:
                self.step_elapsed_time = 0.0

    def avg_samples_per_sec(self) -> float:
        """Samples per second over the timed global steps (0.0 before one is timed)."""
        timed = self.global_step_count - self.start_step
        if timed <= 0 or self.total_elapsed_time <= 0:
            return 0.0
        return self.batch_size / (self.total_elapsed_time / timed)

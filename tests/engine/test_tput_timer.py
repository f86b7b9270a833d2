"""``engine.tput_timer`` (zerorun/engine/surface/tput_timer.py): DeepSpeed 0.19.8's throughput-timer rules,
driven by hand on a fake clock, and driven by the engine (started at each forward, stopped at each step)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import zerorun
from zerorun.engine.surface import tput_timer
from zerorun.engine.surface.tput_timer import TputTimer


def test_the_timer_follows_deepspeeds_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(float(t) for t in range(100, 200))
    monkeypatch.setattr(tput_timer.time, "time", lambda: next(clock))
    t = TputTimer(batch_size=12)
    t.stop()  # not started: nothing counts
    assert (t.initialized, t.started, t.micro_step_count, t.avg_samples_per_sec()) == (False, False, 0, 0.0)
    for micro in range(4):  # 2 global steps of 2 micro-steps, before start_step (2): counted, not timed
        t.start()
        assert t.initialized and t.started
        t.stop(global_step=micro % 2 == 1)
    assert (t.micro_step_count, t.global_step_count, t.start_time, t.total_elapsed_time) == (4, 2, 0.0, 0.0)
    t.start()  # from start_step on, each span is timed: 100 -> 101
    t.stop()
    assert (t.step_elapsed_time, t.total_elapsed_time, t.end_time - t.start_time) == (1.0, 1.0, 1.0)
    t.start()  # 102 -> 103, a global step: step_elapsed_time starts over
    t.stop(global_step=True)
    assert (t.global_step_count, t.step_elapsed_time, t.total_elapsed_time) == (3, 0.0, 2.0)
    assert t.avg_samples_per_sec() == 12 / 2.0  # one timed global step of 2 s
    t.update_epoch_count()
    assert (t.epoch_count, t.micro_step_count) == (1, 0)


def test_the_engine_drives_the_timer() -> None:
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
           "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
    engine, *_ = zerorun.initialize(model=nn.Linear(4, 2), config=cfg)
    timer = engine.tput_timer
    assert timer is engine.tput_timer and timer.batch_size == 4 and not timer.initialized
    for _ in range(8):
        engine.backward(engine(torch.randn(2, 4)).square().mean())
        assert timer.started  # between forward and step
        engine.step()
    assert (timer.micro_step_count, timer.global_step_count, timer.started) == (8, 4, False)
    assert timer.total_elapsed_time > 0 and timer.avg_samples_per_sec() > 0  # global steps 3 and 4 timed

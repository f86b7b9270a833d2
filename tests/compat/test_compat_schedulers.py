"""The Warmup* schedules give DeepSpeed 0.19.8's learning rate at every optimizer step.

The sequences below were measured with DeepSpeed 0.19.8's own scheduler classes
(``DS_ACCELERATOR=cpu python bench/ds_schedulers.py`` in a DeepSpeed venv): element k is
the lr optimizer step k runs with, the scheduler built and then stepped once after each
optimizer step, as DeepSpeed's engine drives it. Base (optimizer) lr 0.05.
"""

from __future__ import annotations

import pytest
import torch

import zerorun
from zerorun.engine.training.schedulers import build_scheduler

DEEPSPEED_0_19_8 = [
    ("WarmupLR", {'warmup_min_lr': 0.01, 'warmup_max_lr': 0.1, 'warmup_num_steps': 5, 'warmup_type': 'linear'},
     [0.01, 0.01, 0.028, 0.046, 0.064, 0.082, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]),
    ("WarmupLR", {'warmup_min_lr': 0.0, 'warmup_max_lr': 0.1, 'warmup_num_steps': 5, 'warmup_type': 'log'},
     [0.0, 0.0, 0.043067655807, 0.068260619449, 0.086135311615, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]),
    ("WarmupLR", {'warmup_num_steps': 4},
     [0.0, 0.0, 0.025, 0.039624062518, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05]),
    ("WarmupDecayLR", {'total_num_steps': 12, 'warmup_min_lr': 0.0, 'warmup_max_lr': 0.1, 'warmup_num_steps': 4, 'warmup_type': 'linear'},
     [0.0, 0.0, 0.025, 0.05, 0.075, 0.1, 0.0875, 0.075, 0.0625, 0.05, 0.0375, 0.025, 0.0125, 0.0]),
    ("WarmupCosineLR", {'total_num_steps': 12, 'warmup_min_ratio': 0.1, 'warmup_num_steps': 4, 'cos_min_ratio': 0.01, 'warmup_type': 'linear'},
     [0.0, 0.005, 0.01625, 0.0275, 0.03875, 0.04811601843, 0.042750892834, 0.034721414951, 0.02525, 0.015778585049, 0.007749107166, 0.00238398157, 0.0005, 0.0005]),
    ("WarmupCosineLR", {'total_num_steps': 10, 'warmup_num_steps': 3},
     [0.0, 0.0, 0.031546487679, 0.05, 0.047524469275, 0.040588186322, 0.030564967047, 0.019440032953, 0.009416813678, 0.002480530725, 5e-06, 5e-06, 5e-06, 5e-06]),
]


@pytest.mark.parametrize(("name", "params", "expected"), DEEPSPEED_0_19_8)
def test_lr_sequence_equals_deepspeed(name: str, params: dict, expected: list[float]) -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.05)
    sched = build_scheduler(name, dict(params), opt)
    got = []
    for _ in expected:
        got.append(opt.param_groups[0]["lr"])
        sched.step()
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_engine_steps_the_schedule_as_deepspeed_does() -> None:
    """Through the engine: optimizer step k uses DeepSpeed's lr k (the first at warmup_min_lr)."""
    name, params, expected = DEEPSPEED_0_19_8[0]
    model = torch.nn.Linear(3, 1)
    cfg = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.05}},
           "scheduler": {"type": name, "params": params}}
    engine, opt, _, _ = zerorun.initialize(model=model, config=cfg)
    used = []
    for _ in range(6):
        used.append(engine.get_lr()[0])
        engine.backward(engine(torch.ones(2, 3)).sum())
        engine.step()
    assert used == pytest.approx(expected[:6], rel=1e-9, abs=1e-12)


# (lr, beta1, beta2) of every optimizer step, DeepSpeed 0.19.8's classes on AdamW (bench/ds_schedulers.py):
# OneCycle cycles beta1 inversely to the lr and, as DeepSpeed does, sets beta2 to 0.99.
CYCLES_0_19_8 = [
    ("OneCycle", {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1, "cycle_first_step_size": 4, "cycle_second_step_size": 3,
                  "decay_step_size": 2, "decay_lr_rate": 0.5, "decay_mom_rate": 0.1},
     [[0.01, 0.8, 0.99], [0.0325, 0.875, 0.99], [0.055, 0.85, 0.99], [0.0775, 0.825, 0.99], [0.1, 0.8, 0.99],
      [0.07, 0.833333333333, 0.99], [0.04, 0.866666666667, 0.99], [0.01, 0.9, 0.99], [0.008, 0.945, 0.99],
      [0.006666666667, 0.99, 0.99], [0.005714285714, 1.035, 0.99], [0.005, 1.08, 0.99],
      [0.004444444444, 1.125, 0.99], [0.004, 1.17, 0.99]]),
    ("OneCycle", {"cycle_min_lr": 0.001, "cycle_max_lr": 0.05, "cycle_first_step_size": 5,
                  "cycle_first_stair_count": 2},
     [[0.001, 0.8, 0.99], [0.001, 0.9, 0.99], [0.001, 0.9, 0.99], [0.0255, 0.85, 0.99], [0.0255, 0.85, 0.99],
      [0.05, 0.8, 0.99], [0.0255, 0.85, 0.99], [0.0255, 0.85, 0.99], [0.001, 0.9, 0.99], [0.001, 0.9, 0.99],
      [0.001, 0.9, 0.99], [0.001, 0.9, 0.99], [0.001, 0.9, 0.99], [0.001, 0.9, 0.99]]),
    ("LRRangeTest", {"lr_range_test_min_lr": 0.001, "lr_range_test_step_size": 3, "lr_range_test_step_rate": 2.0},
     [[0.001 * (1 + 2.0 * k / 3), 0.9, 0.999] for k in range(14)]),
    ("LRRangeTest", {"lr_range_test_min_lr": 0.002, "lr_range_test_step_size": 4, "lr_range_test_staircase": True},
     [[0.002 * (1 + k // 4), 0.9, 0.999] for k in range(14)]),
]


@pytest.mark.parametrize(("name", "params", "expected"), CYCLES_0_19_8)
def test_one_cycle_and_range_test_equal_deepspeed(name: str, params: dict, expected: list[list[float]]) -> None:
    from zerorun.compat import lr_schedules

    for make in (lambda opt: build_scheduler(name, dict(params), opt),  # the config's scheduler block
                 lambda opt: getattr(lr_schedules, name)(opt, **params)):  # deepspeed.runtime.lr_schedules
        opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=0.05)
        sched = make(opt)
        got = []
        for _ in expected:
            got += [opt.param_groups[0]["lr"], *opt.param_groups[0]["betas"]]
            sched.step()
        assert got == pytest.approx([x for row in expected for x in row], abs=1e-12)


def test_one_cycle_leaves_an_optimizer_without_betas_alone() -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.05, momentum=0.5)
    sched = build_scheduler("OneCycle", {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1, "cycle_first_step_size": 2}, opt)
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.055) and "betas" not in opt.param_groups[0]

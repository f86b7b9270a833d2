"""Pure pieces of the engine: bucket plans, loss scaler, schedules, clip arithmetic, config lookup."""

from __future__ import annotations

import argparse
import math

import pytest
import torch

from zerorun.engine.api import _config_from_argv, add_config_arguments, resolve_config_source
from zerorun.engine.errors import EngineError
from zerorun.engine.mechanism.buckets import plan_buckets
from zerorun.engine.numerics import loss_scaler
from zerorun.engine.numerics.grad_norm import clip_multiplier
from zerorun.engine.policy import policy_for_stage
from zerorun.engine.training.schedulers import (
    Scheduler,
    WarmupCosineLR,
    WarmupDecayLR,
    WarmupLR,
    build_scheduler,
)


def test_plan_buckets_reverse_order_padding_and_big_params() -> None:
    shapes = [torch.Size([10]), torch.Size([3, 3]), torch.Size([50]), torch.Size([7])]
    plans = plan_buckets(shapes, bucket_size=20, world_size=4)
    # reversed: 7 | 50 (over the size: its own bucket) | 9 + 10
    assert [p.param_indices for p in plans] == [(3,), (2,), (1, 0)]
    assert [p.padded_numel for p in plans] == [8, 52, 20]
    assert plans[2].slots[1].offset == 9 and plans[2].slots[0].shape == torch.Size([3, 3])
    assert all(p.padded_numel % 4 == 0 and p.padded_numel - p.numel < 4 for p in plans)


def test_dynamic_loss_scaler_hysteresis_window_and_floor() -> None:
    policy = loss_scaler.ScalerPolicy(dynamic=True, initial_scale=8.0, window=2, hysteresis=2, min_scale=2.0)
    s = loss_scaler.initial_state(policy)
    trace = []
    for overflow in [True, True, True, True, False, False, False, False]:
        s = loss_scaler.update(s, policy, overflow)
        trace.append(s.scale)
    # 1st overflow spends hysteresis; then halve each time down to the floor 2; growth every 2 clean steps
    assert trace == [8.0, 4.0, 2.0, 2.0, 2.0, 4.0, 4.0, 8.0]


def test_consecutive_hysteresis_refills_after_a_clean_step() -> None:
    policy = loss_scaler.ScalerPolicy(dynamic=True, initial_scale=16.0, window=100, hysteresis=2,
                                      consecutive_hysteresis=True)
    s = loss_scaler.initial_state(policy)
    for overflow in [True, False, True]:
        s = loss_scaler.update(s, policy, overflow)
    assert s.scale == 16.0  # each overflow was absorbed by a refilled hysteresis


def test_static_scale_never_changes() -> None:
    policy = loss_scaler.constant(128.0)
    s = loss_scaler.update(loss_scaler.initial_state(policy), policy, True)
    assert s.scale == 128.0


def _lrs_at(sched: Scheduler, steps: tuple[int, ...]) -> list[float]:
    out = []
    for s in steps:
        sched.step(s)
        out.append(sched.get_lr()[0])
    return out


def test_schedules_follow_deepspeed_formulas() -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
    w = WarmupLR(opt, warmup_min_lr=0.0, warmup_max_lr=1.0, warmup_num_steps=10, warmup_type="linear")
    assert w.get_lr() == [0.0]  # before the first scheduler step (counter -1): DeepSpeed's "not started" value
    assert _lrs_at(w, (0, 5, 10, 50)) == [0.0, 0.5, 1.0, 1.0]
    log = WarmupLR(opt, warmup_max_lr=1.0, warmup_num_steps=10)
    assert _lrs_at(log, (0, 9)) == [0.0, pytest.approx(1.0)]
    assert _lrs_at(log, (3,)) == [pytest.approx(math.log(4) / math.log(10))]
    d = WarmupDecayLR(opt, total_num_steps=20, warmup_max_lr=1.0, warmup_num_steps=10, warmup_type="linear")
    assert _lrs_at(d, (10, 15, 20, 30)) == [1.0, 0.5, 0.0, 0.0]
    opt.param_groups[0]["lr"] = 2.0
    c = WarmupCosineLR(opt, total_num_steps=20, warmup_num_steps=10, cos_min_ratio=0.0, warmup_type="linear")
    assert c.get_lr() == [0.0]
    # DeepSpeed's cosine counts the first post-warm-up step as progress 1/(total - warmup)
    assert _lrs_at(c, (9, 14)) == [pytest.approx(1.8), pytest.approx(1.0)]
    assert _lrs_at(c, (19, 40)) == [pytest.approx(0.0, abs=1e-12), pytest.approx(0.0, abs=1e-12)]


def test_scheduler_sets_lr_on_every_group_and_steps() -> None:
    p = torch.nn.Parameter(torch.zeros(1))
    q = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [p]}, {"params": [q], "lr": 0.2}], lr=0.1)
    sched = build_scheduler("WarmupCosineLR", {"total_num_steps": 4, "warmup_num_steps": 2,
                                                "warmup_type": "linear"}, opt)
    assert isinstance(sched, Scheduler)
    assert sched.get_lr() == [0.0, 0.0]
    sched.step()  # counter 0: linear warm-up fraction 0/2
    assert sched.get_lr() == [0.0, 0.0]
    sched.step()
    assert sched.get_lr() == pytest.approx([0.05, 0.1])
    with pytest.raises(EngineError, match="warmup_steps"):
        build_scheduler("WarmupLR", {"warmup_steps": 3}, opt)


def test_clip_multiplier_equals_torch_clip_grad_norm() -> None:
    g = torch.tensor([3.0, 4.0])  # norm 5
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = g.clone()
    torch.nn.utils.clip_grad_norm_([p], 1.0)
    scale = 64.0
    mult = clip_multiplier(float((g * scale).square().sum()), scale, 1.0)
    torch.testing.assert_close(g * scale * mult, p.grad)
    assert clip_multiplier(25.0, 1.0, 0.0) == 1.0 and clip_multiplier(25.0, 1.0, 10.0) == 1.0


def test_config_lookup_order(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _config_from_argv(["--lr", "1", "--config", "a.yaml"]) == "a.yaml"
    assert _config_from_argv(["--deepspeed_config=b.json"]) == "b.json"
    monkeypatch.setenv("ZERORUN_CONFIG", "env.yaml")
    assert resolve_config_source({"x": 1}) == {"x": 1}
    assert resolve_config_source(None, argparse.Namespace(deepspeed_config="args.json")) == "args.json"
    assert resolve_config_source(None) == "env.yaml"
    monkeypatch.delenv("ZERORUN_CONFIG")
    monkeypatch.setattr("sys.argv", ["train.py"])
    with pytest.raises(EngineError, match="no engine config"):
        resolve_config_source(None)


def test_add_config_arguments_accepts_deepspeed_flags() -> None:
    parser = add_config_arguments(argparse.ArgumentParser())
    ns = parser.parse_args(["--deepspeed", "--deepspeed_config", "ds.json"])
    assert ns.deepspeed and ns.deepspeed_config == "ds.json"
    assert parser.parse_args(["--config", "z.yaml"]).deepspeed_config == "z.yaml"


def test_stage_policies() -> None:
    assert [policy_for_stage(s).shard_optimizer for s in (0, 1, 2)] == [False, True, True]
    assert [policy_for_stage(s).shard_gradients for s in (0, 1, 2)] == [False, False, True]
    with pytest.raises(EngineError, match="must be 0-3, got 5") as err:
        policy_for_stage(5)
    assert err.value.hint

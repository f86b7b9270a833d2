"""Optimizers built from the config follow DeepSpeed's meaning of the names."""

from __future__ import annotations

import torch

from zerorun.engine.training.optim_factory import build_optimizer


def _params() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.ones(4))]


def test_adam_means_adamw_as_in_deepspeed() -> None:
    opt = build_optimizer("Adam", {"lr": 1e-3, "weight_decay": 0.1}, _params())
    assert type(opt) is torch.optim.AdamW


def test_adam_and_adamw_default_to_no_weight_decay_as_deepspeed() -> None:
    """DeepSpeed builds FusedAdam/DeepSpeedCPUAdam (weight_decay 0); torch's AdamW alone would decay by 0.01."""
    for name in ("Adam", "AdamW"):
        assert build_optimizer(name, {"lr": 1e-3}, _params()).defaults["weight_decay"] == 0.0
    assert build_optimizer("AdamW", {"lr": 1e-3, "weight_decay": 0.1}, _params()).defaults["weight_decay"] == 0.1


def test_adam_w_mode_false_gives_plain_adam() -> None:
    opt = build_optimizer("Adam", {"lr": 1e-3, "adam_w_mode": False}, _params())
    assert type(opt) is torch.optim.Adam


def test_fused_is_not_combined_with_foreach() -> None:
    opt = build_optimizer("AdamW", {"lr": 1e-3, "fused": True}, _params())
    assert opt.defaults["fused"] is True
    assert not opt.defaults["foreach"]


def test_foreach_is_the_default_kernel() -> None:
    assert build_optimizer("SGD", {"lr": 0.1}, _params()).defaults["foreach"] is True

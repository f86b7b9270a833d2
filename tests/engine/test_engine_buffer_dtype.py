"""Buffers keep their dtype under fp16/bf16, at every stage (DeepSpeed 0.19.8's rule); parameters,
frozen ones included, take the compute dtype. World of one, in this process."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import zerorun

pytestmark = pytest.mark.usefixtures("world_of_one")  # tests/conftest.py


class Rotary(nn.Module):
    """A Llama-like ``inv_freq`` buffer (fp32), a frozen projection and a trained one."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8)), persistent=False)
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)
        self.out = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        angle = x.float() * self.inv_freq  # in fp32, as HF's rotary embedding computes it
        return self.out(self.frozen(angle.cos().to(x.dtype)))


@pytest.mark.parametrize("stage", [0, 2, 3])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_buffers_keep_their_dtype_parameters_take_the_compute_dtype(stage: int, precision: str) -> None:
    torch.manual_seed(0)
    model = Rotary()
    want = model.inv_freq.clone()
    cfg = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10**6, precision: {"enabled": True},
           "zero_optimization": {"stage": stage}, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}}
    engine, *_ = zerorun.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                    config=cfg)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    assert model.inv_freq.dtype == torch.float32 and torch.equal(model.inv_freq, want)  # not rounded to 16 bits
    assert model.frozen.weight.dtype == dtype and model.out.weight.dtype == dtype
    loss = engine(torch.randn(2, 4, dtype=dtype)).float().square().mean()  # inputs as given: in the compute dtype
    engine.backward(loss)
    engine.step()
    assert torch.isfinite(loss) and model.inv_freq.dtype == torch.float32
    engine.destroy()

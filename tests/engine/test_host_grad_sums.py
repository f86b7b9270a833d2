"""``optimizer.accumulated_grads_in_cpu`` (zerorun.engine.surface.host_grad_sums), as DeepSpeed 0.19.8's
ZeRO-1/2 optimizer has it under optimizer offload: the window's gradient sums in host memory.

One engine of one rank in this process per case, four micro-steps per step: after each backward the
mapping holds the accumulator's own host tensors (no copies), and their norm is the norm of the
gradient summed so far by one process on plain torch (each micro-step's loss over 4, as
``engine.backward`` scales it); after the step the window is empty again, and after
``set_train_batch_size`` leaves one micro-step per step it stays empty. At one micro-step per step it
is empty (DeepSpeed allocates none), and without offload the optimizer has no such attribute.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import zerorun

GAS = 4


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _config(stage: int, gas: int, offload: bool = True) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": stage}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    return {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": gas, "zero_optimization": zero,
            "zero_force_ds_cpu_optimizer": False}


def _batch(k: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(k)
    return torch.randn(2, 8, generator=g), torch.randn(2, 4, generator=g)


@pytest.mark.parametrize("stage", [1, 2])
def test_the_window_sums_in_host_memory(world_of_one: None, stage: int) -> None:
    model = _model()
    reference = _model()
    engine, *_ = zerorun.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                    config=_config(stage, GAS))
    sums = engine.optimizer.accumulated_grads_in_cpu
    assert len(sums) == 0  # nothing summed before the first backward
    accum = engine.parts.grad_sync.accum
    for k in range(GAS):
        x, y = _batch(k)
        engine.backward(nn.functional.mse_loss(engine(x), y))
        (nn.functional.mse_loss(reference(x), y) / GAS).backward()
        assert len(sums) == len(accum.buckets) >= 1
        assert all(t is accum.acc[i] and t.device.type == "cpu" for i, t in sums.items())
        got = torch.cat([t.float() for t in sums.values()]).norm()
        want = torch.cat([p.grad.flatten() for p in reference.parameters()]).norm()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
        engine.step()
    assert len(sums) == 0  # the step consumed the window
    engine.set_train_batch_size(2)  # one micro-step per step from now on: read at each access, so none
    x, y = _batch(0)
    engine.backward(nn.functional.mse_loss(engine(x), y))
    assert engine.gradient_accumulation_steps() == 1 and len(sums) == 0
    engine.step()


def test_one_micro_step_per_step_keeps_none(world_of_one: None) -> None:
    model = _model()
    engine, *_ = zerorun.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                    config=_config(2, 1))
    x, y = _batch(0)
    engine.backward(nn.functional.mse_loss(engine(x), y))
    assert len(engine.optimizer.accumulated_grads_in_cpu) == 0
    engine.step()


def test_no_offload_no_attribute(world_of_one: None) -> None:
    model = _model()
    engine, *_ = zerorun.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                    config=_config(2, GAS, offload=False))
    assert not hasattr(engine.optimizer, "accumulated_grads_in_cpu")

"""``engine.offload_states()`` / ``reload_states()`` at world 2: training after a round trip is bit-identical
to training without one, at stages 1-3 and under bf16 (separate masters); DeepSpeed's argument errors.

On a CPU-only machine the states are already in host memory, so this checks that the round trip
leaves every tensor where the engine can use it; the accelerator-memory drop is a GPU check.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import zerorun
from tests.dist_harness import run_distributed
from zerorun.compat.offload_config import OffloadStateTypeEnum
from zerorun.engine.errors import EngineError


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 9), nn.Tanh(), nn.Linear(9, 3))


def _train(rank: int, stage: int, precision: str | None, round_trip: bool) -> list[float]:
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(8, 5, generator=g)[rank * 4:][:4], torch.randn(8, 3, generator=g)[rank * 4:][:4]
    cfg = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 10**6, "zero_optimization": {"stage": stage},
           "optimizer": {"type": "AdamW", "params": {"lr": 0.02}}}
    if precision:
        cfg[precision] = {"enabled": True}
    engine, *_ = zerorun.initialize(model=_model(), config=cfg)
    losses = []
    for step in range(4):
        loss = nn.functional.mse_loss(engine(x.to(engine.precision.compute_dtype)).float(), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        if round_trip and step == 1:
            with pytest.warns(UserWarning, match="lp_grads, contiguous_grad_buffer stay on the device"):
                engine.offload_states()
            state_devices = {v.device.type for st in engine.optimizer.state.values() for v in st.values()
                             if torch.is_tensor(v)}
            engine.reload_states()
            engine.offload_states(include=[OffloadStateTypeEnum.optim_states], device="cpu")
            engine.reload_states()
            assert state_devices == {"cpu"}
    if round_trip:
        with pytest.raises(EngineError, match="nvme"):
            engine.offload_states(device="nvme")
        with pytest.raises(ValueError):
            engine.offload_states(include=["not_a_state"])
    engine.destroy()
    return losses


def _rank(rank: int, world: int) -> dict:
    cases = [(1, None), (2, "bf16"), (3, None)]
    return {f"{s}-{p}": (_train(rank, s, p, False), _train(rank, s, p, True)) for s, p in cases}


def test_training_after_a_round_trip_is_unchanged() -> None:
    for per_case in run_distributed(_rank, 2, timeout=240):
        for case, (plain, round_trip) in per_case.items():
            assert plain == round_trip, case
            assert round_trip[3] < round_trip[0], case  # it trains

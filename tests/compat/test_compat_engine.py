"""DeepSpeed's engine accessors (zerorun/engine/surface/ds_surface.py): what they report, no_sync parity.

Single-process tests read the accessors after real steps; the spawned test checks that
``no_sync`` at stages 0 and 1 gives, on 2 ranks, exactly the parameters of a single-process
reference that sums both micro-batches' gradients and averages over ranks, and that
stages 2/3 and ``step()`` inside ``no_sync`` are refused as DeepSpeed refuses them.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import zerorun
from tests.dist_harness import run_distributed
from zerorun.engine.errors import EngineError


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 6)
        self.b = nn.Linear(6, 2)
        self.vocab_size = 17  # a plain attribute scripts read through the engine

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))

    def describe(self) -> str:
        return "net"


def _cfg(stage: int = 0, gas: int = 1, **extra: object) -> dict:
    return {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": gas, "gradient_clipping": 0.0,
            "zero_optimization": {"stage": stage}, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, **extra}


def _train(engine, steps: int) -> None:
    for _ in range(steps):
        engine.backward(engine(torch.randn(2, 4)).pow(2).mean())
        engine.step()


def test_accessors_report_the_engine_state() -> None:
    torch.manual_seed(0)
    engine, *_ = zerorun.initialize(model=Net(), config=_cfg(stage=1, bf16={"enabled": False}))
    assert (engine.zero_optimization_stage(), engine.fp16_enabled(), engine.bfloat16_enabled()) == (1, False, False)
    assert (engine.global_rank, engine.world_size, engine.dp_world_size, engine.get_data_parallel_rank()) == (0, 1, 1, 0)
    assert engine.vocab_size == 17 and engine.describe() == "net"  # forwarded to the module
    with pytest.raises(AttributeError, match="no_such_thing"):
        _ = engine.no_such_thing
    assert engine.module_state_dict().keys() == engine.module.state_dict().keys()
    assert engine.tput_timer.avg_samples_per_sec() == 0.0  # nothing timed yet
    _train(engine, 3)
    assert engine.tput_timer.avg_samples_per_sec() > 0 and engine.tput_timer.global_step_count == 3


def test_was_step_applied_follows_boundaries_and_skips() -> None:
    engine, *_ = zerorun.initialize(model=Net(), config=_cfg(gas=2))
    assert not engine.was_step_applied()
    _train(engine, 1)
    assert not engine.was_step_applied()  # not a boundary
    _train(engine, 1)
    assert engine.was_step_applied()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):  # an inf loss: the boundary step is skipped
            engine.backward(engine(torch.randn(2, 4)).sum() * float("inf"))
            engine.step()
    assert not engine.was_step_applied() and engine.skipped_steps == 1


def test_set_gradient_accumulation_boundary_overrides_the_count() -> None:
    engine, *_ = zerorun.initialize(model=Net(), config=_cfg(gas=4))
    before = [p.detach().clone() for p in engine.parameters()]
    for boundary in (False, False, True):
        engine.set_gradient_accumulation_boundary(boundary)
        _train(engine, 1)
    assert engine.global_steps == 1 and engine.was_step_applied()
    assert any(not torch.equal(a, b) for a, b in zip(before, engine.parameters(), strict=True))


def test_destroy_removes_the_engine_hooks() -> None:
    model = Net()
    engine, *_ = zerorun.initialize(model=model, config=_cfg())
    assert engine.parts.hooks
    engine.destroy()
    assert not engine.parts.hooks
    assert all(not p._post_accumulate_grad_hooks for p in model.parameters())


def _no_sync_run(rank: int, world: int) -> dict:
    out: dict = {}
    for stage in (0, 1):
        torch.manual_seed(0)
        engine, *_ = zerorun.initialize(model=Net(), config=_cfg(stage=stage))
        for step in range(3):
            g = torch.Generator().manual_seed(100 * step + rank)
            xa, xb = torch.randn(2, 4, generator=g), torch.randn(2, 4, generator=g)
            with engine.no_sync():
                before = engine.comm_stats()
                engine.backward(engine(xa).pow(2).mean())
                assert engine.comm_stats() == before  # no communication inside no_sync
                with pytest.raises(EngineError, match=r"\[rank \d\] It is illegal to call Engine.step\(\) inside no_sync"):
                    engine.step()
            engine.backward(engine(xb).pow(2).mean())
            engine.step()
        out[stage] = [p.detach().clone() for p in engine.parameters()]
    for stage in (2, 3):
        engine, *_ = zerorun.initialize(model=Net(), config=_cfg(stage=stage))
        with pytest.raises(EngineError, match=f"incompatible with gradient partitioning logic of ZeRO stage {stage}"), \
                engine.no_sync():
            pass
    return out


def _reference(world: int) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        opt.zero_grad()
        loss = 0.0
        for rank in range(world):
            g = torch.Generator().manual_seed(100 * step + rank)
            xa, xb = torch.randn(2, 4, generator=g), torch.randn(2, 4, generator=g)
            loss = loss + (model(xa).pow(2).mean() + model(xb).pow(2).mean()) / world
        loss.backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


def test_no_sync_accumulates_locally_and_matches_reference() -> None:
    results = run_distributed(_no_sync_run, 2, timeout=180)
    ref = _reference(2)
    for stage in (0, 1):
        for rank_out in results:
            for got, want in zip(rank_out[stage], ref, strict=True):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)

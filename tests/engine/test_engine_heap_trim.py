"""On the CPU the engine hands glibc's free heap back before and after each optimizer step (not at a
micro-step inside an accumulation) when much of it is free (over 32 MiB and a quarter of the resident
set), and not at all with ZERORUN_TRIM_HEAP=0."""

from __future__ import annotations

import pytest
import torch

from zerorun.engine import physical_memory


def _train(monkeypatch: pytest.MonkeyPatch, micro_steps: int, free: int = 2**30) -> list[str]:
    import zerorun

    calls: list[str] = []
    monkeypatch.setattr(physical_memory, "trim_heap", lambda: calls.append("trim"))
    monkeypatch.setattr(physical_memory, "free_heap_bytes", lambda: free)  # what glibc says it holds free
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 1}}
    engine, *_ = zerorun.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    for i in range(micro_steps):
        engine.backward(engine(torch.randn(2, 4)).pow(2).mean())
        calls.append(f"stepped {i}" if engine.is_gradient_accumulation_boundary() else f"micro {i}")
        engine.step()
    return calls


def test_the_heap_is_trimmed_around_each_optimizer_step(world_of_one: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ZERORUN_TRIM_HEAP", raising=False)
    calls = _train(monkeypatch, 4)
    # micro-step 0 accumulates (no trim); 1 steps: backward's free chunks first, the step's own after
    assert calls == ["micro 0", "stepped 1", "trim", "trim", "micro 2", "stepped 3", "trim", "trim"]


def test_a_heap_with_little_free_is_left_alone(world_of_one: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ZERORUN_TRIM_HEAP", raising=False)
    assert "trim" not in _train(monkeypatch, 2, free=physical_memory.TRIM_ABOVE)
    # over 32 MiB but under a quarter of the resident set: a step's usual churn, not retention that grows
    monkeypatch.setattr(physical_memory, "host_bytes", lambda key: 8 * 2**30 if key == "VmRSS" else None)
    assert "trim" not in _train(monkeypatch, 2, free=2**31 - 1)
    assert "trim" in _train(monkeypatch, 2, free=2**31 + 1)
    assert physical_memory._MALLINFO2 is not None  # glibc >= 2.33 here: the real figure is read


def test_zerorun_trim_heap_0_keeps_the_heap(world_of_one: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZERORUN_TRIM_HEAP", "0")
    assert "trim" not in _train(monkeypatch, 2)

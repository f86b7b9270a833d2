"""The examples hand the engine, and the loss, tensors that were moved to ``engine.device``.

No GPU here, so ``engine.device`` is the CPU and a forgotten ``.to(engine.device)`` would
not crash. Instead a TorchFunctionMode tracks which tensors come from ``engine.device``: the
results of ``Tensor.to(engine.device)``, the engine's outputs, and anything computed from
them. The engine's input and every tensor argument of the loss must be tracked; a batch
straight from the data (a CPU tensor, which on a GPU would crash) is not. The examples
run in-process, world size 1, for two steps of a tiny model.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import zerorun

ROOT = Path(__file__).resolve().parents[2]


class OnDevice(TorchFunctionMode):
    """Remembers every tensor moved to ``device`` or computed from one."""

    def __init__(self) -> None:
        super().__init__()
        self.device: torch.device | None = None
        self.tracked: dict[int, torch.Tensor] = {}  # id -> tensor (kept alive so ids stay unique)

    def mark(self, out: Any) -> Any:
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if torch.is_tensor(t):
                self.tracked[id(t)] = t
        return out

    def has(self, t: torch.Tensor) -> bool:
        return id(t) in self.tracked

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        moved = func is torch.Tensor.to and self.device is not None and any(
            (isinstance(a, (torch.device, str)) and torch.device(a) == self.device)
            for a in (*args[1:], kwargs.get("device")) if a is not None)
        inputs = [a for a in (*args, *kwargs.values()) if torch.is_tensor(a)]
        if moved or any(self.has(a) for a in inputs):
            self.mark(out)
        return out


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, argv: list[str], loss: str) -> dict[str, int]:
    mode, seen = OnDevice(), {"engine_inputs": 0, "loss_calls": 0}
    real_initialize, real_loss = zerorun.initialize, getattr(F, loss)

    class Watched:
        def __init__(self, engine: Any) -> None:
            self.__dict__["engine"] = engine

        def __getattr__(self, attr: str) -> Any:
            return getattr(self.engine, attr)

        def __call__(self, x: torch.Tensor) -> torch.Tensor:
            assert mode.has(x), f"{name}: the batch given to the engine was not moved to engine.device"
            seen["engine_inputs"] += 1
            return mode.mark(self.engine(x))

    def initialize(*args: Any, **kwargs: Any) -> Any:
        engine, *rest = real_initialize(*args, **kwargs)
        mode.device = engine.device
        return (Watched(engine), *rest)

    def checked_loss(*args: Any, **kwargs: Any) -> torch.Tensor:
        for a in (*args, *kwargs.values()):
            if torch.is_tensor(a):
                assert mode.has(a), f"{name}: a tensor given to F.{loss} is not on engine.device (the targets?)"
        seen["loss_calls"] += 1
        return real_loss(*args, **kwargs)

    config = tmp_path / "cfg.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10**6,
                                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                                  "zero_optimization": {"stage": 2}}))
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "ZERORUN_CONFIG"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(zerorun, "initialize", initialize)
    monkeypatch.setattr(F, loss, checked_loss)
    monkeypatch.setattr(sys, "argv", [name, "--config", str(config), "--steps", "2", *argv])
    module = _load(name)
    ours = not dist.is_initialized()  # another test's default group is reused, and left as it was
    try:
        with mode:
            module.main()
    finally:
        if ours and dist.is_initialized():
            dist.destroy_process_group()
    return seen


def test_toy_example_moves_batches_to_engine_device(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen = _run(monkeypatch, tmp_path, "train_toy", ["--hidden", "8", "--layers", "1"], "mse_loss")
    assert seen["engine_inputs"] == 2 and seen["loss_calls"] >= 2


def test_gpt_example_moves_batches_to_engine_device(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen = _run(monkeypatch, tmp_path, "train_gpt", ["--dim", "8", "--layers", "1", "--heads", "2",
                                                     "--block", "8"], "cross_entropy")
    assert seen["engine_inputs"] == 2 and seen["loss_calls"] >= 2

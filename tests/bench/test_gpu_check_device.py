"""bench/gpu_check_device.py's sync count measures the engine, not the loop around it.

The count runs ``set_sync_debug_mode("warn")`` over the steps; a batch copied to the GPU inside
that loop is a blocking copy (two syncs per step), which 9b6a4ae counted against the engine's
budget of one (the norm). The batches are now built before counting begins: shown here with a
recording stand-in for the engine (no CUDA needed to see the order).
"""

from __future__ import annotations

import torch

from bench.gpu_check_device import count_syncs


def test_every_batch_is_built_before_the_first_counted_step() -> None:
    log: list[str] = []

    class Engine:
        device = torch.device("cpu")

        def __call__(self, x: torch.Tensor) -> torch.Tensor:
            log.append("forward")
            return x

        def backward(self, loss: torch.Tensor) -> None:
            log.append("backward")

        def step(self) -> None:
            log.append("step")

    def make_batch(i: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        log.append("batch")
        return torch.zeros(1), torch.zeros(1)

    out = count_syncs(Engine(), 3, make_batch, lambda out, y: out.sum())
    assert log[:3] == ["batch"] * 3 and "batch" not in log[3:], log
    assert log[3:] == ["forward", "backward", "step"] * 3
    assert out["passed"] and out["syncs"] is None  # no CUDA: nothing to count

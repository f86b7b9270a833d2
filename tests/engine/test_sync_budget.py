"""The host-sync budget: at most one host sync per optimizer step, none per micro-step.

On a GPU every ``.item()`` / ``float(tensor)`` / ``bool(tensor)`` waits for all queued work;
one per step is the global gradient norm (skip-or-clip needs its value on the host). A
``TorchDispatchMode`` counts ``aten._local_scalar_dense`` (what each of them dispatches to)
when the code that asked for the scalar is ``zerorun/engine``'s, so the test's own
``float(loss)`` does not count, nor torch's optimizers reading their ``step`` counters (CPU
tensors on a GPU too, unless ``capturable``). Two gloo ranks, stages 0-2, fp32 / bf16 / fp16 (dynamic loss scaling), with
gradient accumulation and clipping, on the NCCL policy (``ZERORUN_CHECK_COLLECTIVES=native``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import zerorun.engine
from tests.dist_harness import run_distributed
from tests.engine.test_engine_cases import MICRO_BATCH, global_batch, loss_fn, make_model, rank_rows
from zerorun.engine.comm.checks import CHECK_ENV

ENGINE_DIR = str(Path(zerorun.engine.__file__).parent)  # as the frames name their files (not resolved)
_TORCH = Path(torch.__file__).parent
# the frames the dispatch machinery itself adds between the caller and the mode
PLUMBING = tuple(str(p) for p in (_TORCH / "_dynamo", _TORCH / "_compile.py", _TORCH / "utils" / "_python_dispatch.py",
                                  _TORCH / "_tensor.py"))


class HostSyncs(TorchDispatchMode):
    """Counts scalar reads to the host issued from engine code."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.where: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if func is torch.ops.aten._local_scalar_dense.default:
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.startswith(PLUMBING):
                frame = frame.f_back
            if frame is not None and frame.f_code.co_filename.startswith(ENGINE_DIR):
                self.count += 1
                self.where.append(f"{frame.f_code.co_filename}:{frame.f_lineno}")
        return func(*args, **(kwargs or {}))


def _config(stage: int, dtype: str) -> dict:
    cfg: dict = {"train_micro_batch_size_per_gpu": MICRO_BATCH, "gradient_accumulation_steps": 2,
                 "gradient_clipping": 0.5, "steps_per_print": 10**6,
                 "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
                 "zero_optimization": {"stage": stage, "reduce_bucket_size": 60, "overlap_comm": stage == 2}}
    if dtype != "fp32":
        cfg[dtype] = {"enabled": True}
    return cfg


def _count(rank: int, world: int) -> dict[str, list[tuple[int, list[str]]]]:
    import os

    os.environ[CHECK_ENV] = "native"  # the GPU's path: native collectives (the CPU-only shared-memory lane
    import zerorun  # reads its counters as host scalars, which is no device sync)

    out = {}
    for stage in (0, 1, 2):
        for dtype in ("fp32", "bf16", "fp16"):
            model = make_model()
            engine, _, _, _ = zerorun.initialize(model=model, config=_config(stage, dtype))
            counts = []
            for step in range(3):
                x, y = global_batch(step, MICRO_BATCH * world * 2)
                for k in range(2):
                    sl = rank_rows(k, rank, world)
                    with HostSyncs() as syncs:
                        loss = loss_fn(engine(x[sl].to(next(model.parameters()).dtype)), y[sl])
                        engine.backward(loss)
                        engine.step()
                    counts.append((syncs.count, syncs.where))
            out[f"stage{stage}-{dtype}"] = counts
    return out


@pytest.mark.timeout(200)
def test_one_host_sync_per_optimizer_step_and_none_per_micro_step() -> None:
    for per_rank in run_distributed(_count, 2, timeout=180):
        for case, counts in per_rank.items():
            micro, boundary = counts[0::2], counts[1::2]
            assert all(n == 0 for n, _ in micro), (case, micro)
            assert all(n <= 1 for n, _ in boundary), (case, boundary)

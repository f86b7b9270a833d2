"""NVMe offload keeps only a bounded amount of host memory pinned (the deferred-copy stand-in counts it).

torch's caching host allocator keeps every pinned block it ever handed out, so what a run
keeps pinned is the peak of its live pinned buffers. With parameters and optimizer on NVMe
that peak is the staging ring (two slots of the largest shard; while a slot grows to a larger
shard, the one it replaces too) and the gradient sums (in host memory from backward on,
zerorun.engine.offload.host_grads); the masters and the parameter shards rest in files, so their host copies on
the way there are pageable. 9b6a4ae pinned a fresh host copy of every stepped shard before
writing it out, and the initial masters, so NVMe kept as much pinned as CPU offload.
The stand-in (``ZERORUN_CHECK_COPIES=deferred``) stands for CUDA; its "pinned" buffers are
counted by :class:`tests.engine.setup_ledger.Ledger` from their creation to their release.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import zerorun
from tests.engine.setup_ledger import Ledger
from tests.engine.test_engine_stage3_cases import MICRO_BATCH, global_batch, loss_fn, make_model
from zerorun.engine.offload import copy_checks

STEPS = 3


def _pinned_peak(kind: str, root: Path) -> dict[str, Any]:
    model = make_model("mlp")
    place = ({"device": "nvme", "nvme_path": str(root), "pin_memory": True, "buffer_count": 2} if kind == "nvme"
             else {"device": "cpu", "pin_memory": True})
    cfg = {"train_micro_batch_size_per_gpu": MICRO_BATCH, "gradient_clipping": 0.0,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
           "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                 "offload_param": place, "offload_optimizer": place}}
    ledger = Ledger("cpu", lambda: copy_checks.stream().allocating_host)
    with ledger:
        engine, *_ = zerorun.initialize(model=model, config=cfg)
        for step in range(STEPS):
            x, y = global_batch("mlp", step, MICRO_BATCH)
            engine.backward(loss_fn("mlp", engine(x), y))
            engine.step()
    buckets = engine.parts.buckets
    shard = [b.shard_numel * b._placeholder.element_size() for b in buckets]
    out = {"peak": ledger.peak["pinned"], "ring": 2 * max(shard), "shard": max(shard), "grads": sum(4 * b.shard_numel for b in buckets),
           "shards": sum(shard), "stand_in": isinstance(engine.parts.param_offload.copies,
                                                        copy_checks.DeferredTransfers)}
    engine.parts.param_offload.close()
    if kind == "nvme":
        engine.parts.masters.close()
    return out


def test_nvme_keeps_the_ring_and_the_gradients_pinned_no_more(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(copy_checks.CHECK_ENV, "deferred")
    monkeypatch.setattr(copy_checks, "_STREAM", [])
    nvme = _pinned_peak("nvme", tmp_path / "swap")
    cpu = _pinned_peak("cpu", tmp_path / "unused")
    assert nvme["stand_in"] and nvme["peak"] > 0
    assert nvme["grads"] <= nvme["peak"] <= nvme["ring"] + nvme["shard"] + nvme["grads"], nvme
    # cpu offload pins the resting shards and the fp32 masters (as many bytes as the sums) besides the same
    # gradient sums (fp32 reductions land straight in them: no landing slot)
    assert cpu["peak"] == cpu["shards"] + 2 * cpu["grads"], (nvme, cpu)

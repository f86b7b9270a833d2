"""The GPU check's device checks: collectives, the stream sanitizer, host syncs, throughput.

Imported by bench/gpu_check.py (which documents every check and what one GPU cannot
prove). Each function returns one check's figures with ``passed``; on the CPU (the dry
mode) the same code runs on gloo with tiny sizes, and the figures only a GPU has are
``None``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from zerorun.engine.comm.collectives import Collectives
from zerorun.estimate.memory_model import DEFAULT_OVERHEAD

ROOT = Path(__file__).resolve().parents[1]


def check_collectives(device: torch.device) -> dict[str, Any]:
    """The engine's collectives on the world group at world size 1, issued (``live_at_one``) so that
    NCCL's kernels run: values, the counter, and the device memory outside the allocator (CUDA
    context and NCCL's buffers) against the estimate's fixed overhead."""
    coll = Collectives(dist.group.WORLD, 1, 0, live_at_one=True)
    x = torch.arange(1024, dtype=torch.float32, device=device)
    results = {}
    for kind, async_op in (("all_reduce", False), ("all_reduce", True), ("reduce_scatter", True),
                           ("all_gather", True)):
        t = x.clone()
        getattr(coll, kind)(t, async_op=async_op).wait()
        results[f"{kind}{'-async' if async_op else ''}"] = bool(torch.equal(t, x))  # world 1: the identity
    t = x.clone()
    coll.broadcast(t, src=0)
    results["broadcast"] = bool(torch.equal(t, x))
    calls = {k: v["calls"] for k, v in coll.counter.snapshot().items()}
    out: dict[str, Any] = {"values_ok": results, "calls": calls, "native": coll.native_reduce_scatter,
                           "overhead_estimate": DEFAULT_OVERHEAD, "outside_allocator": None}
    ok = all(results.values()) and calls == {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1, "broadcast": 1}
    if device.type == "cuda":
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info(device)
        out["outside_allocator"] = (total - free) - torch.cuda.memory_reserved(device)  # context + NCCL
        ok = ok and out["native"] and out["outside_allocator"] <= DEFAULT_OVERHEAD
    out["passed"] = ok
    return out


def check_sanitizer(cpu: bool, scratch: Path) -> dict[str, Any]:
    """The parity checks again in a child process under ``TORCH_CUDA_SANITIZER=1``, every collective
    issued (``ZERORUN_CHECK_COLLECTIVES=live``): every kernel's
    reads and writes are checked against the streams' order (a missing wait_stream/record_stream
    is reported as a data race). On the CPU there are no streams (and a CPU build of torch refuses
    the variable): the same child runs unchecked."""
    out_dir = scratch / "sanitizer"
    argv = [sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--only", "parity/stage", "--out", str(out_dir)]
    # every collective issued at world 1 (live): NCCL's stream then exists beside the compute stream, so
    # the sanitizer has two streams' order to check (without it every kernel ran on one stream)
    env = {**os.environ, "ZERORUN_CHECK_COLLECTIVES": "live"}
    if not cpu:
        env["TORCH_CUDA_SANITIZER"] = "1"  # a CPU build cannot enable it
    proc = subprocess.run(argv + (["--cpu"] if cpu else []), env=env, capture_output=True, text=True, timeout=300)
    races = proc.stderr.count("CSAN detected a possible data race")
    return {"passed": proc.returncode == 0 and races == 0, "returncode": proc.returncode, "races": races,
            "sanitized": not cpu,
            "child_seconds": _child_seconds(out_dir), "stderr_tail": proc.stderr[-2000:]}


def _child_seconds(out_dir: Path) -> float | None:
    import json

    summary = out_dir / "summary.json"
    return json.loads(summary.read_text()).get("seconds") if summary.exists() else None


def count_syncs(engine: Any, steps: int, make_batch: Any, loss_of: Any) -> dict[str, Any]:
    """Host syncs during ``steps`` optimizer steps, as ``set_sync_debug_mode("warn")`` reports
    them (the loop itself reads no loss); budget: one per step (the gradient norm)."""
    cuda = engine.device.type == "cuda"
    # the batches are on the device before counting: a blocking host->device copy is two syncs of
    # the loop, not of the engine (9b6a4ae built them in the loop: 3 per step against a budget of 1)
    batches = [make_batch(step, engine.device) for step in range(steps)]
    if cuda:
        torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            for x, y in batches:
                engine.backward(loss_of(engine(x), y))
                engine.step()
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode("default")
    # one line per sync ("called a synchronizing CUDA operation"); the mode's own first-use notice
    # ("Synchronization debug mode is a prototype feature ...") is no sync (it made stage 0, the first
    # counted, read 6 over 5 steps on an H200)
    syncs = [str(w.message).splitlines()[0] for w in caught if "called a synchronizing" in str(w.message)]
    return {"syncs": len(syncs) if cuda else None, "per_step": len(syncs) / steps if cuda else None,
            "first": syncs[:5], "passed": (not cuda) or len(syncs) <= steps}


def model_flops_per_token(params: int, layers: int, dim: int, seq: int) -> float:
    """Training FLOPs per token: 6 per parameter (forward + backward) plus attention's
    ``12 * layers * dim * seq`` (PaLM's appendix B accounting, no recomputation)."""
    return 6.0 * params + 12.0 * layers * dim * seq


def measure_throughput(engine: Any, steps: int, tokens_per_step: int, flops_per_token: float,
                       make_batch: Any, loss_of: Any) -> dict[str, Any]:
    """Tokens/s and model TFLOPs over ``steps`` steps after two warm-up steps."""
    batches = [make_batch(i, engine.device) for i in range(2)]

    def step(i: int) -> None:
        x, y = batches[i % 2]
        engine.backward(loss_of(engine(x), y))
        engine.step()

    for i in range(2):
        step(i)
    cuda = engine.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        step(i)
    if cuda:
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - t0) / steps
    tokens_s = tokens_per_step / seconds
    return {"step_seconds": seconds, "tokens_per_s": tokens_s, "model_tflops": tokens_s * flops_per_token / 1e12,
            "max_memory_allocated": torch.cuda.max_memory_allocated() if cuda else None,
            "max_memory_reserved": torch.cuda.max_memory_reserved() if cuda else None,
            "passed": seconds > 0}

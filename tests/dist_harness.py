"""Spawn a gloo process group on CPU, run one function on every rank, return each rank's result.

One spawned group runs many sub-cases (the function loops over them), so a world size
costs one process start-up. Ranks fork from a forkserver that imported torch once (a clean,
single-threaded interpreter: nothing a pytest process holds, no lock, no thread, is
inherited), so a group starts in a fraction of a second instead of importing torch per
rank; each rank gets the caller's environment as it is at the call. Rendezvous is a file (``init_method=file://``); a hard
timeout turns a hang into a failure and kills every rank; an exception on any rank is
re-raised in the parent with that rank's traceback.
"""

from __future__ import annotations

import os
import pickle
import queue
import tempfile
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from zerorun.torch_compat import compiler_runtime_module


class RankFailure(AssertionError):
    pass


# What the forkserver imports once, before it forks any rank: torch, and the compiler runtime the first
# torch.optim optimizer imports lazily (zerorun.initialize loads it: ~1.2 s of CPU a rank otherwise; it
# starts no thread).
_PRELOAD = ["torch", "torch.distributed", compiler_runtime_module(), "dist_harness"]


def _context() -> Any:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def _entry(fn: Callable[..., Any], rank: int, world_size: int, init_file: str, results: Any,
           args: tuple[Any, ...], environ: dict[str, str]) -> None:
    try:
        os.environ.clear()
        os.environ.update(environ)  # the caller's, now: the server's is the one it started with
        torch.set_num_threads(1)
        os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size)})
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=120))
        out = fn(rank, world_size, *args)
        results.put((rank, "ok", pickle.dumps(out)))  # plain bytes: no shared-memory fds
        dist.destroy_process_group()
    except BaseException:  # report everything, including assertion failures, to the parent
        results.put((rank, "error", traceback.format_exc()))


def run_distributed(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 240,
                    grace: float = 5) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; results ordered by rank.

    Once a rank fails, the others get ``grace`` seconds each to finish before they are killed."""
    ctx = _context()
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=_entry, args=(fn, r, world_size, init_file, results, args, dict(os.environ)),
                             daemon=True)
                 for r in range(world_size)]
        for p in procs:
            p.start()
        collected: dict[int, tuple[str, Any]] = {}
        try:
            deadline_each = timeout
            while len(collected) < world_size:
                try:
                    rank, status, payload = results.get(timeout=deadline_each)
                except queue.Empty:
                    missing = sorted(set(range(world_size)) - set(collected))
                    raise RankFailure(f"ranks {missing} did not finish within {timeout:.0f} s (hang?)") from None
                collected[rank] = (status, payload)
                if status == "error":
                    raise RankFailure(f"[rank {rank}] failed:\n{payload}")
        finally:
            for p in procs:
                p.join(timeout=grace)
                if p.is_alive():
                    p.kill()
                    p.join()
    return [pickle.loads(collected[r][1]) for r in range(world_size)]


def assert_matches_reference(case, world: int, per_rank: list[dict], steps: int,
                             ref_losses: list[float], ref_params: list) -> None:
    """N-rank results of one case against the single-process reference, step by step.

    The global-batch loss of a step is the mean of every rank's micro-batch losses. The
    tolerances (fp32 rtol 1e-5; bf16 2^-8 on losses, 2^-7 + 0.1 x lr per step on
    parameters) are derived in the docstring of tests/engine/test_engine_parity.py.
    """
    import torch

    losses = [sum(sum(r["losses"][s]) for r in per_rank) / (world * case.gas) for s in range(steps)]
    fp32 = case.dtype == "fp32"
    rtol = 1e-5 if fp32 else 2**-8
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=rtol, atol=1e-6)
    atol = 1e-6 if fp32 else 0.1 * case.lr * steps
    for rank, r in enumerate(per_rank):
        assert r["global_steps"] == steps
        assert len(r["params"]) == len(ref_params)
        for got, want in zip(r["params"], ref_params, strict=True):
            torch.testing.assert_close(got, want, rtol=rtol if fp32 else 2**-7, atol=atol,
                                       msg=lambda m, rank=rank: f"[rank {rank}] {case.name}: {m}")

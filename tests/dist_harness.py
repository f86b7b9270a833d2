"""Spawn a gloo process group on CPU, run one function on every rank, return each rank's result.

One spawned group runs many sub-cases (the function loops over them), so a world size
costs one process start-up. Rendezvous is a file (``init_method=file://``); a hard
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


class RankFailure(AssertionError):
    pass


def _entry(fn: Callable[..., Any], rank: int, world_size: int, init_file: str, results: Any,
           args: tuple[Any, ...]) -> None:
    try:
        torch.set_num_threads(1)
        os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size)})
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=120))
        out = fn(rank, world_size, *args)
        results.put((rank, "ok", pickle.dumps(out)))  # plain bytes: no shared-memory fds
        dist.destroy_process_group()
    except BaseException:  # report everything, including assertion failures, to the parent
        results.put((rank, "error", traceback.format_exc()))


def run_distributed(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 240) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; results ordered by rank."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=_entry, args=(fn, r, world_size, init_file, results, args), daemon=True)
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
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
                    p.join()
    return [pickle.loads(collected[r][1]) for r in range(world_size)]

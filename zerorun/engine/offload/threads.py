"""How many threads the host step runs on: the node's cores split by the local ranks stepping with it.

While the host steps the masters, the rank's own device work waits for it, and so does
every other rank of the node: data parallelism steps in lockstep (the reductions before the
step are a barrier, and the all-gather or the next forward after it another), so the
ranks in the step at that moment are the node's local ranks. The step therefore gets
``cores // LOCAL_WORLD_SIZE`` threads (or the local size ``mpirun`` gives, :data:`LOCAL_RANKS_ENV`),
``cores`` being the cores this process may run on (``sched_getaffinity``), or
``OMP_NUM_THREADS`` when that is larger (a rank bound with ``--bind_cores_to_rank`` sees only
its share in its affinity), never more than its affinity;
``torch``'s thread count is put back after the step (forward and backward keep the launcher's share).

How this agrees with the launcher: ``zerorun`` sets each rank's ``OMP_NUM_THREADS`` to the
node's cores over its local ranks, the same share, so under it this changes nothing on a
node where every rank steps on the host. It matters where a rank started with fewer:
``torchrun`` sets ``OMP_NUM_THREADS=1`` for every rank, which would leave the host step (the
run's speed with offload on a GPU node) on one core per rank and the rest idle.
``ZERORUN_STEP_THREADS`` sets the count by hand.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping

import torch

STEP_THREADS_ENV = "ZERORUN_STEP_THREADS"
# the ranks on this node, as each launcher says it (zerorun and torchrun; DeepSpeed's; Open MPI's; MPICH's):
# a rank that mpirun starts directly sees no LOCAL_WORLD_SIZE and would otherwise step on every core
LOCAL_RANKS_ENV = ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")


def _count(env: Mapping[str, str], key: str) -> int:
    value = env.get(key, "").strip()
    return int(value) if value.isdigit() else 0


def step_threads(env: Mapping[str, str] = os.environ, affinity: int | None = None) -> int:
    """Threads for this rank's host step (see the module docstring)."""
    if _count(env, STEP_THREADS_ENV) > 0:
        return _count(env, STEP_THREADS_ENV)
    cores = affinity if affinity is not None else len(os.sched_getaffinity(0))
    local = next((n for n in (_count(env, key) for key in LOCAL_RANKS_ENV) if n > 0), 1)
    share = cores // local
    # a share the launcher gave (OMP_NUM_THREADS) is kept when larger: a rank bound to its own cores
    # (--bind_cores_to_rank) sees only those in its affinity, and they are all its own
    return max(1, min(cores, max(share, _count(env, "OMP_NUM_THREADS"))))


@contextlib.contextmanager
def threads_for_step(n: int) -> Iterator[None]:
    """torch's intra-op threads at ``n`` for the span, then back to what they were."""
    before = torch.get_num_threads()
    if n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)

"""``--bind_cores_to_rank``: each local rank gets its own contiguous share of the node's cores.

As DeepSpeed's launcher does, the cores (``--bind_core_list``, else the ones the agent
may run on) are split evenly over the node's ranks, the remainder left unused, and each
rank's ``OMP_NUM_THREADS`` is its share. The agent applies the share with
``os.sched_setaffinity`` in the child before it execs, so every thread the rank starts
inherits it.
"""

from __future__ import annotations

import os

from launcher.errors import LaunchError
from launcher.plan.hostnames import MAX_CORES, bounded_range


def parse_core_list(text: str) -> list[int]:
    """``"0,2-4"`` -> ``[0, 2, 3, 4]`` (DeepSpeed's ``--bind_core_list`` syntax)."""
    cores: set[int] = set()
    for item in text.split(","):
        span = bounded_range(item, MAX_CORES)
        if span is None:
            raise LaunchError(f"--bind_core_list {text[:80]!r}: bad item {item[:40]!r}",
                              f"give cores like 0,2-5 (ranges run upwards, ids below {MAX_CORES})")
        cores.update(span)
    return sorted(cores)


def available_cores(core_list: str | None) -> list[int]:
    return parse_core_list(core_list) if core_list else sorted(os.sched_getaffinity(0))


def core_share(cores: list[int], local_rank: int, local_world: int) -> list[int]:
    """The cores of ``local_rank`` out of ``local_world`` ranks: an even, contiguous share."""
    per_rank = len(cores) // local_world
    if per_rank < 1:
        raise LaunchError(f"--bind_cores_to_rank: {len(cores)} core(s) for {local_world} ranks on this node",
                          "start fewer ranks per node, or give more cores with --bind_core_list")
    return cores[local_rank * per_rank:(local_rank + 1) * per_rank]

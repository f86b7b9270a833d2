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


def parse_core_list(text: str) -> list[int]:
    """``"0,2-4"`` -> ``[0, 2, 3, 4]`` (DeepSpeed's ``--bind_core_list`` syntax)."""
    cores: list[int] = []
    for item in text.split(","):
        lo, sep, hi = item.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()) or (sep and int(hi) < int(lo)):
            raise LaunchError(f"--bind_core_list {text!r}: bad item {item!r}", "give cores like 0,2-5")
        cores.extend(range(int(lo), int(hi if sep else lo) + 1))
    return sorted(set(cores))


def available_cores(core_list: str | None) -> list[int]:
    return parse_core_list(core_list) if core_list else sorted(os.sched_getaffinity(0))


def core_share(cores: list[int], local_rank: int, local_world: int) -> list[int]:
    """The cores of ``local_rank`` out of ``local_world`` ranks: an even, contiguous share."""
    per_rank = len(cores) // local_world
    if per_rank < 1:
        raise LaunchError(f"--bind_cores_to_rank: {len(cores)} core(s) for {local_world} ranks on this node",
                          "start fewer ranks per node, or give more cores with --bind_core_list")
    return cores[local_rank * per_rank:(local_rank + 1) * per_rank]

"""The nodes of a Slurm allocation, for ``--launcher slurm`` without a hostfile.

Inside ``salloc``/``sbatch`` the allocation is the hostfile: its nodes in Slurm's order
(``scontrol show hostnames $SLURM_JOB_NODELIST``) with the tasks Slurm gave each one
(``SLURM_TASKS_PER_NODE``, e.g. ``2(x3),1``) as slots; ``--num_gpus`` overrides the count.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Mapping

from launcher.errors import LaunchError
from launcher.plan.hostfile import Host
from launcher.plan.hostnames import host_problem


def tasks_per_node(text: str) -> list[int]:
    """``"2(x3),1"`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for item in filter(None, text.split(",")):
        match = re.fullmatch(r"(\d{1,4})(?:\(x(\d{1,6})\))?", item.strip(), flags=re.ASCII)
        if not match:
            raise LaunchError(f"SLURM_TASKS_PER_NODE={text!r}: cannot read {item!r}",
                              "pass --num_gpus N (ranks per node) or a --hostfile")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def expand_nodelist(nodelist: str) -> list[str]:
    """``scontrol show hostnames`` of a compressed node list such as ``node[01-03]``."""
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                             check=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        raise LaunchError(f"cannot expand the Slurm node list {nodelist!r} with scontrol: {e}",
                          "run inside the allocation on a node with the Slurm client tools, or pass --hostfile") from e
    return out.stdout.split()


def allocation_hosts(env: Mapping[str, str], num_gpus: int | None,
                     expand: Callable[[str], list[str]] = expand_nodelist) -> tuple[Host, ...]:
    """One host per allocated node, slots = Slurm's tasks on it (or ``num_gpus``)."""
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise LaunchError("--launcher slurm without a hostfile runs inside an allocation, but SLURM_JOB_NODELIST "
                          "is not set", "run it under salloc or sbatch (e.g. `salloc -N2 --ntasks-per-node=4 "
                          "zerorun --launcher slurm train.py`), or pass --hostfile with Slurm node names")
    names = expand(nodelist)
    for name in names:
        problem = host_problem(name)
        if problem is not None:
            raise LaunchError(f"the Slurm node list {nodelist[:80]!r} names {name[:80]!r}: {problem}",
                              "pass --hostfile with the nodes' names")
    counts = tasks_per_node(env.get("SLURM_TASKS_PER_NODE", ""))
    if num_gpus:
        counts = [num_gpus] * len(names)
    if len(counts) != len(names):
        raise LaunchError(f"the allocation has {len(names)} node(s) ({nodelist}) but SLURM_TASKS_PER_NODE "
                          f"gives {len(counts)} count(s)", "pass --num_gpus N (ranks per node)")
    return tuple(Host(name, count) for name, count in zip(names, counts, strict=True))

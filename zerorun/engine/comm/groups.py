"""The process groups a stage-3 policy runs over: the world, and hpZ's / MiCS's subgroups.

:func:`build_groups` creates them from :func:`~zerorun.engine.comm.group_plan.plan_groups`
(the node layout from ``LOCAL_WORLD_SIZE``, or mpirun's local size, or the host names), every
group on every rank in one order, and wraps the ones this rank belongs to in their own
:class:`~zerorun.engine.comm.collectives.Collectives`: each counts its own collectives, so the
figures say which group carried what (``Engine.comm_stats_by_group``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

import torch.distributed as dist

from zerorun.engine.comm.collectives import Collectives
from zerorun.engine.comm.group_plan import GroupPlan, plan_groups
from zerorun.engine.errors import EngineError
from zerorun.estimate.topology import TopologyError

# the ranks on one node, as each launcher says it (zerorun and torchrun; DeepSpeed's; Open MPI's; MPICH's)
LOCAL_RANKS_ENV = ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")


@dataclass(frozen=True)
class Groups:
    """This rank's groups. ``shard`` is the world unless MiCS; the others are None when the policy has none."""

    world: Collectives
    shard: Collectives  # parameters, gradients and optimizer state are sharded over it
    replica: Collectives | None = None  # MiCS: the ranks holding the same shard (gradients all-reduced over it)
    secondary: Collectives | None = None  # hpZ: the node-local group backward gathers over
    inter: Collectives | None = None  # MiCS hierarchical gather: one rank of each node of the shard group
    intra: Collectives | None = None  # ... and the shard group's ranks on this node

    @classmethod
    def plain(cls, world: Collectives) -> Groups:
        return cls(world, world)

    def by_name(self) -> dict[str, Collectives]:
        """Each distinct group under its name (the world first)."""
        out = {"world": self.world}
        for name in ("shard", "replica", "secondary", "inter", "intra"):
            coll = getattr(self, name)
            if coll is not None and coll is not self.world:
                out[name] = coll
        return out

    def world_average(self) -> int:
        """Ranks a gradient is averaged over: the shard group times its replicas (the world)."""
        return self.shard.world_size * (self.replica.world_size if self.replica is not None else 1)


def ranks_per_node(env: Mapping[str, str], world: Collectives) -> int:
    """Ranks on a node: the launcher's local size, else counted from the ranks' host names (a collective)."""
    for key in LOCAL_RANKS_ENV:
        value = env.get(key, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    hosts = world.all_gather_object(socket.gethostname())
    return hosts.count(hosts[0])


def build_groups(world: Collectives, hpz: int, mics: int, hierarchical: bool,
                 env: Mapping[str, str] = os.environ) -> Groups:
    """This rank's :class:`Groups` (every rank calls it: the groups are created collectively)."""
    if (max(hpz, 1) == 1 and mics <= 0 and not hierarchical) or world.simulated:
        return Groups.plain(world)  # a simulated world runs plain stage 3; simulate projects the policies
    try:
        plan = plan_groups(world.world_size, ranks_per_node(env, world), hpz, mics, hierarchical)
    except TopologyError as e:
        raise EngineError(e.message, e.hint) from e
    return Groups(world, **_create(plan, world))


def _create(plan: GroupPlan, world: Collectives) -> dict[str, Collectives]:
    mine: dict[str, Collectives] = {}
    for kind, ranks in plan.creation_order():  # torch's new_group: every rank, every group, one order
        group = dist.new_group(list(ranks)) if world.group is not None else None
        if world.rank in ranks:
            # the order check watches the world's collectives (its twin group would need every rank here)
            mine[kind] = Collectives(group, len(ranks), ranks.index(world.rank), order_check=False)
    mine.setdefault("shard", world)
    return mine

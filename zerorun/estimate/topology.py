"""What crosses nodes: per rank and step, the bytes each stage-3 collective moves inside the node and across.

Pure arithmetic (no torch), shared by ``zerorun estimate`` and ``zerorun simulate`` so that
their figures are the same function of the same element counts. Ranks are laid out node
by node (rank ``r`` on node ``r // gpus_per_node``), as the launcher places them, and every
group is a block of consecutive ranks (or, for MiCS's replicas, one rank of each block).

A collective's counted bytes are ZeRO's convention (:mod:`zerorun.engine.comm.counter`: the
whole gathered or reduced buffer; an all-reduce counts twice). They are split **by where
each shard lives**: of a group of ``p`` ranks with ``l`` of them on this rank's node, the
part ``(p - l) / p`` comes from (or goes to) other nodes and is "across"; the rest, this
rank's own shard included, is "inside". So inside + across is the total the rest of
simulate and estimate print, and a group inside one node moves 0 bytes across.

The policies are DeepSpeed 0.19.8's (``docs/zeropp.md``), over the one stage-3 mechanism:

* plain stage 3: every gather and reduce-scatter over the world;
* hpZ (``zero_hpz_partition_size`` = h): forward gathers from the primary partition (the
  world); after a unit's forward a secondary copy sharded over h ranks of one node is kept,
  so backward's gathers stay inside the node; the copy costs ``param_bytes x numel / h``;
* MiCS (``mics_shard_size`` = m): everything sharded over a group of m ranks, whose
  traffic is plain stage 3 at world m, plus an all-reduce of each rank's gradient shard
  across the W/m replicas (one rank per group);
* qwZ (``zero_quantized_weights``): every parameter all-gather of a non-persistent unit
  carries int8 values and one fp32 scale per block of :data:`QWZ_BLOCK` elements (the
  engine's quantizer, ``engine/comm/quantize.py``, uses this block).

The engine runs hpZ and MiCS over the groups :mod:`zerorun.engine.comm.group_plan` lays out by
these same rules; ``simulate`` runs it as plain stage 3, so these figures are what its
collectives would move under each policy.
"""

from __future__ import annotations

from dataclasses import dataclass

from zerorun.errors import ZerorunError

DEFAULT_GPUS_PER_NODE = 8
QWZ_BLOCK = 2048  # elements per fp32 scale: 0.2 % over the int8 payload
QWZ_SCALE_BYTES = 4
NORM_BYTES = 4  # the global norm's partial sum: one fp32 scalar all-reduced per step
KINDS = ("forward_all_gather", "backward_all_gather", "persistent_all_gather", "reduce_scatter",
         "replica_all_reduce", "norm_all_reduce")


class TopologyError(ZerorunError):
    """A node layout or a ZeRO++/MiCS group size that does not fit the world."""


@dataclass(frozen=True)
class NodeLayout:
    """``world_size`` ranks, ``gpus_per_node`` to a node (a world smaller than a node is one node)."""

    world_size: int
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE

    def __post_init__(self) -> None:
        if self.gpus_per_node < 1:
            raise TopologyError(f"--gpus-per-node {self.gpus_per_node} is not a GPU count",
                                "give the GPUs of one node, e.g. --gpus-per-node 8")
        w, g = self.world_size, self.gpus_per_node
        if w > g and w % g:
            raise TopologyError(f"a world of {w} ranks is not a whole number of nodes of {g} GPUs",
                                f"make the world a multiple of --gpus-per-node, e.g. {w // g * g}")

    @property
    def per_node(self) -> int:
        return min(self.gpus_per_node, self.world_size)

    @property
    def nodes(self) -> int:
        return self.world_size // self.per_node


@dataclass(frozen=True)
class Stage3Policy:
    """The ZeRO++ / MiCS choices over stage 3 (DeepSpeed's keys; 1 and 0 are off)."""

    hpz: int = 1  # zero_hpz_partition_size
    mics: int = 0  # mics_shard_size (DeepSpeed's -1 is off, as 0 is here)
    qwz: bool = False  # zero_quantized_weights

    @property
    def plain(self) -> bool:
        return self.hpz <= 1 and self.mics <= 0 and not self.qwz

    def label(self) -> str:
        parts = [f"hpZ {self.hpz}"] * (self.hpz > 1) + [f"MiCS {self.mics}"] * (self.mics > 0) + ["qwZ"] * self.qwz
        return " + ".join(parts) or "plain stage 3"

    def shard_size(self, layout: NodeLayout) -> int:
        """Ranks one parameter is sharded over: the MiCS group, else the world."""
        return self.mics if self.mics > 0 else layout.world_size

    def check(self, layout: NodeLayout) -> None:
        """Group sizes that divide the world and keep hpZ inside a node, or a config error naming the key."""
        w, g = layout.world_size, layout.per_node
        if self.hpz > 1 and self.mics > 0:
            raise TopologyError("zero_hpz_partition_size and mics_shard_size both set",
                                "pick one: hpZ keeps a secondary copy per node, MiCS shards inside groups")
        if self.hpz > 1 and (self.hpz > g or g % self.hpz):
            raise TopologyError(f"zero_hpz_partition_size {self.hpz} does not divide the {g} ranks of a node",
                                f"use a divisor of {g} (hpZ's group must not span nodes), e.g. {g}")
        if self.mics > 0 and (self.mics > w or w % self.mics or (self.mics % g and g % self.mics)):
            raise TopologyError(
                f"mics_shard_size {self.mics} does not tile a world of {w} ranks in nodes of {g}",
                f"use a divisor of {w} that is a divisor or a multiple of {g}, e.g. {g}")


@dataclass(frozen=True)
class Link:
    """Bytes one rank moves in a step: inside its node and across nodes."""

    inside: int = 0
    across: int = 0

    @property
    def total(self) -> int:
        return self.inside + self.across

    def __add__(self, other: Link) -> Link:
        return Link(self.inside + other.inside, self.across + other.across)


@dataclass(frozen=True)
class Group:
    """A process group seen from one rank: ``size`` members, ``on_node`` of them on its node."""

    size: int
    on_node: int

    def split(self, nbytes: int) -> Link:
        across = nbytes * (self.size - self.on_node) // self.size
        return Link(nbytes - across, across)


@dataclass(frozen=True)
class Stage3Traffic:
    """Elements one rank's plain stage-3 collectives move in a step (whole buffers, padding included)."""

    forward_gather: int  # all-gathers issued in forward (the primary partition)
    backward_gather: int  # all-gathers issued in backward (units forward released)
    persistent_gather: int  # units under the persistence threshold, re-gathered after the step
    reduce_scatter: int  # the gradients
    param_bytes: int  # bytes per gathered element (the compute dtype)
    grad_bytes: int  # bytes per reduced element
    norm_bytes: int = 2 * NORM_BYTES  # the global norm's all-reduce (counted twice, as every all-reduce)


def quantized_bytes(numel: int) -> int:
    """qwZ's bytes for ``numel`` gathered elements: int8 values and an fp32 scale per block."""
    return numel + -(-numel // QWZ_BLOCK) * QWZ_SCALE_BYTES


def groups(layout: NodeLayout, policy: Stage3Policy) -> dict[str, Group]:
    """This rank's groups under ``policy`` (every rank's look alike: the layout is regular)."""
    g = layout.per_node
    m = policy.shard_size(layout)
    shard = Group(m, min(m, g))
    replicas = layout.world_size // m
    out = {"shard": shard, "replica": Group(replicas, max(g // m, 1)) if replicas > 1 else Group(1, 1)}
    out["secondary"] = Group(policy.hpz, policy.hpz) if policy.hpz > 1 else shard
    return out


def stage3_links(traffic: Stage3Traffic, layout: NodeLayout, policy: Stage3Policy) -> dict[str, Link]:
    """Per collective kind (:data:`KINDS`), the bytes one rank moves inside its node and across nodes.

    ``traffic`` is the plain mechanism's over the shard group (the world, or one MiCS group).
    """
    policy.check(layout)
    gr = groups(layout, policy)

    def gathered(numel: int) -> int:
        return quantized_bytes(numel) if policy.qwz else numel * traffic.param_bytes

    shard_numel = traffic.reduce_scatter // gr["shard"].size
    replica_bytes = 2 * shard_numel * traffic.grad_bytes if gr["replica"].size > 1 else 0
    return {
        "forward_all_gather": gr["shard"].split(gathered(traffic.forward_gather)),
        "backward_all_gather": gr["secondary"].split(gathered(traffic.backward_gather)),
        "persistent_all_gather": gr["shard"].split(traffic.persistent_gather * traffic.param_bytes),
        "reduce_scatter": gr["shard"].split(traffic.reduce_scatter * traffic.grad_bytes),
        "replica_all_reduce": gr["replica"].split(replica_bytes),
        "norm_all_reduce": gr["shard"].split(traffic.norm_bytes),
    }


def secondary_bytes(sharded_numel: int, param_bytes: int, policy: Stage3Policy) -> int:
    """hpZ's secondary copy per rank: the non-persistent units' elements over the h ranks of a node."""
    return -(-sharded_numel // policy.hpz) * param_bytes if policy.hpz > 1 else 0


def links_json(links: dict[str, Link]) -> dict[str, dict[str, int]]:
    total = sum(links.values(), Link())
    return {**{k: {"inside": v.inside, "across": v.across} for k, v in links.items()},
            "total": {"inside": total.inside, "across": total.across}}

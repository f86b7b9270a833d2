"""Which ranks form which process group under hpZ and MiCS: pure arithmetic, no torch.

DeepSpeed's layouts (0.19.6's ``runtime/zero/mics_utils.py``, 0.19.8's ``utils/groups.py``), on ranks
placed node by node (rank ``r`` on node ``r // per_node``, as the launcher places them):

* **shard** groups (MiCS ``mics_shard_size`` = m): blocks of m consecutive ranks; parameters,
  gradients and optimizer state are sharded inside one. Without MiCS the one shard group is
  the world.
* **replica** groups: rank i of every shard group (the ranks that hold the same shard); the
  gradient shard is all-reduced across them. None with one shard group.
* **secondary** groups (hpZ ``zero_hpz_partition_size`` = h): blocks of h consecutive ranks,
  inside one node; backward gathers over them.
* **intra** / **inter** (``mics_hierarchical_params_gather``): inside a shard group that spans
  nodes, the ranks of one node, and the ranks at the same place on each node. The parameter
  all-gather runs over inter (one shard from each node), then over intra.

The size rules are those ``zerorun estimate`` and ``simulate`` use (:mod:`zerorun.estimate.topology`),
so the engine runs the layout the estimate counts: hpZ divides the ranks of a node, MiCS divides
the world and is a divisor or a multiple of the node, not both at once; a hierarchical gather
needs a shard group that spans nodes (DeepSpeed asserts the same). Every rank creates every
group in :meth:`GroupPlan.creation_order` (torch's ``new_group`` is a collective over the world).
"""

from __future__ import annotations

from dataclasses import dataclass

from zerorun.estimate.topology import NodeLayout, Stage3Policy, TopologyError

Ranks = tuple[int, ...]


@dataclass(frozen=True)
class GroupPlan:
    """Every group of each kind, for a world of ``world`` ranks in nodes of ``per_node``."""

    world: int
    per_node: int
    shard: tuple[Ranks, ...]
    replica: tuple[Ranks, ...] = ()
    secondary: tuple[Ranks, ...] = ()
    intra: tuple[Ranks, ...] = ()
    inter: tuple[Ranks, ...] = ()

    @property
    def plain(self) -> bool:
        """One shard group (the world), no secondary, no hierarchy: nothing to create."""
        return len(self.shard) == 1 and not (self.secondary or self.intra)

    def creation_order(self) -> list[tuple[str, Ranks]]:
        """``(kind, ranks)`` for every group to create, the same list on every rank (the world is not in it)."""
        order: list[tuple[str, Ranks]] = []
        if len(self.shard) > 1:
            order += [("shard", g) for g in self.shard]
        for kind in ("replica", "secondary", "intra", "inter"):
            order += [(kind, g) for g in getattr(self, kind)]
        return order

    def mine(self, kind: str, rank: int) -> Ranks | None:
        """The group of ``kind`` holding ``rank`` (None: the plan has none of that kind)."""
        return next((g for g in getattr(self, kind) if rank in g), None)


def _blocks(ranks: Ranks, size: int) -> tuple[Ranks, ...]:
    return tuple(ranks[i:i + size] for i in range(0, len(ranks), size))


def plan_groups(world: int, per_node: int, hpz: int = 1, mics: int = 0, hierarchical: bool = False) -> GroupPlan:
    """The groups of ``world`` ranks, ``per_node`` to a node, under hpZ ``hpz`` and MiCS ``mics``
    (DeepSpeed's off values: hpz 0/1, mics -1/0); :class:`TopologyError` names the key and the fix."""
    hpz, mics = max(hpz, 1), mics if mics > 0 else 0
    layout = NodeLayout(world, per_node)
    Stage3Policy(hpz=hpz, mics=mics).check(layout)
    g = layout.per_node
    everyone = tuple(range(world))
    m = mics or world
    shard = _blocks(everyone, m)
    replica = tuple(tuple(b[i] for b in shard) for i in range(m)) if len(shard) > 1 else ()
    secondary = _blocks(everyone, hpz) if hpz > 1 else ()
    intra: tuple[Ranks, ...] = ()
    inter: tuple[Ranks, ...] = ()
    if hierarchical:
        if mics == 0:
            raise TopologyError("mics_hierarchical_params_gather is set without mics_shard_size",
                                "set mics_shard_size too, or drop mics_hierarchical_params_gather")
        if m <= g:
            raise TopologyError(f"mics_hierarchical_params_gather with mics_shard_size {m}: the shard group "
                                f"lies inside one node of {g} ranks, so there is no second hop",
                                f"drop mics_hierarchical_params_gather, or use a mics_shard_size that spans "
                                f"nodes (a multiple of {g} above it)")
        for block in shard:
            nodes = _blocks(block, g)
            intra += nodes
            inter += tuple(tuple(n[i] for n in nodes) for i in range(g))
    return GroupPlan(world, g, shard, replica, secondary, intra, inter)

"""hpZ's and MiCS's groups as pure arithmetic (engine/comm/group_plan.py): DeepSpeed 0.19.8's layouts."""

from __future__ import annotations

import pytest

from zerorun.engine.comm.group_plan import plan_groups
from zerorun.estimate.topology import TopologyError


def test_mics_shards_in_blocks_and_replicates_one_rank_of_each() -> None:
    plan = plan_groups(8, 4, mics=2)
    assert plan.shard == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert plan.replica == ((0, 2, 4, 6), (1, 3, 5, 7))  # mics_utils._generate_mics_config's columns
    assert plan.mine("shard", 5) == (4, 5) and plan.mine("replica", 5) == (1, 3, 5, 7)
    assert not plan.secondary and not plan.intra


def test_mics_hierarchical_splits_the_group_by_node() -> None:
    plan = plan_groups(8, 2, mics=4, hierarchical=True)
    assert plan.shard == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert plan.intra == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert plan.inter == ((0, 2), (1, 3), (4, 6), (5, 7))  # the same place on each node of one shard group


def test_hpz_groups_are_node_local_blocks() -> None:
    plan = plan_groups(8, 4, hpz=2)
    assert plan.shard == (tuple(range(8)),) and plan.secondary == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert not plan.plain and plan_groups(8, 4).plain and plan_groups(8, 4, hpz=1, mics=-1).plain


def test_every_rank_creates_the_same_groups_in_the_same_order() -> None:
    plan = plan_groups(8, 2, mics=4, hierarchical=True)
    order = plan.creation_order()
    assert [kind for kind, _ in order] == ["shard"] * 2 + ["replica"] * 4 + ["intra"] * 4 + ["inter"] * 4
    for kind in ("shard", "replica", "intra", "inter"):  # each rank in exactly one group of each kind
        for rank in range(8):
            assert sum(rank in g for k, g in order if k == kind) == 1


@pytest.mark.parametrize(("kwargs", "text"), [
    ({"hpz": 4}, "zero_hpz_partition_size 4 does not divide the 2 ranks of a node"),
    ({"hpz": 3, "per_node": 4}, "zero_hpz_partition_size 3 does not divide the 4 ranks"),
    ({"mics": 3}, "mics_shard_size 3 does not tile a world of 8 ranks"),
    ({"mics": 8, "per_node": 4, "world": 16}, None),  # a multiple of the node: fine
    ({"mics": 6, "per_node": 4, "world": 12}, "mics_shard_size 6 does not tile"),  # neither divisor nor multiple
    ({"hpz": 2, "mics": 2}, "both set"),
    ({"hierarchical": True}, "without mics_shard_size"),
    ({"mics": 2, "hierarchical": True}, "lies inside one node"),
    ({"world": 6, "per_node": 4, "mics": 2}, "not a whole number of nodes"),
])
def test_sizes_that_do_not_tile_the_nodes_are_errors(kwargs: dict, text: str | None) -> None:
    world, per_node = kwargs.pop("world", 8), kwargs.pop("per_node", 2)
    if text is None:
        plan_groups(world, per_node, **kwargs)
        return
    with pytest.raises(TopologyError, match=text) as err:
        plan_groups(world, per_node, **kwargs)
    assert err.value.hint

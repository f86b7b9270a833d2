"""Stage 3 per link (estimate/topology.py, estimate/link_estimate.py): pure arithmetic, no processes.

The figures of issue 35's done-when on Llama 2 70B's shape at world 512, 8 GPUs per node,
bf16: hpZ 8's backward all-gather moves 0 bytes across nodes and its secondary copy costs
2 Psi / 8 per rank (plus padding); qwZ halves the forward all-gather's inter-node bytes
(plus its fp32 scales); MiCS 64 holds 18 Psi / 64 of model states per rank.
"""

from __future__ import annotations

import pytest

from zerorun.estimate import Dtype, Optimizer
from zerorun.estimate.link_estimate import link_estimate, link_lines
from zerorun.estimate.shape import ModelShape
from zerorun.estimate.stage3_window import WindowPolicy, decoder_window
from zerorun.estimate.topology import (
    QWZ_BLOCK,
    Group,
    Link,
    NodeLayout,
    Stage3Policy,
    Stage3Traffic,
    TopologyError,
    quantized_bytes,
    stage3_links,
)

LLAMA_70B = ModelShape(hidden=8192, layers=80, heads=64, kv_heads=8, ffn=28672, vocab=32000, gated_mlp=True,
                       tied_embeddings=False, seq_len=16, micro_batch=1)
PSI = LLAMA_70B.param_count()
LAYOUT = NodeLayout(512, 8)


def _est(policy: Stage3Policy, layout: NodeLayout = LAYOUT):  # noqa: ANN202
    return link_estimate(PSI, Dtype.BF16, Optimizer.ADAM, layout, policy, LLAMA_70B)


def test_a_group_splits_its_bytes_by_where_each_shard_lives() -> None:
    assert Group(8, 8).split(800) == Link(800, 0)  # inside one node: nothing crosses
    assert Group(512, 8).split(512 * 10) == Link(80, 5040)  # 8 of 512 shards are on this node
    assert Group(1, 1).split(0) == Link(0, 0)
    assert Link(1, 2) + Link(3, 4) == Link(4, 6) and Link(4, 6).total == 10


def test_plain_stage3_on_one_node_moves_nothing_across_and_many_nodes_almost_all() -> None:
    one = _est(Stage3Policy(), NodeLayout(8, 8))
    assert all(link.across == 0 for link in one.later_steps.values())
    many = _est(Stage3Policy())
    total = sum(many.later_steps.values(), Link())
    assert total.across == pytest.approx(total.total * 504 / 512, rel=1e-6)


def test_hpz_keeps_backward_inside_the_node_and_costs_a_secondary_copy() -> None:
    plain, hpz = _est(Stage3Policy()), _est(Stage3Policy(hpz=8))
    for step in ("first_step", "later_steps"):
        p, h = getattr(plain, step), getattr(hpz, step)
        assert h["backward_all_gather"].across == 0
        assert h["backward_all_gather"].total == p["backward_all_gather"].total > 0
        assert h["forward_all_gather"] == p["forward_all_gather"]
        assert h["reduce_scatter"] == p["reduce_scatter"]
    assert plain.secondary_bytes == 0
    # 2 Psi / hpz: the units' padding added, the persistent ones (the norms, held whole) left out
    assert hpz.secondary_bytes == pytest.approx(2 * PSI / 8, rel=1e-4)
    window = decoder_window(LLAMA_70B, 512, WindowPolicy())
    assert hpz.secondary_bytes == 2 * -(-(window.total_numel - window.persistent_numel) // 8)
    assert hpz.model_states == plain.model_states


def test_qwz_halves_the_forward_all_gathers_inter_node_bytes() -> None:
    bf16, qwz = _est(Stage3Policy()), _est(Stage3Policy(qwz=True))
    b, q = bf16.later_steps["forward_all_gather"], qwz.later_steps["forward_all_gather"]
    scales = b.across / 2 * 4 / QWZ_BLOCK  # one fp32 scale per block, on the int8 half
    assert b.across / 2 <= q.across <= b.across / 2 + scales + 4
    assert q.across / b.across == pytest.approx(0.5, abs=0.002)
    assert qwz.later_steps["reduce_scatter"] == bf16.later_steps["reduce_scatter"]  # qgZ is not qwZ
    assert quantized_bytes(QWZ_BLOCK + 1) == QWZ_BLOCK + 1 + 8


def test_mics_shards_model_states_over_its_group_and_all_reduces_across_replicas() -> None:
    mics = _est(Stage3Policy(mics=64))
    assert abs(sum(mics.model_states.values()) - 18 * PSI / 64) < 18  # 18 Psi / 64 (the estimate has no padding)
    rep = mics.later_steps["replica_all_reduce"]
    shard_elements = mics.later_steps["reduce_scatter"].total // 2 // 64
    assert rep.total == 2 * 2 * shard_elements  # an all-reduce counts twice, bf16
    assert rep.inside == rep.total // 8  # 8 replicas, one per node: only this rank's own part stays
    assert _est(Stage3Policy()).later_steps["replica_all_reduce"] == Link(0, 0)
    inside_node = _est(Stage3Policy(mics=8))  # a group per node: only the replica all-reduce crosses
    crossing = {k for k, v in inside_node.later_steps.items() if v.across}
    assert crossing == {"replica_all_reduce"}


def test_without_a_shape_every_gather_and_the_reduce_scatter_is_psi() -> None:
    est = link_estimate(10**9, Dtype.BF16, Optimizer.ADAM, NodeLayout(16, 8), Stage3Policy())
    for kind in ("forward_all_gather", "backward_all_gather", "reduce_scatter"):
        assert est.later_steps[kind] == Link(10**9, 10**9)  # half the shards on this node


def test_the_text_carries_the_json_figures_within_80_columns() -> None:
    est = _est(Stage3Policy(hpz=8, qwz=False))
    lines = link_lines(est)
    assert max(len(line) for line in lines) <= 80
    assert any(line.split()[:3] == ["backward", "all", "gather"] and line.split()[-2:] == ["0", "B"]
               for line in lines)
    doc = est.to_json()
    assert doc["later_steps"]["backward_all_gather"]["across"] == 0
    assert (doc["world_size"], doc["gpus_per_node"], doc["nodes"], doc["policy"]) == (512, 8, 64, "hpZ 8")


@pytest.mark.parametrize(("layout", "policy", "message"), [
    ((512, 8), Stage3Policy(hpz=16), "does not divide the 8 ranks of a node"),
    ((512, 8), Stage3Policy(hpz=3), "does not divide the 8 ranks of a node"),
    ((512, 8), Stage3Policy(mics=48), "does not tile a world of 512"),
    ((512, 8), Stage3Policy(mics=12), "does not tile a world of 512"),
    ((512, 8), Stage3Policy(mics=1024), "does not tile a world of 512"),
    ((512, 8), Stage3Policy(hpz=8, mics=64), "both set"),
])
def test_a_group_that_does_not_fit_the_world_is_an_error(layout: tuple[int, int], policy: Stage3Policy,
                                                         message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        policy.check(NodeLayout(*layout))


def test_a_world_that_is_not_whole_nodes_is_an_error() -> None:
    with pytest.raises(TopologyError, match="not a whole number of nodes of 8"):
        NodeLayout(12, 8)
    assert NodeLayout(4, 8).per_node == 4 and NodeLayout(4, 8).nodes == 1  # a world smaller than a node
    with pytest.raises(TopologyError, match="not a GPU count"):
        NodeLayout(8, 0)


def test_the_links_are_one_function_of_the_elements() -> None:
    traffic = Stage3Traffic(1024, 512, 64, 1024, 2, 2)
    links = stage3_links(traffic, NodeLayout(16, 8), Stage3Policy(hpz=8))
    assert links["forward_all_gather"] == Link(1024, 1024)
    assert links["backward_all_gather"] == Link(1024, 0)
    assert links["persistent_all_gather"] == Link(64, 64)
    assert links["norm_all_reduce"] == Link(4, 4)

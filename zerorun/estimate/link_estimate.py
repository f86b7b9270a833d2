"""The estimate's per-link figures for stage 3 under a policy: traffic by kind, hpZ's copy, MiCS's states.

With a decoder's shape the elements are the gather coordinator's, replayed over the shard
group (:mod:`zerorun.estimate.stage3_window`); without one every unit counts as sharded and
released after forward (forward, backward and the reduce-scatter each Psi, none persistent).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zerorun.estimate.model_states import Dtype, Optimizer, engine_breakdown
from zerorun.estimate.shape import ModelShape
from zerorun.estimate.stage3_window import WindowPolicy, decoder_window
from zerorun.estimate.topology import (
    Link,
    NodeLayout,
    Stage3Policy,
    Stage3Traffic,
    links_json,
    secondary_bytes,
    stage3_links,
)

STATE_KEYS = ("params", "gradients", "master_params", "optimizer_states")


@dataclass(frozen=True)
class LinkEstimate:
    """One rank's stage-3 figures on a node layout under a policy."""

    layout: NodeLayout
    policy: Stage3Policy
    first_step: dict[str, Link]
    later_steps: dict[str, Link]
    secondary_bytes: int  # hpZ's secondary copy per rank (0 without hpZ)
    model_states: dict[str, int]  # per rank, sharded over the shard group (MiCS: its m ranks)

    def to_json(self) -> dict[str, Any]:
        return {"world_size": self.layout.world_size, "gpus_per_node": self.layout.per_node,
                "nodes": self.layout.nodes, "policy": self.policy.label(),
                "shard_group": self.policy.shard_size(self.layout),
                "first_step": links_json(self.first_step), "later_steps": links_json(self.later_steps),
                "secondary_bytes": self.secondary_bytes, "model_states": self.model_states,
                "model_states_total": sum(self.model_states.values())}


def _traffic(shape: ModelShape | None, psi: int, shard: int, window: WindowPolicy,
             elem: int) -> tuple[Stage3Traffic, Stage3Traffic, int]:
    """The first and later steps' elements over ``shard`` ranks, and the non-persistent elements."""
    if shape is None:
        plain = Stage3Traffic(psi, psi, 0, psi, elem, elem)
        return plain, plain, psi
    w = decoder_window(shape, shard, window)
    sharded = w.total_numel - w.persistent_numel
    later_backward = w.later_step_numel - w.total_numel - w.persistent_numel - w.later_forward_numel
    first = Stage3Traffic(sharded, sharded, w.persistent_numel, w.total_numel, elem, elem)
    later = Stage3Traffic(w.later_forward_numel, later_backward, w.persistent_numel, w.total_numel, elem, elem)
    return first, later, sharded


def link_estimate(psi: int, dtype: Dtype, optimizer: Optimizer, layout: NodeLayout, policy: Stage3Policy,
                  shape: ModelShape | None = None, window: WindowPolicy | None = None) -> LinkEstimate:
    """Stage 3's per-rank traffic by link, hpZ's secondary copy and the model states under ``policy``.

    The gathers and the reduce-scatter move the compute dtype (the engine's counters).
    """
    policy.check(layout)
    shard = policy.shard_size(layout)
    first, later, sharded = _traffic(shape, psi, shard, window or WindowPolicy(), dtype.nbytes)
    states = engine_breakdown(3, dtype, optimizer, shard, psi)
    return LinkEstimate(layout, policy, stage3_links(first, layout, policy), stage3_links(later, layout, policy),
                        secondary_bytes(sharded, dtype.nbytes, policy), {k: states[k] for k in STATE_KEYS})


def link_lines(est: LinkEstimate) -> list[str]:
    """The text form (within 80 columns): a later step's bytes by kind and link, hpZ's copy, the states."""
    from zerorun.estimate.counts import human_bytes

    layout = est.layout
    lines = [f"stage 3 per link and step: {est.policy.label()}, {layout.nodes} node(s) of {layout.per_node}",
             f"  {'':<22}{'first inside':>14}{'first across':>14}{'later inside':>14}{'later across':>14}"]
    first_total, later_total = sum(est.first_step.values(), Link()), sum(est.later_steps.values(), Link())
    for kind in (*est.later_steps, "total"):
        f = first_total if kind == "total" else est.first_step[kind]
        later = later_total if kind == "total" else est.later_steps[kind]
        if kind == "replica_all_reduce" and est.policy.mics <= 0:
            continue
        lines.append(f"  {kind.replace('_', ' '):<22}{human_bytes(f.inside):>14}{human_bytes(f.across):>14}"
                     f"{human_bytes(later.inside):>14}{human_bytes(later.across):>14}")
    if est.policy.hpz > 1:
        lines.append(f"  hpZ secondary copy per rank: {human_bytes(est.secondary_bytes)}")
    if est.policy.mics > 0:
        lines.append(f"  MiCS model states per rank (sharded over {est.policy.mics}): "
                     f"{human_bytes(sum(est.model_states.values()))}")
    return lines

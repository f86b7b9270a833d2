"""A simulated rank's stage-3 traffic by link, beside the estimate's (:mod:`zerorun.estimate.link_estimate`).

The engine's counters per phase give the elements: forward's all-gathers, backward's
all-gathers and reduce-scatters, the step's re-gather of persistent units and the global
norm's all-reduce. :func:`~zerorun.estimate.topology.stage3_links` splits them by node for
the policy, the same function the estimate calls, so the two agree exactly when the
engine's elements are the replay's. Under MiCS the engine runs as one rank of its shard
group (its collectives are plain stage 3 there); the replica all-reduce is the policy's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zerorun.estimate import Dtype, Optimizer
from zerorun.estimate.buffers import window_policy
from zerorun.estimate.link_estimate import LinkEstimate, link_estimate
from zerorun.estimate.shape import ModelShape
from zerorun.estimate.topology import (
    Link,
    NodeLayout,
    Stage3Policy,
    Stage3Traffic,
    TopologyError,
    links_json,
    secondary_bytes,
    stage3_links,
)
from zerorun.simulate.run import Counts, SimResult

OTHER_KINDS = ("broadcast",)  # the engine issues none in a stage-3 step; any would be reported, not hidden


def _ratio(bytes_: int, elements: int, default: int) -> int:
    return bytes_ // elements if elements else default


def simulated_traffic(phases: dict[str, Counts], param_bytes: int) -> Stage3Traffic:
    """One step's elements by phase, from the engine's counters (``phases``: forward, backward, step)."""
    fwd, bwd, step = phases["forward"], phases["backward"], phases["step"]
    gathered = {k: fwd["all_gather"][k] + bwd["all_gather"][k] + step["all_gather"][k] for k in ("bytes", "elements")}
    reduced = {k: sum(p["reduce_scatter"][k] for p in phases.values()) for k in ("bytes", "elements")}
    moved_elsewhere = sum(p[k]["elements"] for p in phases.values() for k in OTHER_KINDS)
    if moved_elsewhere:
        raise TopologyError(f"the simulated step broadcast {moved_elsewhere:,} elements, which no policy places",
                            "report it: the per-link figures cover stage 3's gathers and reductions only")
    return Stage3Traffic(
        forward_gather=fwd["all_gather"]["elements"], backward_gather=bwd["all_gather"]["elements"],
        persistent_gather=step["all_gather"]["elements"], reduce_scatter=reduced["elements"],
        param_bytes=_ratio(gathered["bytes"], gathered["elements"], param_bytes),
        grad_bytes=_ratio(reduced["bytes"], reduced["elements"], param_bytes),
        norm_bytes=2 * sum(p["all_reduce"]["bytes"] for p in phases.values()))


@dataclass(frozen=True)
class LinkComparison:
    """Per step, the simulated bytes by kind and link, and the estimate's for the same policy."""

    steps: list[dict[str, Link]]
    secondary_bytes: int
    estimate: LinkEstimate

    def to_json(self) -> dict[str, Any]:
        return {"simulated": {"steps": [links_json(s) for s in self.steps], "secondary_bytes": self.secondary_bytes},
                "estimate": self.estimate.to_json()}


def compare_links(result: SimResult, layout: NodeLayout, policy: Stage3Policy, shape: ModelShape | None,
                  buckets: Any, optimizer: Optimizer) -> LinkComparison:
    """The simulated rank's per-link figures beside the estimate's (stage 3 only)."""
    dtype = Dtype(result.dtype)
    steps = [stage3_links(simulated_traffic(p, dtype.nbytes), layout, policy) for p in result.step_phases]
    sharded = result.psi + result.padding_numel - result.persistent_numel
    est = link_estimate(result.psi, dtype, optimizer, layout, policy, shape, window_policy(buckets))
    return LinkComparison(steps, secondary_bytes(sharded, dtype.nbytes, policy), est)

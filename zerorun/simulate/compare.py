"""A simulated rank beside ``estimate`` for the same Psi, shape, world and config.

Model states: the engine's ``memory_breakdown()`` against
:func:`~zerorun.estimate.engine_breakdown`. They differ by exactly three things, which
:func:`model_state_bound` adds up: padding (every bucket is padded to a multiple of the
world size, so a shard holds at most one element more per bucket than ceil(Psi/N) spreads),
the buckets kept whole under ``stage3_param_persistence_threshold``, and the optimizer's
per-tensor scalars (Adam's ``step``: 4 bytes per bucket). Communication: stages 0-2 move
2 Psi per step (an all-reduce counts twice: it is a reduce-scatter and an all-gather),
stage 3 what :mod:`zerorun.estimate.stage3_window` replays.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from zerorun.estimate import (
    Buckets,
    Dtype,
    EstimateRequest,
    Offload,
    Optimizer,
    Placement,
    Training,
    engine_breakdown,
    estimate_row,
)
from zerorun.estimate.buffers import window_policy
from zerorun.estimate.shape import ModelShape
from zerorun.estimate.stage3_window import Window, decoder_window
from zerorun.estimate.topology import NodeLayout, Stage3Policy
from zerorun.simulate.run import Counts, SimResult

if TYPE_CHECKING:
    from zerorun.simulate.links import LinkComparison

STATE_TERMS = ("params", "gradients", "master_params", "optimizer_states")
STEP_SCALAR_BYTES = 4  # torch's Adam/AdamW keep ``step`` as one fp32 scalar per parameter tensor


def volume(counts: Counts) -> int:
    """Elements moved, in the reduce-scatter + all-gather terms of ZeRO's arithmetic."""
    return (2 * counts["all_reduce"]["elements"] + counts["reduce_scatter"]["elements"]
            + counts["all_gather"]["elements"] + counts["broadcast"]["elements"])


def moved_bytes(counts: Counts) -> int:
    return (2 * counts["all_reduce"]["bytes"] + counts["reduce_scatter"]["bytes"]
            + counts["all_gather"]["bytes"] + counts["broadcast"]["bytes"])


@dataclass(frozen=True)
class Comparison:
    """The estimate's figures for a :class:`SimResult`'s Psi, world and config."""

    states: dict[str, int]  # the estimate in memory_breakdown()'s model-state keys
    buffers: dict[str, int]  # the estimate's communication buffers, by term
    total: int  # the estimate's whole per-GPU row (model states, buffers, activations, overhead)
    bound: int  # bytes by which the engine's model states may exceed the estimate's (padding, persistent, step)
    first_step_numel: int  # elements the estimate says the first step moves
    later_step_numel: int  # ... and every later step
    window: Window | None  # stage 3 with a known shape: the replayed coordinator window
    links: LinkComparison | None = None  # stage 3: per step, the bytes by kind inside the node and across
    placed: Placed | None = None  # the config's own row (its offload): the device's model state, the host's bytes


@dataclass(frozen=True)
class Placed:
    """The estimate's row for the config's stage and offload: what stays on the device, what goes to the host."""

    label: str  # "stage 3, offload opt:cpu par:cpu"
    ranks_per_node: int
    device_model_state: int  # per GPU: the row less activations and the fixed overhead
    host_per_node: int
    nvme_per_node: int


def placement_of(cfg: Any) -> Placement:
    """The config's stage and offload choice, as an estimate row."""
    zero = cfg.zero_optimization

    def device(block: Any) -> Offload:
        return Offload(getattr(block, "device", "none") or "none") if block is not None else Offload.NONE

    opt = device(getattr(zero, "offload_optimizer", None))
    ratio = float(getattr(getattr(zero, "offload_optimizer", None), "ratio", 1.0) or 1.0)
    return Placement(zero.stage, opt, device(getattr(zero, "offload_param", None)),
                     ratio if opt is not Offload.NONE and zero.stage == 3 else 1.0)


def placed_row(result: SimResult, cfg: Any, shape: ModelShape | None, ranks_per_node: int) -> Placed:
    """The estimate's figures for the simulated rank's own placement, ``ranks_per_node`` ranks to a node."""
    from zerorun.estimate.from_config import masters_of

    training = replace(_training(result, cfg), masters=masters_of(cfg))
    placement = placement_of(cfg)
    request = EstimateRequest(training, gpus_per_node=ranks_per_node, buckets=Buckets.from_zero_config(
        cfg.zero_optimization), shape=shape)
    row = estimate_row(request, placement)
    device = row.total - row.gpu["activations"] - row.gpu["overhead"]
    return Placed(placement.label, ranks_per_node, device, row.cpu_per_node, row.nvme_per_node)


def _training(result: SimResult, cfg: Any) -> Training:
    from zerorun.estimate.from_config import optimizer_of

    return Training(result.psi, result.world_size, Dtype(result.dtype), optimizer_of(cfg) or Optimizer.ADAM)


def model_state_bound(result: SimResult, optimizer: Optimizer) -> int:
    """Bytes that padding, persistent buckets and the step scalars may add to the estimate's model states.

    A whole term holds the buckets' padding (shard and slot alignment) on top of Ψ; a sharded
    one at most its N-th part plus one element per bucket; a persistent bucket is also held whole.
    """
    s, n, elem = result.stage, result.world_size, Dtype(result.dtype).nbytes
    mixed = Dtype(result.dtype).mixed

    def pad(sharded: bool) -> int:
        return -(-result.padding_numel // n) + result.buckets if sharded else result.padding_numel

    return (pad(s >= 3) * elem + pad(s >= 2) * (4 if s >= 2 else elem)
            + pad(s >= 1) * ((4 if mixed else 0) + optimizer.state_bytes)
            + result.buckets * STEP_SCALAR_BYTES + result.persistent_numel * elem)


def compare(result: SimResult, config: dict[str, Any], shape: ModelShape | None,
            layout: NodeLayout | None = None, policy: Stage3Policy | None = None) -> Comparison:
    """The estimate beside ``result``; at stage 3 also per link on ``layout`` (default: nodes of 8)
    under ``policy`` (default plain stage 3; under MiCS ``result`` is one rank of a shard group)."""
    from zerorun.config import load_config
    from zerorun.simulate.links import compare_links

    cfg = load_config(config, world_size=result.world_size, hidden_size=shape.hidden if shape else None)
    training = _training(result, cfg)
    buckets = Buckets.from_zero_config(cfg.zero_optimization)
    row = estimate_row(EstimateRequest(training, gpus_per_node=result.world_size, buckets=buckets, shape=shape),
                       Placement(result.stage))
    states = engine_breakdown(result.stage, training.dtype, training.optimizer, result.world_size, result.psi)
    psi = training.params
    window = links = None
    first = later = 2 * psi
    if result.stage == 3:
        first = later = 3 * psi
        if shape is not None:
            window = decoder_window(shape, result.world_size, window_policy(buckets))
            first, later = window.first_step_numel, window.later_step_numel
        links = compare_links(result, layout or NodeLayout(result.world_size), policy or Stage3Policy(), shape,
                              buckets, training.optimizer)
    per_node = (layout or NodeLayout(result.world_size)).per_node
    return Comparison({k: states[k] for k in STATE_TERMS}, row.buffer_detail, row.total,
                      model_state_bound(result, training.optimizer), first, later, window, links,
                      placed_row(result, cfg, shape, per_node))

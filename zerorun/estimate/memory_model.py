"""The whole estimate: every stage and offload variant, term by term, and a recommendation.

Per GPU: model states (see ``model_states``), communication buffers (``buffers``), what a
step holds in flight besides them (``in_flight``: a unit's gradients, the optimizer's
temporaries for one bucket), activations (``activations``, when the shape is known) and a fixed overhead for the
CUDA context, NCCL and the caching allocator. Per node: what offload moved to host
memory or to NVMe, for all of the node's GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zerorun.estimate.activations import ActivationPolicy, activation_bytes
from zerorun.estimate.buffers import Buckets, buffer_terms, step_sizes
from zerorun.estimate.counts import GiB, gib
from zerorun.estimate.in_flight import in_flight
from zerorun.estimate.model_states import (
    PAPER_REFERENCE,
    Offload,
    Placement,
    Training,
    model_states,
    paper_reference,
)
from zerorun.estimate.per_param import table as per_param_table
from zerorun.estimate.shape import ModelShape

DEFAULT_OVERHEAD = 3 * GiB // 2
"""CUDA context, cuBLAS, NCCL and allocator slack: 1.5 GiB unless --overhead. Measured outside
torch's allocator on an H200 (torch 2.11, CUDA 13, NCCL 2.28; bench/cuda_overhead.py): the context
527 MiB, cuBLAS's first matmul 158 MiB more, NCCL's first communicator (world 1) 558 MiB more,
1243 MiB in all; NCCL's per-peer buffers come on top at larger worlds."""

FIT_HEADROOM = 0.05
"""The one fit threshold: a configuration fits when it leaves this fraction of the GPU free
(fragmentation, the user's own tensors). ``estimate``'s ``fits``, its recommendation and
``autotune``'s pruning all use it."""


def usable_bytes(gpu_memory: int, headroom: float = FIT_HEADROOM) -> int:
    """The bytes of a GPU a configuration may use: its memory less the headroom."""
    return int(gpu_memory * (1 - headroom))


GPU_TERMS = ("params", "gradients", "optimizer_states", "grad_accum", "buffers", "in_flight", "activations",
             "overhead")


@dataclass(frozen=True)
class EstimateRequest:
    """Everything the estimate depends on."""

    training: Training
    gpus_per_node: int
    nodes: int = 1
    buckets: Buckets = field(default_factory=Buckets)
    shape: ModelShape | None = None
    activation_policy: ActivationPolicy = field(default_factory=ActivationPolicy)
    overhead: int = DEFAULT_OVERHEAD
    gpu_memory: int | None = None  # bytes per GPU; None: unknown


@dataclass(frozen=True)
class Row:
    """One stage/offload variant: bytes per GPU by term, host and NVMe bytes per node."""

    placement: Placement
    gpu: dict[str, int]
    buffer_detail: dict[str, int]
    model_states: int  # per rank, wherever they live
    cpu_per_node: int
    nvme_per_node: int
    fits: bool | None

    @property
    def total(self) -> int:
        return sum(self.gpu.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.placement.stage,
            "offload_optimizer": self.placement.offload_optimizer.value,
            "offload_param": self.placement.offload_param.value,
            "offload_ratio": self.placement.offload_ratio,
            "per_gpu_bytes": {**self.gpu, "total": self.total},
            "buffer_bytes": dict(self.buffer_detail),  # the rows of per_gpu_bytes["buffers"], by buffer
            "per_node_cpu_bytes": self.cpu_per_node,
            "per_node_nvme_bytes": self.nvme_per_node,
            "model_states_bytes": self.model_states,
            "fits": self.fits,
        }


@dataclass(frozen=True)
class Recommendation:
    """The chosen row (None when nothing fits or the GPU size is unknown) and why."""

    row: Row | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        if self.row is None:
            return {"stage": None, "offload_optimizer": None, "offload_param": None, "reason": self.reason}
        p = self.row.placement
        return {
            "stage": p.stage,
            "offload_optimizer": p.offload_optimizer.value,
            "offload_param": p.offload_param.value,
            "per_gpu_bytes": self.row.total,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Estimate:
    request: EstimateRequest
    rows: list[Row]
    recommendation: Recommendation
    # the offload choices the rows were pinned to (None: the usual variants) and the Twin-Flow ratio
    offload_optimizer: Offload | None = None
    offload_param: Offload | None = None
    offload_ratio: float = 1.0

    def assumptions(self) -> dict[str, Any] | None:
        """What the activation term assumed (None: activations not counted, no shape)."""
        shape, policy = self.request.shape, self.request.activation_policy
        if shape is None:
            return None
        return {"seq_len": shape.seq_len, "micro_batch": shape.micro_batch,
                "activation_checkpointing": policy.checkpointing, "flash_attention": policy.flash_attention}

    def to_json(self) -> dict[str, Any]:
        r = self.request
        reference = paper_reference(r.training)
        return {
            "params": r.training.params,
            "gpus": r.gpus_per_node,
            "nodes": r.nodes,
            "world_size": r.training.world_size,
            "dtype": r.training.dtype.value,
            "optimizer": r.training.optimizer.value,
            "masters": r.training.masters.value,
            "bytes_per_param": {m.value: {str(p.stage): {"replicated": p.replicated, "sharded": p.sharded,
                                                         "formula": p.formula()} for p in rows}
                                for m, rows in per_param_table(r.training.dtype, r.training.optimizer).items()},
            "gpu_memory_bytes": r.gpu_memory,
            "fit_headroom": FIT_HEADROOM,
            "usable_bytes": None if r.gpu_memory is None else usable_bytes(r.gpu_memory),
            "layout": "engine (fp32 gradient shard at stages 2-3)" if r.training.fp32_gradient_shard
            else "deepspeed (16-bit gradients + fp32 copy)" if r.training.fp32_grad_accum else r.training.layout.value,
            "activations": self.assumptions(),
            "rows": [row.to_json() for row in self.rows],
            "paper_reference": {"source": PAPER_REFERENCE,
                                "model_states_bytes": {str(k): v for k, v in reference.items()}},
            "recommendation": self.recommendation.to_json(),
        }


def placements(offload_optimizer: Offload | None = None, offload_param: Offload | None = None,
               offload_ratio: float = 1.0) -> list[Placement]:
    """The rows to show. No offload flag: every stage plus the usual CPU-offload variants;
    a flag pins that choice and keeps the stages where it is valid. ``offload_ratio`` < 1
    (Twin-Flow) adds its stage-3 row beside the whole offload."""
    if offload_optimizer is None and offload_param is None:
        cpu = Offload.CPU
        rows = [
            Placement(0), Placement(1), Placement(1, cpu), Placement(2), Placement(2, cpu),
            Placement(3), Placement(3, cpu), Placement(3, cpu, cpu),
        ]
        return rows + ([Placement(3, cpu, offload_ratio=offload_ratio)] if offload_ratio < 1.0 else [])
    opt = offload_optimizer or Offload.NONE
    par = offload_param or Offload.NONE
    stages = [s for s in range(4) if (s >= 1 or opt is Offload.NONE) and (s == 3 or par is Offload.NONE)]
    rows = [Placement(s, opt, par) for s in stages]
    if offload_ratio < 1.0 and opt is not Offload.NONE:
        rows.append(Placement(3, opt, par, offload_ratio))
    return rows


def estimate_row(request: EstimateRequest, placement: Placement) -> Row:
    """The per-term bytes of one variant."""
    states = model_states(request.training, placement)
    detail = buffer_terms(request.training, placement, request.buckets, request.shape)
    activations = (
        activation_bytes(request.shape, request.training.dtype, request.activation_policy)
        if request.shape
        else 0
    )
    flight = in_flight(request.training, placement, step_sizes(request.training, placement, request.buckets,
                                                               request.shape))
    # ``buffers`` already holds the staging and stage 3's backward transients: count the rest once
    counted = sum(detail.values()) - detail.get("persistent_params", 0)
    gpu = {**states.gpu, "buffers": sum(detail.values()), "in_flight": max(0, flight.peak - counted),
           "activations": activations, "overhead": request.overhead}
    total = sum(gpu.values())
    return Row(
        placement=placement,
        gpu={name: gpu[name] for name in GPU_TERMS},
        buffer_detail=detail,
        model_states=states.total,
        cpu_per_node=states.cpu * request.gpus_per_node,
        nvme_per_node=states.nvme * request.gpus_per_node,
        fits=None if request.gpu_memory is None else total <= usable_bytes(request.gpu_memory),
    )


def communication_rank(placement: Placement) -> tuple[int, int]:
    """Lower is less traffic: stages 0-2 move 2Ψ per step, stage 3 moves 3Ψ, CPU offload adds
    PCIe traffic every step (parameters more than optimizer), NVMe the most."""
    opt, par = placement.offload_optimizer, placement.offload_param
    if Offload.NVME in (opt, par):
        level = 4
    elif par is Offload.CPU:
        level = 3
    elif opt is Offload.CPU:
        level = 2
    else:
        level = 1 if placement.stage == 3 else 0
    return level, placement.stage


def recommend(rows: list[Row], gpu_memory: int | None, headroom: float = FIT_HEADROOM) -> Recommendation:
    """The configuration with the least communication that fits (``FIT_HEADROOM`` kept free)."""
    if gpu_memory is None:
        return Recommendation(None, "GPU memory unknown: pass --gpu-memory (e.g. 80GB) to get a recommendation")
    usable = usable_bytes(gpu_memory, headroom)
    ranked = sorted(rows, key=lambda row: communication_rank(row.placement))
    fitting = [row for row in ranked if row.total <= usable]
    if not fitting:
        smallest = min(rows, key=lambda row: row.total)
        return Recommendation(
            None,
            f"nothing fits in {gib(usable):.1f} GiB usable ({gib(gpu_memory):.1f} GiB less {headroom:.0%}); the "
            f"smallest is {smallest.placement.label} at {gib(smallest.total):.1f} GiB per GPU "
            "(the levers below, each with the figure it gives, say what would change that)",
        )
    best = fitting[0]
    reason = (
        f"{best.placement.label} is the configuration with the least communication that fits: "
        f"{gib(best.total):.1f} of {gib(usable):.1f} GiB usable per GPU ({gib(gpu_memory):.1f} GiB less {headroom:.0%})"
    )
    cheaper = ranked[: ranked.index(best)]
    if cheaper:
        closest = min(cheaper, key=lambda row: row.total)
        reason += f" ({closest.placement.label} would need {gib(closest.total):.1f} GiB)"
    return Recommendation(best, reason)


def estimate(
    request: EstimateRequest, offload_optimizer: Offload | None = None, offload_param: Offload | None = None,
    offload_ratio: float = 1.0,
) -> Estimate:
    """Every variant's row and the recommendation."""
    rows = [estimate_row(request, p) for p in placements(offload_optimizer, offload_param, offload_ratio)
            if p.stage >= 1 or not request.training.masters.low]  # bf16 masters need stage 1-3
    return Estimate(request, rows, recommend(rows, request.gpu_memory), offload_optimizer, offload_param, offload_ratio)

"""What to change when nothing fits, and what to run when something does.

When no configuration fits, the figure alone ("the smallest needs 97.5 GiB") leaves the
user guessing which knob matters; for a long sequence more GPUs do not help at all
(activations are per GPU). Each lever here is the same estimate rerun with one input
changed, so the figure it prints is the one ``estimate`` itself would print with that
flag; they are listed largest effect first. After a recommendation, the next step is
the ``print-config`` command that writes a config of that stage and offload.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from zerorun.estimate.counts import gib
from zerorun.estimate.memory_model import Estimate, EstimateRequest, estimate, usable_bytes
from zerorun.estimate.model_states import Offload, Placement


@dataclass(frozen=True)
class Lever:
    flag: str
    """The estimate flag(s) that apply it, as the user types them."""
    smallest: int
    """The smallest per-GPU total with it (bytes)."""
    fits: str | None
    """The configuration it would recommend (None: still nothing fits)."""

    def describe(self) -> str:
        outcome = f"{self.fits} fits" if self.fits else "still too large"
        return f"{self.flag}: {gib(self.smallest):.1f} GiB ({outcome})"


def _variants(request: EstimateRequest) -> list[tuple[str, EstimateRequest, Offload | None]]:
    out: list[tuple[str, EstimateRequest, Offload | None]] = []
    policy, shape = request.activation_policy, request.shape
    if shape is not None:
        if not policy.checkpointing:
            out.append(("--activation-checkpointing",
                        dataclasses.replace(request, activation_policy=dataclasses.replace(policy, checkpointing=True)),
                        None))
        if not policy.flash_attention:
            out.append(("--flash-attention",
                        dataclasses.replace(request, activation_policy=dataclasses.replace(policy, flash_attention=True)),
                        None))
        if not policy.checkpointing and not policy.flash_attention:
            both = dataclasses.replace(policy, checkpointing=True, flash_attention=True)
            out.append(("--activation-checkpointing --flash-attention",
                        dataclasses.replace(request, activation_policy=both), None))
        if shape.seq_len >= 256:
            half = dataclasses.replace(shape, seq_len=shape.seq_len // 2, seq_source="--seq-len")
            out.append((f"--seq-len {shape.seq_len // 2}", dataclasses.replace(request, shape=half), None))
    out.append(("--offload-optimizer cpu --offload-param cpu", request, Offload.CPU))
    nodes = request.nodes * 2
    training = dataclasses.replace(request.training, world_size=request.gpus_per_node * nodes)
    out.append((f"--nodes {nodes}", dataclasses.replace(request, nodes=nodes, training=training), None))
    return out


def levers(request: EstimateRequest) -> list[Lever]:
    """Every lever's outcome, largest effect (smallest resulting total) first."""
    found = []
    for flag, changed, offload in _variants(request):
        est = estimate(changed, offload, offload)
        best = est.recommendation.row
        found.append(Lever(flag, min(row.total for row in est.rows), None if best is None else best.placement.label))
    return sorted(found, key=lambda lever: lever.smallest)


def advice(est: Estimate) -> str | None:
    """The levers line when nothing fits (None when something does or the GPU is unknown)."""
    if est.recommendation.row is not None or est.request.gpu_memory is None:
        return None
    usable = usable_bytes(est.request.gpu_memory)
    found = levers(est.request)
    useful = [lever for lever in found if lever.smallest < min(row.total for row in est.rows)]
    if not useful:
        return None
    return (f"levers, largest effect first ({gib(usable):.1f} GiB usable): "
            + "; ".join(lever.describe() for lever in useful))


TEMPLATES = {(0, "none", "none"): "zero0", (1, "none", "none"): "zero1", (2, "none", "none"): "zero2",
             (3, "none", "none"): "zero3", (2, "cpu", "none"): "zero2-offload-cpu",
             (3, "cpu", "cpu"): "zero3-offload-cpu", (3, "cpu", "none"): "zero3-offload-cpu",
             (3, "nvme", "nvme"): "zero3-offload-nvme", (3, "nvme", "none"): "zero3-offload-nvme"}
"""The template of ``templates/`` that starts a config for a placement (stage, optimizer, parameters)."""


def next_command(placement: Placement) -> str | None:
    """The command that writes a config of the recommended stage and offload."""
    key = (placement.stage, placement.offload_optimizer.value, placement.offload_param.value)
    template = TEMPLATES.get(key)
    return None if template is None else f"zerorun print-config --template {template} -o ds_config.yaml"

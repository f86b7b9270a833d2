"""What each lever would change, and what to run for the recommended row.

The figure alone ("the smallest needs 97.5 GiB") leaves the user guessing which knob
matters; for a long sequence more GPUs do not help at all (activations are per GPU). Each
lever here is the same estimate rerun with one input changed (offload, the masters' dtype,
the micro batch, the sequence length, activation checkpointing, flash attention, the node
count), so the figure it prints is the one ``estimate`` itself would print with that flag;
each names the stage and offload it would recommend. When nothing fits the line lists those
that make the total smaller, largest effect first; after a recommendation, those that change
it. The next step after a recommendation is the ``print-config`` command that writes a
config of exactly that row (:mod:`zerorun.estimate.settings`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from zerorun.estimate.counts import gib
from zerorun.estimate.memory_model import Estimate, EstimateRequest, estimate, usable_bytes
from zerorun.estimate.model_states import Dtype, Masters, Offload
from zerorun.estimate.settings import Settings


@dataclass(frozen=True)
class Lever:
    flag: str
    """The estimate flag(s) that apply it, as the user types them."""
    smallest: int
    """The smallest per-GPU total with it (bytes)."""
    fits: str | None
    """The configuration it would recommend (None: still nothing fits)."""
    fits_total: int | None = None
    """That configuration's per-GPU total (bytes)."""

    def describe(self) -> str:
        if self.fits is None:
            return f"{self.flag}: {gib(self.smallest):.1f} GiB (still too large)"
        figure = f" at {gib(self.fits_total):.1f} GiB" if self.fits_total not in (None, self.smallest) else ""
        return f"{self.flag}: {gib(self.smallest):.1f} GiB ({self.fits} fits{figure})"


Variant = tuple[str, EstimateRequest, tuple[Offload | None, Offload | None]]


def _activation_variants(request: EstimateRequest) -> list[tuple[str, EstimateRequest]]:
    policy, shape = request.activation_policy, request.shape
    if shape is None:
        return []
    out = []
    if not policy.checkpointing:
        out.append(("--activation-checkpointing", dataclasses.replace(
            request, activation_policy=dataclasses.replace(policy, checkpointing=True))))
    if not policy.flash_attention:
        out.append(("--flash-attention", dataclasses.replace(
            request, activation_policy=dataclasses.replace(policy, flash_attention=True))))
    if not policy.checkpointing and not policy.flash_attention:
        both = dataclasses.replace(policy, checkpointing=True, flash_attention=True)
        out.append(("--activation-checkpointing --flash-attention", dataclasses.replace(request, activation_policy=both)))
    if shape.seq_len >= 256:
        half = dataclasses.replace(shape, seq_len=shape.seq_len // 2, seq_source="--seq-len")
        out.append((f"--seq-len {shape.seq_len // 2}", dataclasses.replace(request, shape=half)))
    if shape.micro_batch > 1:
        smaller = dataclasses.replace(shape, micro_batch=shape.micro_batch // 2)
        out.append((f"--micro-batch {shape.micro_batch // 2}", dataclasses.replace(request, shape=smaller)))
    return out


def _variants(est: Estimate) -> list[Variant]:
    request, pins = est.request, (est.offload_optimizer, est.offload_param)
    out: list[Variant] = [(flag, changed, pins) for flag, changed in _activation_variants(request)]
    t = request.training
    if t.masters is Masters.FP32 and t.dtype is Dtype.BF16:
        out.append(("--masters bf16", dataclasses.replace(request, training=dataclasses.replace(
            t, masters=Masters.BF16)), pins))
    cpu = Offload.CPU
    if est.offload_optimizer is not cpu:
        out.append(("--offload-optimizer cpu", request, (cpu, est.offload_param)))
    if (est.offload_optimizer, est.offload_param) != (cpu, cpu):
        out.append(("--offload-optimizer cpu --offload-param cpu", request, (cpu, cpu)))
    nodes = request.nodes * 2
    more = dataclasses.replace(t, world_size=request.gpus_per_node * nodes)
    out.append((f"--nodes {nodes}", dataclasses.replace(request, nodes=nodes, training=more), pins))
    return out


def levers(est: Estimate) -> list[Lever]:
    """Every lever's outcome, largest effect (smallest resulting total) first."""
    found = []
    for flag, changed, (opt, par) in _variants(est):
        other = estimate(changed, opt, par, est.offload_ratio)
        best = other.recommendation.row
        found.append(Lever(flag, min(row.total for row in other.rows), None if best is None else best.placement.label,
                           None if best is None else best.total))
    return sorted(found, key=lambda lever: lever.smallest)


def advice(est: Estimate) -> str | None:
    """The levers line: when nothing fits, those that shrink the smallest total; after a recommendation, those
    that change it (None when there are none or the GPU is unknown)."""
    if est.request.gpu_memory is None:
        return None
    usable = usable_bytes(est.request.gpu_memory)
    found = levers(est)
    best = est.recommendation.row
    if best is None:
        useful = [lever for lever in found if lever.smallest < min(row.total for row in est.rows)]
        head = f"levers, largest effect first ({gib(usable):.1f} GiB usable): "
    else:
        useful = [lever for lever in found if lever.fits is not None and lever.fits != best.placement.label]
        head = f"levers that change the recommendation ({gib(usable):.1f} GiB usable): "
    return head + "; ".join(lever.describe() for lever in useful) if useful else None


def next_command(est: Estimate, config: str | None = None) -> str | None:
    """The ``print-config`` command that writes a config of the recommended row (on ``config``, the estimate's
    ``--config``, when there was one)."""
    row = est.recommendation.row
    if row is None:
        return None
    t, shape = est.request.training, est.request.shape
    settings = Settings.of_row(row.placement, t.dtype, t.optimizer, t.masters, shape.micro_batch if shape else 1)
    if config is None:  # the defaults offload nothing: "none" need not be said
        settings = dataclasses.replace(
            settings, **{k: None for k in ("offload_optimizer", "offload_param") if getattr(settings, k) is Offload.NONE})
    return settings.command(config)


def next_note(est: Estimate) -> str | None:
    """What the config cannot say but the recommended row assumed."""
    if est.recommendation.row is None or est.request.shape is None or not est.request.activation_policy.checkpointing:
        return None
    return "activation checkpointing is the model's own (e.g. model.gradient_checkpointing_enable())"

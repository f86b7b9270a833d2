"""Flat, padded parameter buckets: the one storage mechanism every ZeRO stage uses.

Parameters are packed in a fixed order into 1-D buckets of about ``bucket_size``
elements (a parameter is never split across buckets), each padded to a multiple of the
world size so that rank ``r`` owns the contiguous chunk ``r`` of every bucket. Each
parameter's ``.data`` becomes a view into its bucket, so an all-gather of a bucket
updates the module in place.

The order is the reverse of registration order (roughly the order gradients become
ready in backward), so the first bucket to fill during backward is the first reduced.
A bucket owns an arbitrary list of parameters, so a later stage 3 can make one bucket
per module unit and shard/gather it with the same shard ranges.

``reduce_bucket_size`` is an upper bound ("elements reduced at a time"); on gloo stages
0-2 lay buckets out at :data:`MAX_BUCKET_NUMEL` elements at most, on NCCL at the
configured size (see :func:`layout_numel`).

Stages 0-2 lay buckets out aligned (``plan_buckets(..., align=ALIGN_ELEMENTS)``): every
slot starts at, and every shard is a whole number of, :data:`ALIGN_ELEMENTS` elements:
16 bytes in bf16/fp16 (32 in fp32), so each parameter view and each rank's chunk starts
where vectorised kernels and NCCL's fast paths want it (the flat buffer itself comes from
the allocator, aligned far more). The padding between slots is zeroed wherever gradients
are staged (:func:`zero_padding`), so it never carries garbage into a sum or a norm.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Slot:
    """Where one parameter lives inside its bucket."""

    offset: int
    numel: int
    shape: torch.Size


@dataclass(frozen=True)
class BucketPlan:
    """Pure layout of one bucket: which parameters (indices into the group's list), where, padded size."""

    group_index: int
    param_indices: tuple[int, ...]
    slots: tuple[Slot, ...]
    padded_numel: int

    @property
    def numel(self) -> int:
        """The parameters' elements (the padding excluded)."""
        return sum(s.numel for s in self.slots)

    def padding(self) -> tuple[tuple[int, int], ...]:
        """``(offset, length)`` of every run of padding: between slots and after the last."""
        runs, end = [], 0
        for slot in sorted(self.slots, key=lambda s: s.offset):
            if slot.offset > end:
                runs.append((end, slot.offset - end))
            end = slot.offset + slot.numel
        if self.padded_numel > end:
            runs.append((end, self.padded_numel - end))
        return tuple(runs)

    def shard_numel(self, world_size: int) -> int:
        return self.padded_numel // world_size


# Stages 0-2 never make a bucket larger than this (2^21 elements: 8 MiB in fp32, DDP's
# default bucket is 25 MiB). With DeepSpeed's default reduce_bucket_size (5e8) a model
# under 500M parameters would otherwise be one bucket, and then (measured on the 25.5M
# parameter benchmark MLP, CPU/gloo) nothing overlaps: the one reduction starts after the
# last gradient, the one all-gather after the whole optimizer step; and the optimizer's
# temporaries are model-sized (on CPU each is a fresh mmap: AdamW on one 12.7M-element
# shard took 3x as long as on 1M-element pieces). Stage 2's staging buffers shrink with it.
MAX_BUCKET_NUMEL = 2**21


# NCCL is another matter: its bandwidth knee is tens of MiB, so 2^21-element buckets of a 7B
# model are ~3.3k reduce-scatters and ~3.3k all-gathers of 4-8 MiB per step, far below it
# (worse across nodes). There the configured size holds (DeepSpeed's default 5e8), and
# `zerorun autotune` searches it.


def layout_numel(reduce_bucket_size: int, native_collectives: bool = False) -> int:
    """The bucket size stages 0-2 lay parameters out with: the config's bound, capped at
    :data:`MAX_BUCKET_NUMEL` unless the backend has native collectives (NCCL)."""
    size = max(1, int(reduce_bucket_size))
    return size if native_collectives else min(size, MAX_BUCKET_NUMEL)


ALIGN_BYTES = 16
ALIGN_ELEMENTS = 8
"""Slot and shard alignment, in elements: 16 bytes of the narrowest dtype a bucket holds (bf16, fp16)."""


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def zero_padding(flat: torch.Tensor, plan: BucketPlan) -> None:
    """Zero the padding of ``flat`` (a buffer laid out like ``plan``)."""
    for offset, length in plan.padding():
        flat.narrow(0, offset, length).zero_()


def plan_buckets(shapes: list[torch.Size], bucket_size: int, world_size: int,
                 group_index: int = 0, align: int = 1) -> list[BucketPlan]:
    """Cut the parameters of one optimizer group (given by shape, in registration order) into buckets.

    Parameters are visited in reverse order, each at the next multiple of ``align``
    elements; a bucket is closed when adding the next parameter would exceed
    ``bucket_size`` elements (a larger parameter gets a bucket of its own). Every bucket
    is padded to a multiple of ``world_size * align``, so every shard is aligned too.
    """
    if bucket_size < 1:
        raise ValueError(f"bucket_size must be >= 1, got {bucket_size}")
    plans: list[BucketPlan] = []
    indices: list[int] = []
    slots: list[Slot] = []
    offset = 0

    def close() -> None:
        nonlocal indices, slots, offset
        if indices:
            plans.append(BucketPlan(group_index, tuple(indices), tuple(slots),
                                    round_up(offset, world_size * align)))
        indices, slots, offset = [], [], 0

    for i in reversed(range(len(shapes))):
        n = shapes[i].numel()
        if indices and round_up(offset, align) + n > bucket_size:
            close()
        start = round_up(offset, align)
        indices.append(i)
        slots.append(Slot(start, n, shapes[i]))
        offset = start + n
    close()
    return plans


class FlatBucket:
    """One bucket's flat parameter buffer; its parameters are views into it."""

    def __init__(self, plan: BucketPlan, params: list[nn.Parameter], world_size: int, rank: int,
                 device: torch.device | None = None) -> None:
        """The buffer is made on ``device`` (default: the first parameter's) and filled from the
        parameters wherever they are; binding them to it frees their own storage."""
        self.plan = plan
        self.params = params
        self.world_size = world_size
        self.rank = rank
        dtype, device = params[0].dtype, device or params[0].device
        self.data = torch.zeros(plan.padded_numel, dtype=dtype, device=device)
        with torch.no_grad():
            for p, slot in zip(params, plan.slots, strict=True):
                self.data.narrow(0, slot.offset, slot.numel).copy_(p.detach().reshape(-1))
        self.bind()

    @property
    def shard_numel(self) -> int:
        return self.plan.padded_numel // self.world_size

    @property
    def shard_offset(self) -> int:
        return self.rank * self.shard_numel

    def bind(self) -> None:
        """Point every parameter's ``.data`` at its view of the flat buffer."""
        for p, slot in zip(self.params, self.plan.slots, strict=True):
            p.data = self.view(self.data, slot)

    def cast_(self, dtype: torch.dtype) -> None:
        """Re-create the buffer in ``dtype`` (the compute copy) and re-bind the parameters."""
        if self.data.dtype != dtype:
            self.data = self.data.to(dtype)
            self.bind()

    @staticmethod
    def view(flat: torch.Tensor, slot: Slot) -> torch.Tensor:
        return flat.narrow(0, slot.offset, slot.numel).view(slot.shape)

    def shard(self, flat: torch.Tensor) -> torch.Tensor:
        """This rank's chunk of any flat tensor laid out like this bucket."""
        return flat.narrow(0, self.shard_offset, self.shard_numel)

    def grad_views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        return [self.view(flat, s) for s in self.plan.slots]

    def held_bytes(self) -> int:
        """Bytes of parameter storage this rank holds for the bucket (stage 3 overrides: shard + gathered)."""
        return self.data.numel() * self.data.element_size()

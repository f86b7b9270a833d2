"""How a reduction's sum is formed and where it lands: the rounding every path of the engine's
collectives shares (the shared-memory lane, the point-to-point exchange, a native collective's
result copied out), so a sum's bits do not depend on the path that carried it."""

from __future__ import annotations

import torch


def sum_chunks(out: torch.Tensor, first: torch.Tensor, chunks: list[torch.Tensor], scale: float = 1.0) -> None:
    """``out = (first + chunks[0] + ...) * scale``, added in that order (``out`` may be ``first``); a
    16-bit sum of several chunks is taken in fp32 and rounded once, so every way of calling it rounds alike."""
    if not chunks:
        if out is not first:
            out.copy_(first)
    elif out.dtype == torch.float32 or len(chunks) == 1:
        torch.add(first, chunks[0], out=out)  # the first add writes the output: no copy of ``first``
        for c in chunks[1:]:
            out.add_(c)
    else:
        total = first.float()
        for c in chunks:
            total.add_(c)
        out.copy_(total)
    if scale != 1.0:
        out.mul_(scale)


def land(out: torch.Tensor, summed: torch.Tensor, scale: float) -> None:
    """``out = summed * scale`` in one pass (``summed`` may be ``out``): the rounding of a copy, then ``mul_``.
    A 16-bit ``summed`` is widened first, then scaled in ``out``'s dtype: ``torch.mul`` into an fp32 ``out``
    would compute in bf16 (relative error 2^-9 at scale 1/3) and only then widen."""
    if scale == 1.0:
        if summed is not out:
            out.copy_(summed)
    elif summed.dtype == out.dtype:
        torch.mul(summed, scale, out=out)
    else:
        out.copy_(summed)
        out.mul_(scale)

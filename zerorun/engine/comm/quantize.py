"""Blockwise int8 quantization for ZeRO++'s quantized collectives (qwZ, qgZ): pure tensor functions.

A flat tensor is cut into blocks of :data:`BLOCK` elements (the last one may be shorter);
each block gets one fp32 scale ``s = max|x| / 127`` and its values become
``q = round(x / s)`` in int8 (symmetric: -127..127, zero maps to zero). The receiver
computes ``q * s`` in fp32.

Error bound (exact arithmetic): rounding to the nearest integer is off by at most 1/2, so
per element ``|x - q * s| <= s / 2 = max|block| / 254``. In fp32 the two roundings (``x / s``
and ``q * s``) add at most a few units of 2^-24 of ``max|block|`` on top; the tests allow
``max|block| * (1/254 + 2^-20)``. Dequantizing into a 16-bit dtype adds that dtype's own
rounding of the result (at most 2^-8 of the value in bf16, 2^-11 in fp16).
A block of zeros is exact (scale 0, values 0). A block holding inf or nan dequantizes to
non-finite values throughout, so fp16's overflow check after a quantized reduction still
sees the overflow.

Inputs in bf16, fp16 or fp32 are quantized from their fp32 value (DeepSpeed's kernel casts
to fp16 first; zerorun does not, so a bf16 value beyond fp16's range keeps its scale).

The block size is the one ``zerorun estimate`` and ``simulate`` count
(:data:`zerorun.estimate.topology.QWZ_BLOCK`): 2048 elements per 4-byte scale, 0.2 % over
the int8 payload. DeepSpeed 0.19.8's weight quantizer aims at groups of at most ~8k
elements; its gradient quantizer (qgZ) uses int4 with one group per row or so.
"""

from __future__ import annotations

import torch

from zerorun.estimate.topology import QWZ_BLOCK, QWZ_SCALE_BYTES

BLOCK = QWZ_BLOCK
SCALE_BYTES = QWZ_SCALE_BYTES
QMAX = 127


def num_blocks(numel: int, block: int = BLOCK) -> int:
    return -(-numel // block)


def _values_bytes(numel: int) -> int:
    return -(-numel // SCALE_BYTES) * SCALE_BYTES  # the scales that follow start 4-byte aligned


def packed_bytes(numel: int, block: int = BLOCK) -> int:
    """Bytes of :func:`pack`'s output for ``numel`` elements: the int8 values (padded to a multiple of
    4, which the engine's aligned shards already are), then the fp32 scales."""
    return _values_bytes(numel) + num_blocks(numel, block) * SCALE_BYTES


def quantize(x: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (any float dtype, any shape) as int8 values (flat, ``x.numel()``) and one fp32 scale per block."""
    flat = x.reshape(-1).float()
    n = flat.numel()
    nb = num_blocks(n, block)
    rows = torch.nn.functional.pad(flat, (0, nb * block - n)).view(nb, block)
    scale = rows.abs().amax(dim=1) / QMAX
    ok = torch.isfinite(scale) & (scale > 0)
    inv = torch.where(ok, 1.0 / torch.where(ok, scale, 1.0), 0.0)
    # nan_to_num: an inf element times inv 0 is nan; its block's scale carries the overflow instead
    q = torch.round(torch.nan_to_num(rows * inv.unsqueeze(1), nan=0.0)).clamp_(-QMAX, QMAX).to(torch.int8)
    return q.view(-1).narrow(0, 0, n), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, out: torch.Tensor | None = None,
               block: int = BLOCK) -> torch.Tensor:
    """``q * scale`` per block in fp32, written into ``out`` (cast to its dtype) when given."""
    n = q.numel()
    nb = scale.numel()
    rows = torch.nn.functional.pad(q.float(), (0, nb * block - n)).view(nb, block)
    values = (rows * scale.unsqueeze(1)).view(-1).narrow(0, 0, n)
    if out is None:
        return values
    out.copy_(values.view(out.shape))
    return out


def pack(x: torch.Tensor, out: torch.Tensor, block: int = BLOCK) -> None:
    """Quantize ``x`` into ``out`` (int8, :func:`packed_bytes` long): the values, then the scales' bytes."""
    q, scale = quantize(x, block)
    n, start = q.numel(), _values_bytes(q.numel())
    out.narrow(0, 0, n).copy_(q)
    out.narrow(0, start, scale.numel() * SCALE_BYTES).copy_(scale.view(torch.int8))


def unpack(packed: torch.Tensor, numel: int, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`pack`'s output back as (int8 values, fp32 scales)."""
    q = packed.narrow(0, 0, numel)
    scale = packed.narrow(0, _values_bytes(numel), num_blocks(numel, block) * SCALE_BYTES).view(torch.float32)
    return q, scale


def error_bound(x: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """Per element of ``x`` (flat, fp32): the written bound ``max|block| / 254`` of its block."""
    flat = x.reshape(-1).float()
    n = flat.numel()
    nb = num_blocks(n, block)
    amax = torch.nn.functional.pad(flat, (0, nb * block - n)).view(nb, block).abs().amax(dim=1)
    return (amax / (2 * QMAX)).repeat_interleave(block).narrow(0, 0, n)

"""Activation memory of a transformer, per GPU, from its shape.

Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
(arXiv:2205.05198, Table 2): one layer without parallelism or recomputation keeps

    s*b*h*(34 + 5*a*s/h)  bytes of 16-bit activations

(s sequence length, b micro batch, h hidden size, a heads). The 5*a*s^2*b part is the
attention scores, softmax output and dropout mask; FlashAttention never materializes
them, leaving 34*s*b*h. Full activation checkpointing keeps only each layer's input
(2*s*b*h bytes) and recomputes one layer at a time during backward. fp32 training
doubles every figure. The logits and the loss add s*b*V fp32 values.
"""

from __future__ import annotations

from dataclasses import dataclass

from zerorun.estimate.model_states import Dtype
from zerorun.estimate.shape import ModelShape


@dataclass(frozen=True)
class ActivationPolicy:
    """How activations are kept: recomputed per layer or not, attention fused or not."""

    checkpointing: bool = False
    flash_attention: bool = False


def layer_activation_bytes(shape: ModelShape, dtype: Dtype, policy: ActivationPolicy) -> int:
    """Bytes one layer keeps for backward (its working set when recomputed)."""
    s, b, h, a = shape.seq_len, shape.micro_batch, shape.hidden, shape.heads
    scores = 0 if policy.flash_attention else 5 * a * s * s * b
    sixteen_bit = 34 * s * b * h + scores
    return sixteen_bit * dtype.nbytes // 2


def logits_bytes(shape: ModelShape) -> int:
    """The fp32 logits the loss is computed from (0 when the vocabulary is unknown)."""
    return shape.seq_len * shape.micro_batch * shape.vocab * 4


def activation_bytes(shape: ModelShape, dtype: Dtype, policy: ActivationPolicy) -> int:
    """Peak activation bytes of one micro batch on one GPU."""
    layer = layer_activation_bytes(shape, dtype, policy)
    if policy.checkpointing:
        inputs = shape.layers * shape.seq_len * shape.micro_batch * shape.hidden * dtype.nbytes
        body = inputs + layer
    else:
        body = shape.layers * layer
    return body + logits_bytes(shape)

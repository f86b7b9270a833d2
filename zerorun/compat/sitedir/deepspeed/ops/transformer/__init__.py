"""``deepspeed.ops.transformer``: not implemented by zerorun; importing it raises."""

from zerorun.compat.unsupported import unsupported_module

unsupported_module("fused transformer kernels (deepspeed.ops.transformer)")

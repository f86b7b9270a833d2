"""``deepspeed.ops.sparse_attention``: not implemented by zerorun; importing it raises."""

from zerorun.compat.unsupported import unsupported_module

unsupported_module("sparse attention (deepspeed.ops.sparse_attention)")

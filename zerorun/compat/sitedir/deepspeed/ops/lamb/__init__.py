"""``deepspeed.ops.lamb``: not implemented by zerorun; importing it raises."""

from zerorun.compat.unsupported import unsupported_module

unsupported_module("the Lamb optimizer (deepspeed.ops.lamb)")

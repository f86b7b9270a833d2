"""``deepspeed.ops.lion``: not implemented by zerorun; importing it raises."""

from zerorun.compat.unsupported import unsupported_module

unsupported_module("the Lion optimizers (deepspeed.ops.lion)")

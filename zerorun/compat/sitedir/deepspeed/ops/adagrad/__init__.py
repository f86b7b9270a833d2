"""``deepspeed.ops.adagrad``: not implemented by zerorun; importing it raises."""

from zerorun.compat.unsupported import unsupported_module

unsupported_module("the CPU Adagrad optimizer (deepspeed.ops.adagrad)")

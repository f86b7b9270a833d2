"""``deepspeed.moe``: not implemented by zerorun; importing it raises."""

from zerorun.compat.unsupported import unsupported_module

unsupported_module("mixture of experts (deepspeed.moe)")

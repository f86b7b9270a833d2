"""``deepspeed.runtime.fp16.onebit``: not implemented by zerorun; importing it raises."""

from zerorun.compat.unsupported import unsupported_module

unsupported_module("1-bit optimizers (OnebitAdam, OnebitLamb, ZeroOneAdam)")

"""``deepspeed.profiling``: not implemented by zerorun; importing it raises."""

from zerorun.compat.unsupported import unsupported_module

unsupported_module("the flops profiler (deepspeed.profiling)")

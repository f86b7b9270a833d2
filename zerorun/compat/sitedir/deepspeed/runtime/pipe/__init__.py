"""``deepspeed.runtime.pipe``: not implemented by zerorun; importing it raises."""

from zerorun.compat.unsupported import unsupported_module

unsupported_module("pipeline parallelism (deepspeed.runtime.pipe)")

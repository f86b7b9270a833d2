"""``deepspeed.module_inject``: not implemented by zerorun; importing it raises."""

from zerorun.compat.unsupported import unsupported_module

unsupported_module("inference kernel injection (deepspeed.module_inject)")

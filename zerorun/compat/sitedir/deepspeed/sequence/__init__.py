"""``deepspeed.sequence``: not implemented by zerorun; importing it raises."""

from zerorun.compat.unsupported import unsupported_module

unsupported_module("sequence parallelism (deepspeed.sequence, Ulysses)")

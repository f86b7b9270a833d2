"""``deepspeed.checkpointing``: not implemented by zerorun; importing it raises."""

from zerorun.compat.unsupported import unsupported_module

unsupported_module("DeepSpeed's activation checkpointing (deepspeed.checkpointing; use torch.utils.checkpoint)")

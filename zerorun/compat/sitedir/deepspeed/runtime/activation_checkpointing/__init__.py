"""``deepspeed.runtime.activation_checkpointing``: not implemented by zerorun; importing it raises."""

from zerorun.compat.unsupported import unsupported_module

unsupported_module("DeepSpeed's activation checkpointing (deepspeed.runtime.activation_checkpointing; use torch.utils.checkpoint)")

"""``deepspeed.runtime.fp16``: only its 1-bit optimizers are named here, and they raise."""

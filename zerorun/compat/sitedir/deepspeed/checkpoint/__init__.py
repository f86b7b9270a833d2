"""``deepspeed.checkpoint``: only ``utils`` (DeepSpeed's checkpoint inspection and universal-checkpoint
tools are not implemented; zerorun checkpoints load at any world size and `zerorun convert` consolidates them)."""

from . import utils  # noqa: F401

"""``deepspeed.ops.transformer``: not implemented by zerorun. Importing it (and any module under it) works;
using any of its names raises UnsupportedFeature naming the feature."""

from zerorun.compat.lazy import unsupported_names

__zerorun_unsupported__ = "fused transformer kernels (deepspeed.ops.transformer)"
__getattr__ = unsupported_names(__zerorun_unsupported__)

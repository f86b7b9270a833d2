"""``deepspeed.runtime.fp16.onebit``: not implemented by zerorun. Importing it (and any module under it) works;
using any of its names raises UnsupportedFeature naming the feature."""

from zerorun.compat.lazy import unsupported_names

__zerorun_unsupported__ = "1-bit optimizers (OnebitAdam, OnebitLamb, ZeroOneAdam)"
__getattr__ = unsupported_names(__zerorun_unsupported__)

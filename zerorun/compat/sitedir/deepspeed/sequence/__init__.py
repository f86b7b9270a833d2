"""``deepspeed.sequence``: not implemented by zerorun. Importing it (and any module under it) works;
using any of its names raises UnsupportedFeature naming the feature."""

from zerorun.compat.lazy import unsupported_names

__zerorun_unsupported__ = "sequence parallelism (deepspeed.sequence, Ulysses)"
__getattr__ = unsupported_names(__zerorun_unsupported__)

"""``deepspeed.ops.op_builder`` -> :mod:`zerorun.compat.op_builder` (every probe answers False)."""

from zerorun.compat.op_builder import *  # noqa: F403
from zerorun.compat.op_builder import __getattr__  # noqa: F401  builders added after 0.19.8

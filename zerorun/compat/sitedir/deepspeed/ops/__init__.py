"""``deepspeed.ops``: only the Adam optimizers exist (``deepspeed.ops.adam``); ``__compatible_ops__`` says so."""

from zerorun.compat.op_builder import COMPATIBLE_OPS as __compatible_ops__  # noqa: F401

from . import adam  # noqa: F401

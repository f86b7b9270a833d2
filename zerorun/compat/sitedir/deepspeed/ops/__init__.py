"""``deepspeed.ops``: only the Adam optimizers exist (``deepspeed.ops.adam``)."""

from . import adam  # noqa: F401

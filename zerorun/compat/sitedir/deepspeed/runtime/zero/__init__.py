"""``deepspeed.runtime.zero``: ``Init``, ``GatheredParameters`` (zerorun.zero)."""

from zerorun.zero import GatheredParameters, Init  # noqa: F401

from . import partition_parameters  # noqa: F401,E402

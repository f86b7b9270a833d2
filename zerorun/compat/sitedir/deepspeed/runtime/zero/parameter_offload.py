"""``deepspeed.runtime.zero.parameter_offload``: ``ZeROOrderedDict`` and ``ensure_zero_ordered_dict``
(zerorun.engine.surface.zero_ordered_dict); its other names are not implemented by zerorun (using one raises
UnsupportedFeature naming it)."""

from zerorun.compat.lazy import unsupported_names
from zerorun.engine.surface.zero_ordered_dict import ZeROOrderedDict, ensure_zero_ordered_dict  # noqa: F401

__zerorun_unsupported__ = "DeepSpeed's deepspeed.runtime.zero.parameter_offload"
__getattr__ = unsupported_names(__zerorun_unsupported__)

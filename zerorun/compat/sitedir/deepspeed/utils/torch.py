"""``deepspeed.utils.torch`` -> :mod:`zerorun.compat.torch_version`; its other names are stand-ins that raise
UnsupportedFeature on use."""

from zerorun.compat.lazy import unsupported_names
from zerorun.compat.torch_version import is_functorch_transforming, required_torch_version  # noqa: F401

__getattr__ = unsupported_names("deepspeed.utils.torch")

"""``deepspeed.utils.numa`` -> the core-list parser of :mod:`zerorun.compat.ds_resources`."""

from zerorun.compat.ds_resources import parse_range_list  # noqa: F401

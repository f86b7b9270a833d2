"""``deepspeed.env_report`` (``ds_report``) -> :mod:`zerorun.compat.ds_report`."""

from zerorun.compat.ds_report import cli_main, general_info, main, report  # noqa: F401

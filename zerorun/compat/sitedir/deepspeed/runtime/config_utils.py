"""``deepspeed.runtime.config_utils`` -> :mod:`zerorun.compat.config_models`."""

from zerorun.compat.config_models import DeepSpeedConfigModel  # noqa: F401

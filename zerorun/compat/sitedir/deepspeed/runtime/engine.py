"""``deepspeed.runtime.engine``: ``DeepSpeedEngine`` is zerorun's Engine."""

from zerorun.engine.engine import Engine as DeepSpeedEngine  # noqa: F401

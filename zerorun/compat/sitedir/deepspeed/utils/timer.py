"""``deepspeed.utils.timer``: ``trim_mean`` only (the communication logger's summaries,
:mod:`zerorun.engine.comm.comms_logger`); DeepSpeed's wall-clock timers are not provided."""

from zerorun.engine.comm.comms_logger import trim_mean  # noqa: F401

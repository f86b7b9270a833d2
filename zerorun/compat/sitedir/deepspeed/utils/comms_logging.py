"""``deepspeed.utils.comms_logging`` -> :mod:`zerorun.engine.comm.comms_logger` (the engine's collectives feed it)."""

from zerorun.engine.comm.comms_logger import CommsLogger, calc_bw_log, convert_size  # noqa: F401

"""``deepspeed.comm.config``: the ``comms_logger`` block as DeepSpeed parses it.

zerorun's engine records its collectives into the communication logger when the block enables it
(:mod:`zerorun.engine.comm.comms_logger`); scripts that read the parsed block get
DeepSpeed's values and defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class CommsLoggerConfig:
    enabled: bool = False
    prof_all: bool = True
    prof_ops: list[str] = field(default_factory=list)
    verbose: bool = False
    debug: bool = False


class DeepSpeedCommsConfig:
    """``DeepSpeedCommsConfig(ds_config_dict)``: ``comms_logger_enabled`` is whether the block is present."""

    def __init__(self, ds_config: dict[str, Any]) -> None:
        self.comms_logger_enabled = "comms_logger" in ds_config
        if self.comms_logger_enabled:
            self.comms_logger = CommsLoggerConfig(**ds_config["comms_logger"])


__all__ = ["CommsLoggerConfig", "DeepSpeedCommsConfig"]

"""The top-level ``deepspeed`` names: ``initialize``, ``init_distributed``, ``add_config_arguments``, ``zero``...

Everything here is zerorun's own API under DeepSpeed's name; the names zerorun does not
implement fail on first use with :class:`~zerorun.compat.unsupported.UnsupportedFeature`.
"""

from __future__ import annotations

from typing import Any

from zerorun import zero
from zerorun.compat import DEEPSPEED_VERSION
from zerorun.compat.unsupported import unsupported, unsupported_class
from zerorun.engine.api import add_config_arguments, initialize
from zerorun.engine.bootstrap import init_distributed
from zerorun.engine.engine import Engine as DeepSpeedEngine

__version__ = DEEPSPEED_VERSION
__version_major__, __version_minor__, __version_patch__ = (int(x) for x in DEEPSPEED_VERSION.split("+")[0].split("."))
__git_hash__ = None
__git_branch__ = None

PipelineModule = unsupported_class("PipelineModule", "pipeline parallelism (deepspeed.PipelineModule)")
PipelineEngine = unsupported_class("PipelineEngine", "pipeline parallelism (deepspeed.PipelineEngine)")
InferenceEngine = unsupported_class("InferenceEngine", "inference injection (deepspeed.InferenceEngine)")


def init_inference(*args: Any, **kwargs: Any) -> Any:
    """Not implemented: DeepSpeed's inference engine (kernel injection, tensor parallelism)."""
    unsupported("inference injection (deepspeed.init_inference)")


def add_tuning_arguments(parser: Any) -> Any:
    """DeepSpeed's autotuning flags: zerorun tunes through ``zerorun autotune`` instead."""
    unsupported("autotuning flags (deepspeed.add_tuning_arguments)", "use `zerorun autotune SCRIPT --config FILE`")


__all__ = ["DeepSpeedEngine", "InferenceEngine", "PipelineEngine", "PipelineModule", "__version__",
           "add_config_arguments", "add_tuning_arguments", "init_distributed", "init_inference", "initialize",
           "zero"]

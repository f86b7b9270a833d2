"""``deepspeed.runtime.precision_config``: the ``bf16``/``fp16`` blocks of a config dict, as the engine reads them.

DeepSpeed returns its own pydantic models; here they are zerorun's schema blocks (the
same keys and defaults the engine applies, the same validation errors).
"""

from __future__ import annotations

from typing import Any

from zerorun.config.schema_blocks import Bf16Config, Fp16Config

BFLOAT16, BFLOAT16_OLD, FP16 = "bf16", "bfloat16", "fp16"

DeepSpeedBF16Config = Bf16Config
DeepSpeedFP16Config = Fp16Config


def get_bfloat16_config(param_dict: dict[str, Any]) -> Bf16Config:
    """The ``bf16`` block (or its old name ``bfloat16``); absent: the defaults."""
    block = param_dict.get(BFLOAT16)
    return Bf16Config(**(param_dict.get(BFLOAT16_OLD, {}) if block is None else block))


def get_float16_config(param_dict: dict[str, Any]) -> Fp16Config:
    """The ``fp16`` block; absent: the defaults."""
    return Fp16Config(**param_dict.get(FP16, {}))


__all__ = ["BFLOAT16", "BFLOAT16_OLD", "FP16", "DeepSpeedBF16Config", "DeepSpeedFP16Config", "get_bfloat16_config",
           "get_float16_config"]

"""zerorun's config: DeepSpeed's keys, strictly validated, with "auto" resolved.

    from zerorun.config import load_config
    cfg = load_config("ds_config.json", world_size=8, hidden_size=4096)
    cfg.zero_optimization.stage, cfg.train_micro_batch_size_per_gpu

The schema (``schema.py``, ``schema_zero.py``, ``schema_blocks.py``) is the one place
where every key, its default and its meaning are written down.
"""

from __future__ import annotations

from zerorun.config.load import LoadedConfig, inspect_config, load_config
from zerorun.config.problems import ConfigError, ConfigWarning, Problem, Severity
from zerorun.config.provenance import Origin, Source
from zerorun.config.rules import check_client_optimizer, check_deepspeed_asserts, check_grad_accum_dtype
from zerorun.config.schema import ZerorunConfig

__all__ = [
    "ConfigError",
    "ConfigWarning",
    "LoadedConfig",
    "Origin",
    "Problem",
    "Severity",
    "Source",
    "ZerorunConfig",
    "check_client_optimizer",
    "check_deepspeed_asserts",
    "check_grad_accum_dtype",
    "inspect_config",
    "load_config",
]

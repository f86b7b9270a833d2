"""``deepspeed.runtime.config.DeepSpeedConfig``: a loaded config with DeepSpeed's attribute names.

Scripts build it to read the batch size or the stage before ``initialize``. The values
come from zerorun's own loader (the same validation, defaults and "auto" resolution the
engine uses); the world size is the process group's, else ``WORLD_SIZE``.
"""

from __future__ import annotations

import os
from typing import Any

from zerorun.compat.config_keys import get_gradient_clipping
from zerorun.config import load_config
from zerorun.config.problems import ConfigError
from zerorun.config.read import read_source


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))


DeepSpeedConfigError = ConfigError
"""DeepSpeed's config error is zerorun's: every problem of a config, each naming its key and the fix."""


class DeepSpeedConfig:
    """``DeepSpeedConfig(config, mpu=None)``: ``config`` is a path (JSON/YAML) or a dict."""

    def __init__(self, config: Any, mpu: Any = None, mesh_device: Any = None) -> None:
        if mpu is not None:
            from zerorun.errors import unsupported

            unsupported("model parallelism (DeepSpeedConfig(mpu=...))")
        self.world_size = _world_size()
        self._param_dict: dict[str, Any] = read_source(config)[0] if not isinstance(config, dict) else dict(config)
        cfg = load_config(config, world_size=self.world_size)
        self.config = cfg
        self.train_batch_size = cfg.train_batch_size
        self.train_micro_batch_size_per_gpu = cfg.train_micro_batch_size_per_gpu
        self.gradient_accumulation_steps = cfg.gradient_accumulation_steps
        self.steps_per_print = cfg.steps_per_print
        self.gradient_clipping = cfg.gradient_clipping
        self.prescale_gradients = cfg.prescale_gradients
        self.gradient_predivide_factor = cfg.gradient_predivide_factor
        self.gradient_allreduce_op = cfg.gradient_allreduce_op
        self.wall_clock_breakdown = cfg.wall_clock_breakdown
        self.zero_config = cfg.zero_optimization
        self.zero_optimization_stage = int(cfg.zero_optimization.stage)
        self.zero_enabled = self.zero_optimization_stage > 0
        self.fp16_enabled = bool(cfg.fp16.enabled)
        self.bfloat16_enabled = bool(cfg.bf16.enabled)
        self.optimizer_name = cfg.optimizer.type if cfg.optimizer is not None else None
        self.optimizer_params = dict(cfg.optimizer.params) if cfg.optimizer is not None else None
        self.scheduler_name = cfg.scheduler.type if cfg.scheduler is not None else None
        self.scheduler_params = dict(cfg.scheduler.params) if cfg.scheduler is not None else None

    def print(self, name: str) -> None:
        print(f"{name}:", flush=True)
        for key, value in sorted(self.config.model_dump().items()):
            print(f"  {key} {'.' * max(1, 30 - len(key))} {value}", flush=True)


# DeepSpeed 0.19.8's optimizer-name constants (deepspeed.runtime.config), which scripts compare a config's
# type with (its 1-bit names are gone from 0.19.8: a script importing them fails on DeepSpeed too)
ADAGRAD_OPTIMIZER, ADAM_OPTIMIZER, ADAMW_OPTIMIZER, LAMB_OPTIMIZER = "adagrad", "adam", "adamw", "lamb"
MUADAM_OPTIMIZER, MUADAMW_OPTIMIZER, MUSGD_OPTIMIZER = "muadam", "muadamw", "musgd"
LION_OPTIMIZER, MUON_OPTIMIZER = "lion", "muon"
DEEPSPEED_OPTIMIZERS = [ADAGRAD_OPTIMIZER, ADAM_OPTIMIZER, ADAMW_OPTIMIZER, LAMB_OPTIMIZER, MUADAM_OPTIMIZER,
                        MUADAMW_OPTIMIZER, MUSGD_OPTIMIZER, LION_OPTIMIZER, MUON_OPTIMIZER]

__all__ = ["get_gradient_clipping", "DeepSpeedConfigError", "ADAGRAD_OPTIMIZER", "ADAMW_OPTIMIZER", "ADAM_OPTIMIZER", "DEEPSPEED_OPTIMIZERS", "DeepSpeedConfig",
           "LAMB_OPTIMIZER", "LION_OPTIMIZER", "MUADAMW_OPTIMIZER", "MUADAM_OPTIMIZER", "MUON_OPTIMIZER",
           "MUSGD_OPTIMIZER"]

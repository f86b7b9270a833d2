"""The top-level ``deepspeed`` names: ``initialize``, ``init_distributed``, ``add_config_arguments``, ``zero``...

Everything here is zerorun's own API under DeepSpeed's name; the names zerorun does not
implement fail on first use with :class:`~zerorun.errors.UnsupportedFeature`.
"""

from __future__ import annotations

import importlib
from typing import Any

from zerorun import zero
from zerorun.compat import DEEPSPEED_VERSION
from zerorun.compat.accelerator import get_accelerator
from zerorun.compat.comm import init_distributed
from zerorun.compat.config import DeepSpeedConfig, DeepSpeedConfigError
from zerorun.engine import api
from zerorun.engine.api import add_config_arguments
from zerorun.engine.engine import Engine as DeepSpeedEngine
from zerorun.errors import unsupported, unsupported_class

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


def initialize(args: Any = None, model: Any = None, optimizer: Any = None, model_parameters: Any = None,
               training_data: Any = None, lr_scheduler: Any = None, distributed_port: int | None = None,
               mpu: Any = None, dist_init_required: bool | None = None, collate_fn: Any = None,
               config: Any = None, mesh_param: Any = None, config_params: Any = None) -> tuple[Any, Any, Any, Any]:
    """DeepSpeed's ``initialize`` with its exact parameter order, onto :func:`zerorun.initialize`.

    Returns ``(engine, optimizer, training_dataloader, lr_scheduler)``; ``config`` (or
    ``config_params``) wins over ``args.deepspeed_config``.
    """
    if mesh_param is not None:
        unsupported("device meshes (initialize(mesh_param=...))")
    return api.initialize(model=model, optimizer=optimizer, model_parameters=model_parameters,
                          config=config if config is not None else config_params, lr_scheduler=lr_scheduler,
                          training_data=training_data, collate_fn=collate_fn,
                          dist_init_required=dist_init_required, args=args, mpu=mpu)


DeepSpeedTransformerLayer = unsupported_class("DeepSpeedTransformerLayer", "fused transformer kernels")
DeepSpeedTransformerConfig = unsupported_class("DeepSpeedTransformerConfig", "fused transformer kernels")
DeepSpeedHybridEngine = unsupported_class("DeepSpeedHybridEngine", "the hybrid (RLHF) engine")
OnDevice = unsupported_class("OnDevice", "deepspeed.OnDevice (meta-device construction; use zero.Init)")


def replace_transformer_layer(*args: Any, **kwargs: Any) -> Any:
    """Not implemented: DeepSpeed's kernel injection (``deepspeed.replace_transformer_layer``)."""
    unsupported("kernel injection (deepspeed.replace_transformer_layer)", "train the model's own layers")


def revert_transformer_layer(*args: Any, **kwargs: Any) -> Any:
    """Not implemented: DeepSpeed's kernel injection (``deepspeed.revert_transformer_layer``)."""
    unsupported("kernel injection (deepspeed.revert_transformer_layer)", "train the model's own layers")

SUBMODULES = ("checkpointing", "pipe", "moe", "inference", "module_inject", "profiling", "compression",
              "sequence", "checkpoint", "monitor", "autotuning", "linear", "io", "model_implementations")
"""``deepspeed.<name>`` modules DeepSpeed's own ``__init__`` has loaded; here they load on first access."""


def missing_attribute(name: str) -> Any:
    """``deepspeed.<name>`` that is not defined: a submodule, imported now (supported or not), else AttributeError."""
    if name in SUBMODULES:
        return importlib.import_module(f"deepspeed.{name}")
    raise AttributeError(f"module 'deepspeed' (zerorun's compatibility package) has no attribute {name!r}")


def tp_model_init(*args: Any, **kwargs: Any) -> Any:
    """Not implemented: DeepSpeed's AutoTP model construction."""
    unsupported("tensor parallelism (deepspeed.tp_model_init)")


def add_tuning_arguments(parser: Any) -> Any:
    """DeepSpeed's autotuning flags: zerorun tunes through ``zerorun autotune`` instead."""
    unsupported("autotuning flags (deepspeed.add_tuning_arguments)", "use `zerorun autotune SCRIPT --config FILE`")


__all__ = ["DeepSpeedConfig", "DeepSpeedConfigError", "DeepSpeedEngine", "DeepSpeedHybridEngine", "DeepSpeedTransformerConfig", "DeepSpeedTransformerLayer",
           "InferenceEngine", "OnDevice", "PipelineEngine", "PipelineModule", "__version__",
           "add_config_arguments", "add_tuning_arguments", "get_accelerator", "init_distributed", "init_inference",
           "initialize", "replace_transformer_layer", "revert_transformer_layer", "tp_model_init", "zero"]

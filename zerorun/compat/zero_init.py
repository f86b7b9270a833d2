"""``deepspeed.zero.Init`` with DeepSpeed's parameters, onto :class:`zerorun.zero.Init`.

Where the parameters rest and their dtype come from the config at ``initialize``
(``offload_param``, ``bf16``/``fp16``), so ``remote_device``, ``pin_memory``, ``dtype`` and
``mem_efficient_linear`` change nothing zerorun computes and are accepted. Anything that
would partition differently (model/sequence parallel groups, a data-parallel group that
is not the whole world, a zero_param_parallel_group other than the config's hpZ group, a custom
swapper) raises. ZeRO++'s ``zero_quantized_weights`` and ``zero_quantized_nontrainable_weights``
apply to the parameters built inside (as the config keys of the same names do to all).

hpZ and MiCS come from the config, as in DeepSpeed (``zero_hpz_partition_size``,
``mics_shard_size``): ``zero_param_parallel_group``, the hpZ group a script made itself, is
accepted when it is the group the config's ``zero_hpz_partition_size`` makes (this rank's
block of that many consecutive ranks); ``MiCS_Init`` is ``Init`` with a config that sets
``mics_shard_size`` (the parameters are sharded inside its groups from the start).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch import nn

from zerorun import zero
from zerorun.compat.linear import zero3_linear_wrap
from zerorun.errors import unsupported


def _whole_world(group: Any) -> bool:
    if group is None or group is dist.group.WORLD:
        return True
    return dist.is_initialized() and dist.get_world_size(group) == dist.get_world_size()


class InsertPostInitMethodToModuleSubClasses:  # noqa: N801  DeepSpeed's name
    """DeepSpeed's base class of ``zero.Init`` (``isinstance`` checks hold).

    DeepSpeed keeps on it the ``torch.nn.functional.linear`` that ``memory_efficient_linear``
    replaced (``linear_bk``); zerorun replaces no torch function, so it never has that
    attribute, and ``F.linear`` stays torch's whatever the key says (``zero3_linear_wrap``,
    :mod:`zerorun.compat.linear`, is there to call directly).
    """


class Init(zero.Init, InsertPostInitMethodToModuleSubClasses):
    """``with deepspeed.zero.Init(config_dict_or_path=cfg, ...): model = Big()``."""

    def __init__(self, module: nn.Module | None = None, data_parallel_group: Any = None,
                 mem_efficient_linear: bool = True, remote_device: str | None = None, pin_memory: bool = False,
                 config_dict_or_path: Any = None, config: Any = None, enabled: bool = True, dtype: Any = None,
                 mpu: Any = None, zero_param_parallel_group: Any = None, zero_quantized_weights: bool = False,
                 zero_quantized_nontrainable_weights: bool = False, sequence_data_parallel_group: Any = None,
                 param_swapper: Any = None) -> None:
        refused = {"mpu (model parallelism)": mpu is not None,
                   "a zero_param_parallel_group that is not the config's hpZ group":
                       zero_param_parallel_group is not None
                       and not _is_hpz_group(zero_param_parallel_group, config_dict_or_path or config),
                   "sequence_data_parallel_group (sequence parallelism)": sequence_data_parallel_group is not None,
                   "param_swapper": param_swapper is not None,
                   "a data_parallel_group other than the whole world": not _whole_world(data_parallel_group)}
        for what, given in refused.items():
            if given:
                unsupported(f"zero.Init({what})")
        super().__init__(module=module, config=config, enabled=enabled, config_dict_or_path=config_dict_or_path,
                         zero_quantized_weights=zero_quantized_weights,
                         zero_quantized_nontrainable_weights=zero_quantized_nontrainable_weights,
                         data_parallel_group=data_parallel_group)


def _is_hpz_group(group: Any, config: Any) -> bool:
    """``group`` holds this rank's block of ``zero_hpz_partition_size`` consecutive ranks (the engine's hpZ group)."""
    if config is None or not dist.is_initialized():
        return False
    from zerorun.config import load_config

    size = load_config(config, world_size=dist.get_world_size()).zero_optimization.zero_hpz_partition_size
    start = dist.get_rank() // max(size, 1) * size
    return size > 1 and list(dist.get_process_group_ranks(group)) == list(range(start, start + size))


class MiCS_Init(Init):  # noqa: N801  DeepSpeed's name
    """``deepspeed.zero.MiCS_Init(config_dict_or_path=cfg)``: ``Init`` under the config's ``mics_shard_size``."""

    def __init__(self, module: nn.Module | None = None, data_parallel_group: Any = None,
                 sequence_data_parallel_group: Any = None, mem_efficient_linear: bool = True,
                 remote_device: str | None = None, pin_memory: bool = False, config_dict_or_path: Any = None,
                 config: Any = None, enabled: bool = True, dtype: Any = None, mpu: Any = None) -> None:
        if config_dict_or_path is None and config is None:
            from zerorun.engine.errors import EngineError

            raise EngineError("MiCS_Init needs the config (its mics_shard_size says how to shard)",
                              "pass config_dict_or_path=your DeepSpeed config, as DeepSpeed requires")
        super().__init__(module=module, data_parallel_group=data_parallel_group,
                         mem_efficient_linear=mem_efficient_linear, remote_device=remote_device,
                         pin_memory=pin_memory, config_dict_or_path=config_dict_or_path, config=config,
                         enabled=enabled, dtype=dtype, mpu=mpu,
                         sequence_data_parallel_group=sequence_data_parallel_group)


def register_external_parameter(module: nn.Module, parameter: nn.Parameter) -> None:
    """Not implemented: zerorun gathers a module's own parameters only."""
    unsupported("deepspeed.zero.register_external_parameter",
                "use the parameter only inside the module that owns it, or run at stage 0-2")


__all__ = ["Init", "InsertPostInitMethodToModuleSubClasses", "MiCS_Init", "register_external_parameter",
           "zero3_linear_wrap"]

"""``deepspeed.comm``: DeepSpeed's torch.distributed-shaped communication module.

Queries (rank, world size, backend) read torch.distributed's state; every collective
goes through :mod:`zerorun.engine.comm.collectives` (the single caller of torch.distributed
collectives in zerorun). ``init_distributed`` is zerorun's bootstrap: it reuses an
existing default group and falls back to a world of one without a launcher.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from zerorun.compat.comm_timing import nbytes, timed
from zerorun.engine.comm import bootstrap
from zerorun.engine.comm import script as coll
from zerorun.engine.comm.comms_logger import LOGGER as comms_logger
from zerorun.engine.errors import DeepSpeedAssertion

ProcessGroup = dist.ProcessGroup
Work = dist.Work


def init_distributed(dist_backend: str | None = None, auto_mpi_discovery: bool = True,
                     distributed_port: int | None = None, verbose: bool = True,
                     timeout: timedelta = timedelta(minutes=30), init_method: str | None = None,
                     dist_init_required: bool | None = None, config: Any = None, rank: int = -1,
                     world_size: int = -1) -> None:
    """Join (or reuse) the default process group from the launcher's environment (also torchrun's).

    ``dist_init_required=False`` with no process group yet is DeepSpeed's assertion (the caller said
    someone else initialises it): an ``AssertionError`` in its words."""
    if dist_init_required is False and not dist.is_initialized():
        raise DeepSpeedAssertion("Distributed backend is not initialized. Please set dist_init_required to True or "
                                 "initialize before calling deepspeed.initialize()",
                                 "drop dist_init_required=False, or call torch.distributed.init_process_group() first")
    if distributed_port is not None and "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(distributed_port)
    bootstrap.init_distributed(dist_backend, timeout=timeout, init_method=init_method, rank=rank,
                               world_size=world_size)


def is_initialized() -> bool:
    return dist.is_initialized()


def is_available() -> bool:
    return dist.is_available()


def get_rank(group: Any = None) -> int:
    return dist.get_rank(group) if dist.is_initialized() else int(os.environ.get("RANK", "0"))


def get_world_size(group: Any = None) -> int:
    return dist.get_world_size(group) if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))


def get_local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def get_global_rank(group: Any = None, group_rank: int = 0) -> int:
    return dist.get_global_rank(group, group_rank) if group is not None else group_rank


def get_world_group() -> Any:
    return dist.group.WORLD


def get_backend(group: Any = None) -> str:
    return dist.get_backend(group)


def new_group(ranks: list[int] | None = None, **kwargs: Any) -> Any:
    return dist.new_group(ranks, **kwargs)


def destroy_process_group(group: Any = None) -> None:
    dist.destroy_process_group(group)


def barrier(group: Any = None, async_op: bool = False, device_ids: Any = None, **log: Any) -> Any:
    return timed("barrier", 0, lambda: coll.script_barrier(group), log)


def all_reduce(tensor: torch.Tensor, op: Any = ReduceOp.SUM, group: Any = None, async_op: bool = False,
               **log: Any) -> Any:
    """``prof=``, ``log_name=`` (and every collective's): the communication logger's (comm_timing)."""
    return timed("all_reduce", nbytes(tensor), lambda: coll.script_all_reduce(tensor, op, group, async_op), log)


def inference_all_reduce(tensor: torch.Tensor, op: Any = ReduceOp.SUM, group: Any = None, **log: Any) -> Any:
    return timed("inference_all_reduce", nbytes(tensor), lambda: coll.script_all_reduce(tensor, op, group, False),
                 log)


def reduce(tensor: torch.Tensor, dst: int, op: Any = ReduceOp.SUM, group: Any = None, async_op: bool = False,
           **log: Any) -> Any:
    return timed("reduce", nbytes(tensor), lambda: coll.script_reduce(tensor, dst, op, group, async_op), log)


def broadcast(tensor: torch.Tensor, src: int, group: Any = None, async_op: bool = False, **log: Any) -> Any:
    return timed("broadcast", nbytes(tensor), lambda: coll.script_broadcast(tensor, src, group, async_op), log)


def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Any = None, async_op: bool = False,
               **log: Any) -> Any:
    return timed("all_gather", nbytes(tensor), lambda: coll.script_all_gather(tensor_list, tensor, group, async_op),
                 log)


def all_gather_into_tensor(output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any = None,
                           async_op: bool = False, **log: Any) -> Any:
    return timed("all_gather_into_tensor", nbytes(input_tensor),
                 lambda: coll.script_all_gather_into_tensor(output_tensor, input_tensor, group, async_op), log)


allgather_fn = all_gather_into_tensor


def reduce_scatter_tensor(output_tensor: torch.Tensor, input_tensor: torch.Tensor, op: Any = ReduceOp.SUM,
                          group: Any = None, async_op: bool = False, **log: Any) -> Any:
    return timed("reduce_scatter_tensor", nbytes(output_tensor),
                 lambda: coll.script_reduce_scatter_tensor(output_tensor, input_tensor, op, group, async_op), log)


def all_to_all_single(output: torch.Tensor, tensor: torch.Tensor, output_split_sizes: Any = None,
                      input_split_sizes: Any = None, group: Any = None, async_op: bool = False, **log: Any) -> Any:
    if output_split_sizes is not None or input_split_sizes is not None:
        from zerorun.errors import unsupported

        unsupported("uneven all_to_all_single splits (deepspeed.comm.all_to_all_single)")
    return timed("all_to_all_single", nbytes(tensor), lambda: coll.script_all_to_all_single(output, tensor, group,
                                                                                          async_op), log)


def gather(tensor: torch.Tensor, gather_list: list[torch.Tensor] | None = None, dst: int = 0, group: Any = None,
           async_op: bool = False, **log: Any) -> Any:
    return timed("gather", nbytes(tensor), lambda: coll.script_gather(tensor, gather_list, dst, group, async_op), log)


def scatter(tensor: torch.Tensor, scatter_list: list[torch.Tensor] | None = None, src: int = 0, group: Any = None,
            async_op: bool = False, **log: Any) -> Any:
    return timed("scatter", nbytes(tensor), lambda: coll.script_scatter(tensor, scatter_list, src, group, async_op),
                 log)


def all_gather_object(object_list: list[Any], obj: Any, group: Any = None) -> None:
    coll.script_all_gather_object(object_list, obj, group)


def broadcast_object_list(object_list: list[Any], src: int, group: Any = None, device: Any = None) -> None:
    coll.script_broadcast_object_list(object_list, src, group)


def configure(deepspeed_config: Any = None, enabled: bool | None = None, prof_all: bool | None = None,
              prof_ops: list[str] | None = None, verbose: bool | None = None, debug: bool | None = None) -> None:
    """Set the communication logger: from a config's ``comms_config`` (``DeepSpeedConfig``) or
    ``comms_logger`` block, then each flag given."""
    if deepspeed_config is not None:
        block = getattr(deepspeed_config, "comms_config", None) or getattr(deepspeed_config, "comms_logger",
                                                                           deepspeed_config)
        comms_logger.configure(block)
    for name, value in (("enabled", enabled), ("prof_all", prof_all), ("prof_ops", prof_ops), ("verbose", verbose),
                        ("debug", debug)):
        if value is not None:
            setattr(comms_logger, name, value)


def log_summary(show_straggler: bool = False, return_dict: bool = False) -> dict[str, Any] | None:
    """Print (rank 0) the communication logger's table of the engine's collectives; every rank calls it."""
    if dist.is_initialized():  # DeepSpeed's barriers around it (it needs a group; a world of one here does not)
        barrier(log_name="log_summary_barrier")
    result = comms_logger.log_all(print_log=get_rank() == 0, show_straggler=show_straggler, return_dict=return_dict,
                                  reduce_min=_min_across_ranks)
    if dist.is_initialized():
        barrier(log_name="log_summary_barrier")
    return result


def _min_across_ranks(values: list[float]) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    if dist.is_initialized():
        coll.script_all_reduce(t, ReduceOp.MIN, None, False)
    return t.tolist()


def reset_log() -> None:
    comms_logger.reset_data()


def has_comm_data() -> bool:
    return comms_logger.has_data()


def get_comm_operation_count() -> int:
    return comms_logger.get_total_operations()


def get_logged_comm_ops() -> list[str]:
    return comms_logger.get_operation_names()


__all__ = ["ProcessGroup", "ReduceOp", "Work", "all_gather", "all_gather_into_tensor", "all_gather_object",
           "all_reduce", "all_to_all_single", "allgather_fn", "barrier", "broadcast", "broadcast_object_list",
           "comms_logger", "configure", "destroy_process_group", "gather", "get_backend", "get_comm_operation_count",
           "get_global_rank", "get_local_rank", "get_logged_comm_ops", "get_rank", "get_world_group",
           "get_world_size", "has_comm_data", "inference_all_reduce", "init_distributed", "is_available",
           "is_initialized", "log_summary", "new_group", "reduce", "reduce_scatter_tensor", "reset_log", "scatter"]

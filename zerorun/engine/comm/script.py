"""The training script's own collectives, on the script's group.

``deepspeed.comm`` under ``--as_deepspeed`` (:mod:`zerorun.compat.comm`) forwards them here,
so ``engine/comm/`` stays the only caller of torch.distributed collectives. They are the
script's traffic, so the engine's counter does not count them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from zerorun.engine.comm.bootstrap import destroy_group

ScriptWork = dist.Work | None
ScriptGroup = dist.ProcessGroup | None  # None: the default group
ReduceOpLike = dist.ReduceOp | dist.ReduceOp.RedOpType  # ReduceOp.SUM and its peers are RedOpType values


def script_all_reduce(tensor: torch.Tensor, op: ReduceOpLike, group: ScriptGroup,
                      async_op: bool) -> ScriptWork:
    return dist.all_reduce(tensor, op=op, group=group, async_op=async_op)


def script_reduce(tensor: torch.Tensor, dst: int, op: ReduceOpLike, group: ScriptGroup,
                  async_op: bool) -> ScriptWork:
    return dist.reduce(tensor, dst, op=op, group=group, async_op=async_op)


def script_broadcast(tensor: torch.Tensor, src: int, group: ScriptGroup, async_op: bool) -> ScriptWork:
    return dist.broadcast(tensor, src, group=group, async_op=async_op)


def script_all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: ScriptGroup,
                      async_op: bool) -> ScriptWork:
    return dist.all_gather(tensor_list, tensor, group=group, async_op=async_op)


def script_all_gather_into_tensor(output: torch.Tensor, tensor: torch.Tensor, group: ScriptGroup,
                                  async_op: bool) -> ScriptWork:
    return dist.all_gather_into_tensor(output, tensor, group=group, async_op=async_op)


def script_reduce_scatter_tensor(output: torch.Tensor, tensor: torch.Tensor, op: ReduceOpLike,
                                 group: ScriptGroup, async_op: bool) -> ScriptWork:
    return dist.reduce_scatter_tensor(output, tensor, op=op, group=group, async_op=async_op)


def script_all_to_all_single(output: torch.Tensor, tensor: torch.Tensor, group: ScriptGroup,
                             async_op: bool) -> ScriptWork:
    return dist.all_to_all_single(output, tensor, group=group, async_op=async_op)


def script_gather(tensor: torch.Tensor, gather_list: list[torch.Tensor] | None, dst: int, group: ScriptGroup,
                  async_op: bool) -> ScriptWork:
    return dist.gather(tensor, gather_list, dst=dst, group=group, async_op=async_op)


def script_scatter(tensor: torch.Tensor, scatter_list: list[torch.Tensor] | None, src: int,
                   group: ScriptGroup, async_op: bool) -> ScriptWork:
    return dist.scatter(tensor, scatter_list, src=src, group=group, async_op=async_op)


def script_all_gather_object(object_list: list[object], obj: object, group: ScriptGroup) -> None:
    dist.all_gather_object(object_list, obj, group=group)


def script_broadcast_object_list(object_list: list[object], src: int, group: ScriptGroup) -> None:
    dist.broadcast_object_list(object_list, src=src, group=group)


def script_barrier(group: ScriptGroup) -> ScriptWork:
    return dist.barrier(group=group)


def leave_group() -> None:
    """Every rank at a barrier, then the default group torn down (a clean end of a process)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        destroy_group()

"""The launcher's world against the process group ``zero.Init`` shards over.

A multi-process launcher (zerorun's, ``deepspeed``, ``torchrun``, accelerate) sets ``WORLD_SIZE``;
when a library initialised a process group of one rank before ``zero.Init`` ran (a
``from_pretrained`` before ``init_distributed()``), sharding over that group keeps every
parameter whole on every rank, and each rank runs out of memory as if the model were too big.
``zero.Init`` refuses that case, as DeepSpeed 0.19.8's does; a group the caller passed
explicitly is taken as intended.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from zerorun.errors import ZerorunError


class ContradictingWorld(ZerorunError, RuntimeError):
    """``zero.Init`` would shard over one rank while the launcher started several (a ``RuntimeError``, as DeepSpeed)."""


def contradicting_single_rank_group(dp_world_size: int, explicit_process_group: object = None,
                                    env: Mapping[str, str | None] | None = None) -> str | None:
    """Why a group of ``dp_world_size`` ranks contradicts the launcher's ``WORLD_SIZE`` (``None`` when it does not).

    Only a group of one rank that the caller did not pass (``explicit_process_group`` is ``None``) under a
    ``WORLD_SIZE`` above one contradicts; a missing or malformed ``WORLD_SIZE`` says nothing. (DeepSpeed's
    keyword names: its ``_contradicting_single_rank_pg_error`` is this function.)"""
    if dp_world_size != 1 or explicit_process_group is not None:
        return None
    env = os.environ if env is None else env
    try:
        launched = int(env.get("WORLD_SIZE") or 0)
    except ValueError:
        return None
    if launched <= 1:
        return None
    return (f"zero.Init resolved a process group of world_size=1, but the launcher environment reports "
            f"WORLD_SIZE={launched}: a group of one rank was initialised before zero.Init ran, so no parameter "
            "would be partitioned and every rank would hold the whole model. Call init_distributed() "
            "(deepspeed.init_distributed()) before building the model, or pass an explicit data_parallel_group "
            "when a group of one rank is intended.")


def check_launcher_world(group_size: int, explicit_group: object = None) -> None:
    """Raise :class:`ContradictingWorld` when :func:`contradicting_single_rank_group` finds a contradiction."""
    why = contradicting_single_rank_group(group_size, explicit_group)
    if why is not None:
        raise ContradictingWorld(why, "initialise the process group of every rank before zero.Init "
                                      "(deepspeed.init_distributed() or torch.distributed.init_process_group())")

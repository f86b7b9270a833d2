"""Optimizer offload: master shards and optimizer state in host memory or swap files.

``wrap_masters(masters, policy, optimizer)`` is the one entry point the engine's build
uses: it returns the masters unchanged without offload, else a wrapper (``host`` or
``nvme``) that keeps the same interface.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

import torch

from zerorun.engine.offload.policy import OffloadError, OffloadPolicy, from_config

if TYPE_CHECKING:
    from zerorun.engine.mechanism.masters import MasterShards
    from zerorun.engine.offload.host import HostMasters

    # what the engine steps: the stage's masters, or an offload wrapper (NvmeMasters is a HostMasters)
    # that delegates the rest of MasterShards' interface
    Masters: TypeAlias = MasterShards | HostMasters


def wrap_masters(masters: MasterShards, policy: OffloadPolicy | None,
                 optimizer: torch.optim.Optimizer) -> Masters:
    if policy is None or not policy.enabled:
        return masters
    if policy.device == "nvme":
        from zerorun.engine.offload.nvme import NvmeMasters

        return NvmeMasters(masters, policy, optimizer)
    from zerorun.engine.offload.host import HostMasters

    return HostMasters(masters, policy)


__all__ = ["OffloadError", "OffloadPolicy", "from_config", "wrap_masters"]

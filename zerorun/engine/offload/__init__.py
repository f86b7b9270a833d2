"""Optimizer offload: master shards and optimizer state in host memory or swap files.

``wrap_masters(masters, policy, optimizer)`` is the one entry point the engine's build
uses: it returns the masters unchanged without offload, else a wrapper (``host`` or
``nvme``) that keeps the same interface.
"""

from __future__ import annotations

from typing import Any

import torch

from zerorun.engine.offload.policy import OffloadError, OffloadPolicy, from_config


def wrap_masters(masters: Any, policy: OffloadPolicy | None, optimizer: torch.optim.Optimizer) -> Any:
    if policy is None or not policy.enabled:
        return masters
    if policy.device == "nvme":
        from zerorun.engine.offload.nvme import NvmeMasters

        return NvmeMasters(masters, policy, optimizer)
    from zerorun.engine.offload.host import HostMasters

    return HostMasters(masters, policy)


__all__ = ["OffloadError", "OffloadPolicy", "from_config", "wrap_masters"]

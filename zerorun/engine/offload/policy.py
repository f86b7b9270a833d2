"""Where the fp32 master shard and the optimizer state live: a frozen placement policy.

``none``: on the compute device (the engine's default). ``cpu``: in host memory (pinned
when ``pin_memory`` and CUDA is present - pinning only speeds up copies to a GPU), the
optimizer steps there, gradients are copied down and updated parameters copied up.
``nvme``: like ``cpu`` between copies, but between steps the masters and optimizer state
are kept in swap files under ``nvme_path`` and read back for the step.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from zerorun.engine.errors import EngineError

Device = Literal["none", "cpu", "nvme"]


class OffloadError(EngineError):
    """Offload cannot work as configured (no nvme_path, unwritable or full disk)."""


@dataclass(frozen=True)
class OffloadPolicy:
    device: Device
    pin_memory: bool = False
    nvme_path: Path | None = None
    buffer_count: int = 4

    @property
    def enabled(self) -> bool:
        return self.device != "none"

    @property
    def pins(self) -> bool:
        """Pin host tensors: only useful (and only possible) with a CUDA device to copy to."""
        return self.pin_memory and torch.cuda.is_available()

    def host_copy(self, t: torch.Tensor) -> torch.Tensor:
        """A host (CPU) fp32 copy of ``t``, pinned when the policy pins."""
        out = t.detach().to("cpu", torch.float32, copy=True)
        return out.pin_memory() if self.pins else out


def from_config(zero: Any) -> OffloadPolicy:
    """The optimizer-offload policy of a ``zero_optimization`` config block."""
    block = getattr(zero, "offload_optimizer", None)
    device = getattr(block, "device", "none") or "none"
    if device == "none":
        return OffloadPolicy("none")
    if device not in ("cpu", "nvme"):
        raise OffloadError(f"zero_optimization.offload_optimizer.device={device!r} is not one of none, cpu, nvme",
                           "set offload_optimizer.device to cpu or nvme")
    if int(getattr(zero, "stage", 0)) == 0:
        raise OffloadError("zero_optimization.offload_optimizer needs stage 1, 2 or 3, but stage is 0",
                           "set zero_optimization.stage to 1 or higher, or offload_optimizer.device: none")
    nvme_path = getattr(block, "nvme_path", None)
    if device == "nvme" and not nvme_path:
        raise OffloadError("zero_optimization.offload_optimizer.device is nvme but nvme_path is not set",
                           "set offload_optimizer.nvme_path to a directory on a fast local disk")
    return OffloadPolicy(device, bool(getattr(block, "pin_memory", False)),
                         Path(nvme_path) if nvme_path else None, max(1, int(getattr(block, "buffer_count", 4))))

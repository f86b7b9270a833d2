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
from typing import TYPE_CHECKING, Literal

import torch

from zerorun.engine.errors import EngineError
from zerorun.engine.offload import copy_checks
from zerorun.engine.offload.copies import Transfers

if TYPE_CHECKING:
    from zerorun.config.schema_zero import ZeroConfig

Device = Literal["none", "cpu", "nvme"]


class OffloadError(EngineError):
    """Offload cannot work as configured (no nvme_path, unwritable or full disk)."""


@dataclass(frozen=True)
class OffloadPolicy:
    device: Device
    pin_memory: bool = False
    nvme_path: Path | None = None
    buffer_count: int = 4
    ratio: float = 1.0  # the fraction of the buckets' optimizer state offloaded (Twin-Flow, stage 3: host.py)

    @property
    def enabled(self) -> bool:
        return self.device != "none"

    @property
    def pins(self) -> bool:
        """Pin host tensors: only useful (and only possible) with a CUDA device to copy to."""
        return self.pin_memory and torch.cuda.is_available()

    def transfers(self) -> Transfers:
        """The host<->device copier of this placement (pinned when the policy pins; the CPU stand-in
        under ``ZERORUN_CHECK_COPIES=deferred``, :mod:`zerorun.engine.offload.copy_checks`)."""
        return copy_checks.transfers(self.pin_memory)

    def host_copy(self, t: torch.Tensor) -> torch.Tensor:
        """A host (CPU) fp32 copy of ``t``, pinned when the policy pins."""
        return self.transfers().host_copy(t, torch.float32)


def policy_for(zero: ZeroConfig, name: str, stages: tuple[int, ...]) -> OffloadPolicy:
    """The policy of the ``zero_optimization.<name>`` offload block, allowed at ``stages``.

    The config's own rules reject these cases first; the checks here keep the engine
    safe for a config object built without them.
    """
    key = f"zero_optimization.{name}"
    block = getattr(zero, name, None)
    device = getattr(block, "device", "none") or "none"
    if device == "none":
        return OffloadPolicy("none")
    if device not in ("cpu", "nvme"):
        raise OffloadError(f"{key}.device={device!r} is not one of none, cpu, nvme",
                           f"set {name}.device to cpu or nvme")
    stage = int(getattr(zero, "stage", 0))
    if stage not in stages:
        allowed = ", ".join(map(str, stages))
        raise OffloadError(f"{key} needs zero_optimization.stage {allowed}, but stage is {stage}",
                           f"set zero_optimization.stage to {stages[0]}, or {name}.device: none")
    nvme_path = getattr(block, "nvme_path", None)
    if device == "nvme" and not nvme_path:
        raise OffloadError(f"{key}.device is nvme but nvme_path is not set",
                           f"set {name}.nvme_path to a directory on a fast local disk")
    return OffloadPolicy(device, bool(getattr(block, "pin_memory", False)),
                         Path(nvme_path) if nvme_path else None, max(1, int(getattr(block, "buffer_count", 4))),
                         float(getattr(block, "ratio", 1.0)))


def from_config(zero: ZeroConfig) -> OffloadPolicy:
    """The optimizer-offload policy of a ``zero_optimization`` config block (stages 1-3)."""
    return policy_for(zero, "offload_optimizer", (1, 2, 3))

"""The CPU accelerator: ranks on gloo, memory figures from psutil (as DeepSpeed's CPU accelerator reports them)."""

from __future__ import annotations

import os
import resource
from typing import Any

import psutil
import torch

from zerorun.compat.accelerator_base import Accelerator


class _NoStream:
    """CPU work is synchronous: a stream that is a no-op context, as DeepSpeed's CPU accelerator."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> _NoStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True


class CpuAccelerator(Accelerator):
    """Ranks on CPU (gloo). Memory is the process's, from psutil."""

    _name = "cpu"
    _communication_backend_name = "gloo"

    def is_synchronized_device(self) -> bool:
        return True

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        # DeepSpeed counts CPU "devices" per node from the launcher's environment
        return int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("LOCAL_SIZE", "1")))

    def current_device(self) -> int:
        return int(os.environ.get("LOCAL_RANK", "0"))

    def device_name(self, device_index: int | None = None) -> str:
        return "cpu"  # torch has one CPU device; DeepSpeed names it "cpu" whatever the index

    def current_device_name(self) -> str:
        return "cpu"

    def set_device(self, device_index: int | str | torch.device) -> None:
        """One CPU device: nothing to select."""

    def synchronize(self, device_index: int | None = None) -> None:
        """CPU kernels are synchronous."""

    def is_bf16_supported(self) -> bool:
        return True

    def is_fp16_supported(self) -> bool:
        return True

    Stream = _NoStream
    Event = _NoStream

    def stream(self, stream: Any) -> _NoStream:
        return _NoStream()

    def current_stream(self, device_index: int | None = None) -> _NoStream:
        return _NoStream()

    def default_stream(self, device_index: int | None = None) -> _NoStream:
        return _NoStream()

    def empty_cache(self) -> None:
        """No caching allocator on CPU."""

    def memory_allocated(self, device_index: int | None = None) -> int:
        return psutil.Process().memory_info().rss

    def max_memory_allocated(self, device_index: int | None = None) -> int:
        # the process's peak resident set (Linux reports KiB); never below the current one
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return max(peak, self.memory_allocated())

    def reset_max_memory_allocated(self, device_index: int | None = None) -> None:
        """The kernel's peak resident set cannot be reset."""

    memory_reserved = memory_allocated
    max_memory_reserved = max_memory_allocated
    memory_cached = memory_allocated
    max_memory_cached = max_memory_allocated
    reset_max_memory_cached = reset_max_memory_allocated
    reset_peak_memory_stats = reset_max_memory_allocated

    def memory_stats(self, device_index: int | None = None) -> dict[str, Any]:
        return {"allocated_bytes.all.current": self.memory_allocated(),
                "allocated_bytes.all.peak": self.max_memory_allocated()}

    def total_memory(self, device_index: int | None = None) -> int:
        return psutil.virtual_memory().total

    def available_memory(self, device_index: int | None = None) -> int:
        return psutil.virtual_memory().available

    def amp(self) -> Any:
        return torch.cpu.amp

    def pin_memory(self, tensor: torch.Tensor, align_bytes: int = 1) -> torch.Tensor:
        return tensor  # nothing to pin for a CPU device

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        return tensor.is_pinned() if torch.cuda.is_available() else False

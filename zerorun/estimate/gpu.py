"""The local GPUs' memory through NVML, when there are any."""

from __future__ import annotations

import contextlib


def local_gpus() -> tuple[int, int | None]:
    """(number of local GPUs, the smallest one's memory in bytes); (0, None) without NVML or GPUs."""
    try:
        import pynvml
    except ImportError:
        return 0, None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver: NVML raises its own error classes
        return 0, None
    try:
        count = pynvml.nvmlDeviceGetCount()
        sizes = [int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total) for i in range(count)]
        return count, (min(sizes) if sizes else None)
    except Exception:
        return 0, None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()

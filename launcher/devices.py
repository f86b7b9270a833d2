"""How many NVIDIA GPUs this machine has, without importing torch (fast, no CUDA init)."""

from __future__ import annotations


def gpu_count() -> int:
    """The number of GPUs NVML sees; 0 without a driver or without GPUs."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0

"""The NVIDIA GPUs this machine has and the ones this job may use, without importing torch."""

from __future__ import annotations

from collections.abc import Mapping


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


def visible_devices(env: Mapping[str, str]) -> tuple[str, ...] | None:
    """The ids an inherited ``CUDA_VISIBLE_DEVICES`` lists (None: not set, all GPUs visible).

    A scheduler (Slurm's gres, a container runtime, a shared box's convention) hands a job
    its GPUs this way; NVML ignores it and counts every GPU. CUDA reads the list up to
    its first invalid entry, so ``"0,-1,2"`` is ``("0",)`` and ``""`` or ``"-1"`` is none.
    Ids stay strings: UUIDs (``GPU-...``) and MIG ids are valid entries.
    """
    text = env.get("CUDA_VISIBLE_DEVICES")
    if text is None:
        return None
    ids: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        if not item or item.startswith("-"):
            break
        ids.append(item)
    return tuple(ids)


def local_gpus(env: Mapping[str, str], physical: int) -> tuple[str, ...]:
    """The GPU ids local ranks may use: the inherited visible list, else all ``physical`` GPUs."""
    if physical == 0:
        return ()
    visible = visible_devices(env)
    return tuple(str(i) for i in range(physical)) if visible is None else visible
